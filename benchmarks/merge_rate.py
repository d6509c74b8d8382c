"""How often a tool round merges into one trajectory: the calculator agent on the engine (issue 19, item 8).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/merge_rate.py [--tasks 24] [--forced 8]

Runs `examples/calc_agent.py` through the gateway and the engine at temperature 1: its `tool`
task (text protocol, `calculate: <expr>` answered by a `Result:` user turn) on `--tasks`
problems, and its `function` task with every call forced (`tool_choice="required"`, so each
rollout makes MAX_TURNS calls) on `--forced` problems. A round is a call that follows another in
the same rollout; it merges when its prompt token ids continue the previous call's prompt +
sampled response ids exactly (`adapters.to_trajectories`). Printed: merged rounds / rounds.
Runs on checkouts before and after the change.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools

import agentgrad as ag
from agentgrad.adapters import llm_calls
from agentgrad.engine import Engine
from agentgrad.policy.local import LocalPolicy
from examples.calc_agent import calc_agent, make_splits


def merge_rate(store: ag.MemoryStore) -> tuple[int, int]:
    merged = rounds = 0
    for rollout in asyncio.run(store.query_rollouts()):
        calls = llm_calls(asyncio.run(store.query_spans(rollout.rollout_id)))
        for before, after in itertools.pairwise(calls):
            sampled = before.prompt_token_ids + before.response_token_ids
            rounds += 1
            merged += after.prompt_token_ids[: len(sampled)] == sampled
    return merged, rounds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--forced", type=int, default=8)
    parser.add_argument("--runners", type=int, default=8)
    args = parser.parse_args()
    engine = Engine(device="cpu")
    for demo, count, extra in (("tool", args.tasks, {}), ("function", args.forced, {"tool_choice": "required"})):
        if not count:
            continue
        tasks = make_splits(count, 1, seed=3, demo=demo)[0][:count]
        store = ag.MemoryStore()
        with LocalPolicy(store, engine) as policy:
            llm = policy.llm(temperature=1.0, max_tokens=48, **extra)
            ag.Trainer(store=store, n_runners=args.runners, resources={"llm": llm}).fit(calc_agent, tasks)
        merged, rounds = merge_rate(store)
        print(f"{demo:8s} {'(forced calls) ' if extra else ''}merged rounds {merged}/{rounds} = {merged / max(rounds, 1):.2f}")
    engine.close()


if __name__ == "__main__":
    main()
