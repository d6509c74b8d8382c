"""`agentgrad demo`: the main job. For now: evaluate a toy calculator agent with a Baseline."""

from __future__ import annotations

import argparse
import random

from rich.console import Console

import agentgrad as ag

console = Console()


def toy_model(a: int, b: int, rng: random.Random) -> int:
    """A stand-in model that adds correctly most of the time, and slips a digit otherwise."""
    return a + b if rng.random() < 0.7 else a + b + rng.choice([-10, -1, 1, 10])


@ag.rollout
def toy_calc_agent(task: dict) -> float:
    rng = random.Random(task["seed"])
    with ag.operation("model", question=f"{task['a']} + {task['b']}") as op:
        answer = toy_model(task["a"], task["b"], rng)
        op.set_output(answer)
    return 1.0 if answer == task["a"] + task["b"] else 0.0


def main(args: argparse.Namespace) -> None:
    rng = random.Random(0)
    data = [{"a": rng.randint(10, 99), "b": rng.randint(10, 99), "seed": i} for i in range(40)]
    trainer = ag.Trainer(n_runners=4, store=args.store)
    trainer.fit(toy_calc_agent, data[:30], data[30:])
    console.print(f"store: {trainer.store}  (inspect: agentgrad rollouts ls --store {getattr(trainer.store, 'path', '')})")
