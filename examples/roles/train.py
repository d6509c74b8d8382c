"""Train the solver and the verifier of `examples/roles/agents.py` two ways and compare them on held-out tasks.

    python -m examples.roles.train     # ~20 min per configuration on a loaded 2-core machine; --help: sizes

1. `roles`: `GRPOConfig(roles=ROLES, lora_rank=8)`, one LoRA adapter per role on one frozen base, each role
   trained on its own calls with its own reward dimension;
2. `shared`: the same configuration without `roles`: one adapter serves and learns every call, all of them
   paid the rollout's reward (the solver's in a solve task, the verifier's in a check task).

Each runs in its own process (so its peak memory is its own), validating greedily before and after on the
held-out tasks: the solver's accuracy on `solve` tasks (its final answer) and the verifier's on `check`
tasks (a fixed half-right, half-wrong mix of proposed answers). The table prints role × (before, after
roles, after shared), then each run's wall time and peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import agentgrad as ag
from examples.roles.agents import ROLES, SOLVER, VERIFIER, make_splits, solver_and_verifier

POLICIES = ("roles", "shared")
HELD_OUT = {SOLVER: "solve", VERIFIER: "check"}
"""Which held-out tasks measure each role: the solver's final answers, the verifier's verdicts on fixed answers."""
console = Console()
CHECKOUT = Path(__file__).resolve().parents[2]
"""The source checkout, where `examples` imports from."""


@dataclass
class RunResult:
    """One configuration's figures: held-out accuracy per role before and after, wall time, peak memory."""

    policy: str
    before: dict[str, float]
    after: dict[str, float]
    wall_seconds: float
    peak_rss_gib: float


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps (default: 6)")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="tasks per step, half of each kind (8)")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per task (4)")
    parser.add_argument("--val-size", type=int, default=64, help="held-out tasks per role (64)")
    parser.add_argument("--learning-rate", type=float, default=5e-4, help="AdamW, for each adapter (5e-4)")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32, help="per model call (32)")
    parser.add_argument("--runners", type=int, default=2, help="runner threads, 16 rollouts each (2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-dir", default=".agentgrad/roles", help="a store per configuration goes here")
    parser.add_argument("--policy", choices=POLICIES, help="run this configuration alone and print its JSON result")


def grpo_config(args: argparse.Namespace, policy: str) -> Any:
    """The one configuration both runs share; `roles` only in the first."""
    from agentgrad.algorithms.grpo import GRPOConfig
    from agentgrad.policy.config import PolicyConfig

    return GRPOConfig(
        steps=args.steps,
        prompts_per_step=args.prompts_per_step,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        learning_rate=args.learning_rate,
        micro_batch_size=8,
        val_every=args.steps,
        seed=args.seed,
        roles=ROLES if policy == "roles" else None,
        policy=PolicyConfig(lora_rank=args.lora_rank),
    )


async def held_out_accuracy(store: Any) -> dict[int, dict[str, float]]:
    """Per validation step, each role's mean reward on its held-out tasks (`HELD_OUT`), from the spans' reward
    dimensions (the same reading `roles=` trains on)."""
    from agentgrad.algorithms.roles import role_reward

    scores: dict[int, dict[str, list[float]]] = {}
    for rollout in await store.query_rollouts(mode="val"):
        spans = await store.query_spans(rollout.rollout_id)
        step = scores.setdefault(int(rollout.metadata.get("step", 0)), {role: [] for role in ROLES})
        for role, kind in HELD_OUT.items():
            if rollout.input["kind"] == kind:
                step[role].append(role_reward(spans, role, ROLES[role], 0.0))
    return {
        step: {role: statistics.fmean(v) if v else 0.0 for role, v in by_role.items()}
        for step, by_role in scores.items()
    }


def train_one(args: argparse.Namespace, policy: str) -> RunResult:
    """Load the model, validate, train `args.steps` GRPO steps, validate: one configuration in this process."""
    from agentgrad.algorithms.grpo import GRPO
    from agentgrad.engine import Engine

    train, val = make_splits(n_val=args.val_size, seed=args.seed)
    store_path = Path(args.run_dir) / f"{policy}.db"
    store_path.parent.mkdir(parents=True, exist_ok=True)
    store_path.unlink(missing_ok=True)
    began = time.perf_counter()
    engine = Engine()
    grpo = GRPO(grpo_config(args, policy), local_engine=engine)
    trainer: ag.Trainer[Any] = ag.Trainer(grpo, n_runners=args.runners, runner_concurrency=16, store=str(store_path))
    trainer.fit(solver_and_verifier, train, val)
    wall = time.perf_counter() - began
    accuracy = asyncio.run(held_out_accuracy(trainer.store))
    engine.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    return RunResult(policy, accuracy[min(accuracy)], accuracy[max(accuracy)], wall, peak)


def run_in_child(args: argparse.Namespace, argv: Sequence[str], policy: str) -> RunResult | None:
    """`train_one` in a fresh process: each configuration loads its own base, and its peak memory is its own.
    None when the process failed (killed for memory, say): the other configuration still reports."""
    out = Path(args.run_dir) / f"{policy}.json"
    out.unlink(missing_ok=True)
    child = subprocess.run([sys.executable, "-m", "examples.roles.train", *argv, "--policy", policy], cwd=CHECKOUT)
    if child.returncode != 0:
        console.print(
            f"the {policy} run failed (exit status {child.returncode}; -9: killed, often for memory); rerun it alone "
            f"with --policy {policy} and the same options"
        )
        return None
    return RunResult(**json.loads(out.read_text()))


def report(results: Sequence[RunResult], args: argparse.Namespace) -> Table:
    """role × (before, after roles, after shared), then wall time and peak memory of each run."""
    by_policy = {r.policy: r for r in results}
    table = Table(title=f"held-out accuracy, greedy ({args.val_size} tasks per role, {args.steps} GRPO steps)")
    for column in ("role", "before", "after (roles)", "after (shared)"):
        table.add_column(column, justify="right")
    for role in ROLES:
        row = [by_policy[p].after.get(role) if p in by_policy else None for p in POLICIES]
        before = next((f"{r.before[role]:.3f}" for r in results), "-")
        table.add_row(role, before, *("-" if v is None else f"{v:.3f}" for v in row))
    table.add_row(
        "wall time (min)", "", *(f"{by_policy[p].wall_seconds / 60:.1f}" if p in by_policy else "-" for p in POLICIES)
    )
    table.add_row(
        "peak RSS (GiB)", "", *(f"{by_policy[p].peak_rss_gib:.2f}" if p in by_policy else "-" for p in POLICIES)
    )
    return table


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.roles.train", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.policy:
        result = train_one(args, args.policy)
        (Path(args.run_dir) / f"{args.policy}.json").write_text(json.dumps(asdict(result)))
        return
    results = [result for policy in POLICIES if (result := run_in_child(args, argv, policy)) is not None]
    console.print(report(results, args))
    if len(results) < len(POLICIES):
        raise SystemExit(1)
    console.print(f"stores: {', '.join(str(Path(args.run_dir) / f'{p}.db') for p in POLICIES)}")


if __name__ == "__main__":
    main()
