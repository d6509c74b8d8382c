"""Held-out accuracy of the untrained model on the search agent and the planner -> executor -> verifier system,
straight from the engine (no store, no training): the before-figure of `examples/search/train.py` and
`examples/pev/train.py` in a few minutes, and where each one's errors lie.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/untrained_agents.py search --n 32
    PYTHONPATH=$PWD .venv/bin/python benchmarks/untrained_agents.py pev --n 20

Greedy, 24 tokens a call, 16 episodes at once; prints each episode, then the accuracy by kind of question
(search) or each role's reward (pev), the wall time and the load average.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import time
from typing import Any

from openai import OpenAI

SAMPLING = {"temperature": 0.0, "max_tokens": 24}


def search(client: OpenAI, model: str, n: int) -> None:
    from examples.search.agent import is_correct, run_episode
    from examples.search.corpus import make_splits

    right: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()

    def one(task: dict[str, Any]) -> tuple[dict[str, Any], str | None, list[str]]:
        return (task, *run_episode(client, model, task["question"], SAMPLING))

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for task, answer, used in pool.map(one, make_splits()[1][:n]):
            total[task["kind"]] += 1
            right[task["kind"]] += is_correct(answer, task["answer"])
            print(task["kind"], repr(task["answer"]), repr(answer), used)
    print({kind: f"{right[kind]}/{total[kind]}" for kind in total}, f"{sum(right.values())}/{n} right")


def pev(client: OpenAI, model: str, n: int) -> None:
    from examples.pev.agents import ROLES, grade, make_splits, run_system

    clients = dict.fromkeys(ROLES, client)  # one model, no adapters yet: every role's calls reach the base

    def one(task: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        return task, run_system(task["question"], clients, model, SAMPLING)

    sums: collections.Counter[str] = collections.Counter()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for task, outcome in pool.map(one, make_splits(n_val=n)[1]):
            grades = grade(task, outcome)
            sums.update(grades)
            print(task["plan"], outcome, grades)
    print({figure: f"{value / n:.3f}" for figure, value in sums.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("example", choices=("search", "pev"))
    parser.add_argument("--n", type=int, default=32, help="held-out tasks (32)")
    args = parser.parse_args()
    from agentgrad.engine import Engine
    from agentgrad.engine.server import create_engine_app
    from agentgrad.serving import ServerThread

    engine = Engine()
    began = time.perf_counter()
    with ServerThread(create_engine_app(engine)) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="local")
        (search if args.example == "search" else pev)(client, engine.name, args.n)
    print(f"{time.perf_counter() - began:.0f} s, load average {os.getloadavg()[0]:.1f}")
    engine.close()


if __name__ == "__main__":
    main()
