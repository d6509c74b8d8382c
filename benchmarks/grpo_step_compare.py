"""One GRPO step of the demo, side by side across checkouts: rollout s, update s, peak RSS.

    .venv/bin/python benchmarks/grpo_step_compare.py [--checkout LABEL=PATH ...] [--steps 3] [--rounds 1]
    .venv/bin/python benchmarks/grpo_step_compare.py --parts [--prompts 8] [--tokens 48] [--checkout ...]

Each checkout (default: this one) runs in its own process, one after the other (one model in
memory at a time), with `PYTHONPATH` set to it: the demo's configuration (8 prompts × 8
rollouts, 4 runner threads × 16, the calculator agent through gateway and engine, SmolLM2 on
the CPU), every group kept so each update trains all 64 trajectories. Step 1 is a warm-up and
is left out of the means. `--rounds 2` runs the checkouts twice, interleaved, so a busy
machine slows each alike. Only APIs that predate the engine/vLLM/FSDP merges are used, so an
older commit in a `git worktree` runs the same code. Load average is printed with each row.

Whole steps vary with what the model happens to write (how many groups, how long the replies)
and with the machine's load. `--parts` times the two phases apart on fixed, seeded inputs
(decode in the engine; `grpo_update` + `publish` on the trajectories decoded), in wall and CPU
seconds, so two checkouts do exactly the same work and CPU time shows a code regression even
on a machine shared with other jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def child(steps: int) -> None:
    """Run in a checkout: the demo's GRPO for `steps` steps; print one JSON line of figures."""
    import resource
    import tempfile

    import agentgrad as ag
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.cli.demo import load_calc_example
    from agentgrad.engine import Engine

    calc = load_calc_example()
    train, _ = calc.make_splits(n_train=400, n_val=1, seed=0)
    engine = Engine()
    after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    config = GRPOConfig(steps=steps, prompts_per_step=8, group_size=8, val_every=0, skip_uniform_groups=False, seed=0)
    import inspect

    # the loaded Engine's argument was `engine=` before it became `local_engine=`: older checkouts run this too
    engine_argument = "local_engine" if "local_engine" in inspect.signature(GRPO.__init__).parameters else "engine"
    with tempfile.TemporaryDirectory() as store_dir:
        result = ag.Trainer(GRPO(config, **{engine_argument: engine}), n_runners=4, runner_concurrency=16,
                            store=f"{store_dir}/store.db").fit(calc.calc_agent, train)
    timed = result.history[1:] or result.history

    def mean(name: str) -> float:
        return statistics.fmean(h[name] for h in timed)

    print(json.dumps({
        "rollout_s": mean("perf/rollout_seconds"), "update_s": mean("perf/update_seconds"),
        "tokens_per_s": mean("perf/tokens_per_s"), "response_length": mean("train/response_length"),
        "rss_after_load_gb": after_load, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "per_step": [[round(h["perf/rollout_seconds"], 2), round(h["perf/update_seconds"], 2)] for h in result.history],
    }), flush=True)
    engine.close()


