"""Train the planner, the executor and the verifier of `agents.py` together, one LoRA adapter per role.

    python -m examples.pev.train                   # one seed; --seeds 0 1 for the seed-to-seed spread

Per seed: load SmolLM2-135M, validate greedily on held-out problems, run `--steps` GRPO steps with
`roles=ROLES` (each role on its own calls and its own reward dimension), validate. The table prints, per
role, the held-out reward before and after (the planner: plans whose value is the answer; the executor:
answers equal to its plan's value; the verifier: right verdicts on the first plan; `answer`: the system's
accuracy), then each seed's wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import agentgrad as ag
from examples.pev.agents import ROLES, make_splits, plan_execute_verify

console = Console()
FIGURES = ("answer", *ROLES)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps (6)")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="problems per step (8)")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per problem (4)")
    parser.add_argument("--val-size", type=int, default=60, help="held-out problems (60)")
    parser.add_argument("--learning-rate", type=float, default=5e-4, help="AdamW, for each adapter (5e-4)")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24, help="per model call (24)")
    parser.add_argument("--concurrency", type=int, default=24, help="episodes at once (24)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run per seed (0)")
    parser.add_argument("--run-dir", default=".agentgrad/pev", help="a store per seed goes here")


async def held_out(store: Any) -> dict[int, dict[str, float]]:
    """Per validation step, the mean of each figure over the held-out rollouts (each role's own dimension)."""
    from agentgrad.algorithms.roles import role_reward

    scores: dict[int, dict[str, list[float]]] = {}
    for rollout in await store.query_rollouts(mode="val"):
        spans = await store.query_spans(rollout.rollout_id)
        step = scores.setdefault(int(rollout.metadata.get("step", 0)), {figure: [] for figure in FIGURES})
        step["answer"].append(rollout.reward or 0.0)
        for role, pattern in ROLES.items():
            step[role].append(role_reward(spans, role, pattern, 0.0))
    return {step: {k: statistics.fmean(v) for k, v in by.items() if v} for step, by in scores.items()}


def train_one(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One seed: validate, train every role, validate."""
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.engine import Engine
    from agentgrad.policy.config import PolicyConfig

    train, val = make_splits(n_val=args.val_size)  # fixed problems; the seed moves sampling and task order
    store = Path(args.run_dir) / f"seed-{seed}.db"
    store.parent.mkdir(parents=True, exist_ok=True)
    store.unlink(missing_ok=True)
    began = time.perf_counter()
    engine = Engine()
    config = GRPOConfig(steps=args.steps, prompts_per_step=args.prompts_per_step, group_size=args.group_size,
                        max_tokens=args.max_tokens, learning_rate=args.learning_rate, micro_batch_size=8,
                        val_every=args.steps, seed=seed, roles=ROLES, policy=PolicyConfig(lora_rank=args.lora_rank),
                        rollout_timeout=1800.0)  # a shared, loaded machine: an episode may wait long for its turns
    trainer: ag.Trainer[Any] = ag.Trainer(GRPO(config, local_engine=engine), n_runners=1,
                                          runner_concurrency=args.concurrency, store=str(store))
    trainer.fit(plan_execute_verify, train, val)
    figures = asyncio.run(held_out(trainer.store))
    engine.close()
    return {"seed": seed, "before": figures[min(figures)], "after": figures[max(figures)],
            "wall_s": time.perf_counter() - began, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    runs = [train_one(args, seed) for seed in args.seeds]
    table = Table(title=f"planner -> executor -> verifier, held-out ({args.val_size} problems, greedy)")
    table.add_column("figure")
    for run in runs:
        table.add_column(f"seed {run['seed']}: before -> after", justify="right")
    for figure in FIGURES:
        table.add_row(figure, *(f"{r['before'][figure]:.3f} -> {r['after'][figure]:.3f}" for r in runs))
    table.add_row("wall time", *(f"{r['wall_s'] / 60:.1f} min (load {r['load']:.1f})" for r in runs))
    console.print(table)


if __name__ == "__main__":
    main()
