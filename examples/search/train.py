"""Train the search agent (`agent.py`) with GRPO and compare held-out accuracy before and after.

    python -m examples.search.train                    # one seed; --seeds 0 1 2 for the seed-to-seed spread

Each seed runs in this process, one after another: load SmolLM2-135M, validate greedily on held-out
questions (countries training never shows), train, validate. The table prints each seed's accuracy
before and after, the gain, and the wall time; the spread is the largest gap between seeds' gains.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import agentgrad as ag
from examples.search.agent import search_agent
from examples.search.corpus import make_splits

console = Console()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=24, help="GRPO steps (24)")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="questions per step (8)")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per question (8)")
    parser.add_argument("--val-size", type=int, default=64, help="held-out questions (64)")
    parser.add_argument("--learning-rate", type=float, default=3e-4, help="AdamW, for the adapter (3e-4)")
    parser.add_argument("--kl-coef", type=float, default=0.05,
                        help="k3 KL penalty to the base model (0.05): keeps the sampled episodes varied")
    parser.add_argument("--lora-rank", type=int, default=8, help="LoRA rank; 0 trains every weight (8)")
    parser.add_argument("--max-tokens", type=int, default=24, help="per model call (24)")
    parser.add_argument("--credit", choices=("final", "per_turn"), default="final", help="credit assignment (final)")
    parser.add_argument("--concurrency", type=int, default=24, help="episodes at once (24)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run per seed (0)")
    parser.add_argument("--run-dir", default=".agentgrad/search", help="a store per seed goes here")


def train_one(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One seed: validate, train, validate; returns its figures."""
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.engine import Engine
    from agentgrad.policy.config import PolicyConfig

    train, val = make_splits(seed=0)  # the split is fixed; the seed moves sampling and task order
    val = val[: args.val_size]
    store = Path(args.run_dir) / f"seed-{seed}.db"
    store.parent.mkdir(parents=True, exist_ok=True)
    store.unlink(missing_ok=True)
    began = time.perf_counter()
    engine = Engine()
    config = GRPOConfig(steps=args.steps, prompts_per_step=args.prompts_per_step, group_size=args.group_size,
                        max_tokens=args.max_tokens, learning_rate=args.learning_rate, micro_batch_size=8,
                        kl_coef=args.kl_coef, val_every=args.steps, seed=seed, credit=args.credit,
                        policy=PolicyConfig(lora_rank=args.lora_rank),
                        rollout_timeout=1800.0)  # a shared, loaded machine: an episode may wait long for its turns
    trainer: ag.Trainer[Any] = ag.Trainer(GRPO(config, local_engine=engine), n_runners=1,
                                          runner_concurrency=args.concurrency, store=str(store))
    result = trainer.fit(search_agent, train, val)
    engine.close()
    return {"seed": seed, "before": result.initial.success_rate, "after": result.final.success_rate, "wall_s": time.perf_counter() - began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        runs.append(train_one(args, seed))
        console.print(f"seed {seed}: {runs[-1]}  (load average {os.getloadavg()[0]:.1f})")
    table = Table(title=f"search agent, held-out accuracy ({args.val_size} questions, greedy)")
    for column in ("seed", "before", "after", "gain", "wall"):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(str(run["seed"]), f"{run['before']:.3f}", f"{run['after']:.3f}",
                      f"{run['after'] - run['before']:+.3f}", f"{run['wall_s'] / 60:.1f} min")
    console.print(table)
    gains = [r["after"] - r["before"] for r in runs]
    if len(gains) > 1:
        console.print(f"gain: mean {sum(gains) / len(gains):+.3f}, seed-to-seed spread {max(gains) - min(gains):.3f}")


if __name__ == "__main__":
    main()