def parts(repeats: int, prompts_n: int, tokens_n: int, micro_batch_size: int) -> None:
    """Run in a checkout: the step's two phases apart, on fixed inputs, so old and new do the same work.

    Decode: `prompts_n` calc prompts × n=8 rows (seeded, temperature 1) of `tokens_n` tokens each, in
    the engine. Update: `grpo_update` + `publish` on those trajectories (random advantages, seeded).
    Wall and CPU seconds (all threads) of each, and the peak RSS after each phase.
    """
    import random
    import resource
    import time

    import torch

    from agentgrad.adapters import Trajectory
    from agentgrad.algorithms.grpo import GRPOConfig

    try:
        from agentgrad.algorithms.grpo_update import grpo_update
    except ImportError:  # a checkout from before grpo.py was split
        from agentgrad.algorithms.grpo import grpo_update  # type: ignore[attr-defined,no-redef]
    from agentgrad.cli.demo import load_calc_example
    from agentgrad.engine import Engine, SamplingParams

    def peak() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    calc = load_calc_example()
    train, _ = calc.make_splits(n_train=prompts_n, n_val=1, seed=0)
    engine = Engine()
    figures: dict[str, float] = {"rss_after_load_gb": peak()}
    prompts = [engine.chat_prompt_ids(calc.build_messages(task["question"])) for task in train]
    params = SamplingParams(max_tokens=tokens_n, temperature=1.0, n=8, seed=1, ignore_eos=True)
    engine.generate(prompts[:1], SamplingParams(max_tokens=4))  # warm-up
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        generations = engine.generate(prompts, params)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    tokens = sum(len(c.token_ids) for g in generations for c in g.completions)
    figures.update(decode_wall_s=min(walls), decode_cpu_s=min(cpus), decode_tokens=tokens, rss_after_decode_gb=peak())
    rng = random.Random(0)
    batch = [(Trajectory(token_ids=g.prompt_token_ids + c.token_ids, loss_mask=[0] * len(g.prompt_token_ids) + [1] * len(c.token_ids),
                         logprobs=[0.0] * len(g.prompt_token_ids) + c.logprobs, prompt_length=len(g.prompt_token_ids)), rng.gauss(0, 1))
             for g in generations for c in g.completions]
    config = GRPOConfig(learning_rate=1e-6, micro_batch_size=micro_batch_size)
    optimizer = torch.optim.AdamW([p for p in engine.model.parameters() if p.requires_grad], lr=config.learning_rate)
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        with engine.training() as model:
            grpo_update(model, optimizer, batch, config, engine.tokenizer.pad_token_id)
        engine.publish()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    figures.update(update_wall_s=min(walls), update_cpu_s=min(cpus), peak_rss_gb=peak())
    print(json.dumps(figures), flush=True)
    engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", action="append", default=[], help="LABEL=PATH of a source checkout (repeatable)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="run every checkout this many times, interleaved")
    parser.add_argument("--parts", action="store_true",
                        help="time decode and update apart on fixed inputs (wall and CPU s), not whole GRPO steps")
    parser.add_argument("--repeats", type=int, default=2, help="--parts: best of this many runs of each phase")
    parser.add_argument("--prompts", type=int, default=8, help="--parts: calc prompts, 8 rows each")
    parser.add_argument("--tokens", type=int, default=48, help="--parts: tokens per row")
    parser.add_argument("--micro-batch-size", type=int, default=32, help="--parts: GRPOConfig.micro_batch_size")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        parts(args.repeats, args.prompts, args.tokens, args.micro_batch_size) if args.parts else child(args.steps)
        return
    checkouts = [c.split("=", 1) for c in args.checkout] or [["this", str(HERE)]]
    from rich.console import Console
    from rich.table import Table

    if args.parts:
        title = (f"GRPO step phases on fixed inputs ({8 * args.prompts} rows × {args.tokens} tokens), "
                 f"best of {args.repeats}")
        columns = {"decode wall s": "decode_wall_s", "decode CPU s": "decode_cpu_s", "update wall s": "update_wall_s",
                   "update CPU s": "update_cpu_s", "RSS load GB": "rss_after_load_gb",
                   "RSS decode GB": "rss_after_decode_gb", "peak RSS GB": "peak_rss_gb"}
    else:
        title = f"GRPO steps of the demo (8×8 rollouts, all groups trained), mean of steps 2..{args.steps}"
        columns = {"rollout s": "rollout_s", "update s": "update_s", "tokens/s": "tokens_per_s",
                   "resp. tokens": "response_length", "RSS load GB": "rss_after_load_gb", "peak RSS GB": "peak_rss_gb"}
    table = Table(title=title)
    for column in ("checkout", *columns, "load 1m"):
        table.add_column(column, justify="right")
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--steps", str(args.steps), "--repeats", str(args.repeats),
               "--prompts", str(args.prompts), "--tokens", str(args.tokens),
               "--micro-batch-size", str(args.micro_batch_size)]
    for _ in range(args.rounds):
        for label, path in checkouts:
            env = {**os.environ, "PYTHONPATH": str(Path(path).resolve())}
            out = subprocess.run(command + (["--parts"] if args.parts else []), cwd=path, env=env, capture_output=True, text=True)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            if out.returncode != 0 or not lines:
                raise SystemExit(f"{label} ({path}) failed:\n{out.stderr[-3000:]}")
            figures = json.loads(lines[-1])
            table.add_row(label, *(f"{figures[key]:.2f}" for key in columns.values()), f"{os.getloadavg()[0]:.1f}")
            print(label, json.dumps(figures), flush=True)
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
