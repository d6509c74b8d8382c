"""Where one GRPO step's time goes (rollouts, update, weight sync) at 1 and 2 training processes.

    .venv/bin/python benchmarks/grpo_step_split.py [--processes 1 2] [--steps 3] [--prompts 4] [--group 4]

The calculator agent of the demo on SmolLM2-135M, threads strategy (the engine serves the
rollouts in this process); `train_processes=2` shards the update with FSDP2 over two local
processes (gloo). Step 1 is a warm-up and is left out of the means.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from rich.console import Console
from rich.table import Table

import agentgrad as ag
from agentgrad.algorithms.grpo import GRPO, GRPOConfig
from agentgrad.cli.demo import load_calc_example
from agentgrad.engine import Engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    args = parser.parse_args()
    console = Console()
    calc = load_calc_example()
    train, _ = calc.make_splits(n_train=200, n_val=1, seed=0)
    engine = Engine()
    table = Table(title=f"GRPO step on {engine.name} ({engine.device}), {args.prompts}×{args.group} rollouts, "
                        f"mean of steps 2..{args.steps}")
    for column in ("train processes", "rollouts s", "update s", "of which sync s", "step s", "tokens/s"):
        table.add_column(column, justify="right")
    start = {k: v.clone() for k, v in engine.model.state_dict().items()}
    for processes in args.processes:
        with engine.training() as model:  # every configuration starts from the same weights
            model.load_state_dict(start)
        engine.publish()
        config = GRPOConfig(steps=args.steps, prompts_per_step=args.prompts, group_size=args.group, val_every=0,
                            skip_uniform_groups=False, train_processes=processes, seed=0)
        with tempfile.TemporaryDirectory() as store_dir:
            result = ag.Trainer(GRPO(config, local_engine=engine), n_runners=2, runner_concurrency=16,
                                store=f"{store_dir}/store.db").fit(calc.calc_agent, train)
        timed = result.history[1:] or result.history

        def mean(name: str) -> float:
            return statistics.fmean(h[name] for h in timed)

        table.add_row(str(processes), f"{mean('perf/rollout_seconds'):.2f}", f"{mean('perf/update_seconds'):.2f}",
                      f"{mean('perf/sync_seconds'):.2f}", f"{mean('perf/step_seconds'):.2f}",
                      f"{mean('perf/tokens_per_s'):.0f}")
    console.print(table)
    engine.close()


if __name__ == "__main__":
    main()
