"""Prefill tokens of the demo's validation workload (the calculator agent's tool-call turns) with the
engine's prefix cache off and on, and whether every reply is the same.

    .venv/bin/python benchmarks/prefix_cache_demo.py [--problems 32] [--concurrency 16]

The agent runs unchanged against the engine served on loopback, greedy (as the demo's validation),
over the same held-out problems twice: once with the prefix cache off, once on (the batch prefix
cache, `Prefiller.shared_kv`, stays on in both, and is emptied between the passes).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import time
from typing import Any

import agentgrad as ag
from agentgrad.cli.demo import load_calc_example
from agentgrad.engine import Engine
from agentgrad.engine.prefix_cache import PrefixCache
from agentgrad.engine.server import create_engine_app
from agentgrad.serving import ServerThread


def run_pass(engine: Engine, calc: Any, url: str, problems: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    """Each problem through the agent; the engine's prefill counts and the chat replies it wrote."""
    replies: list[str] = []
    create = engine_replies(engine, replies)
    engine._prefiller.shared.clear()
    before = dict(engine.stats)
    llm = ag.LLM(base_url=url + "/v1", model=engine.name, sampling_parameters={"temperature": 0.0})
    agent = getattr(calc.calc_agent, "__wrapped__", calc.calc_agent)
    began = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        rewards = list(pool.map(lambda task: agent(task, llm), problems))
    create()
    return {
        "seconds": time.perf_counter() - began,
        "rewards": rewards,
        "replies": sorted(replies),
        **{key: engine.stats[key] - before.get(key, 0) for key in ("prompt_tokens", "prefill_tokens", "prefix_cache_tokens", "requests")},
    }


def engine_replies(engine: Engine, replies: list[str]) -> Any:
    """Record every generation's prompt and completion ids (wrapping `Engine.submit`); returns the undo."""
    submit = engine.submit

    def recording(prompt_ids: Any, params: Any = None, on_token: Any = None) -> Any:
        future = submit(prompt_ids, params, on_token)
        future.add_done_callback(
            lambda f: replies.append(repr((list(prompt_ids), [c.token_ids for c in f.result().completions])))
        )
        return future

    engine.submit = recording  # type: ignore[method-assign]
    return lambda: setattr(engine, "submit", submit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--task", default="function", help="the demo's task (its default: function)")
    parser.add_argument("--dtype", default="float32",
                        help="sampling precision; float32 makes greedy replies independent of how requests were batched")
    parser.add_argument("--passes", default="off,on", help="the cache setting of each pass, in order (off,off,on: "
                        "how much two passes differ without it)")
    args = parser.parse_args()
    calc = load_calc_example()
    _, val = calc.make_splits(n_train=2000, n_val=args.problems, seed=0, demo=args.task)
    engine = Engine(sampling_dtype=args.dtype)
    with ServerThread(create_engine_app(engine)) as server:
        results = {}
        for index, name in enumerate(args.passes.split(",")):
            engine.prefix_cache = PrefixCache(0 if name == "off" else PrefixCache().max_bytes)
            results[name if name not in results else f"{name}{index}"] = run_pass(
                engine, calc, server.url, val, args.concurrency
            )
    engine.close()
    for name, r in results.items():
        print(f"prefix cache {name:>4}: {r['requests']} calls, {r['prompt_tokens']} prompt tokens, "
              f"{r['prefill_tokens']} computed, {r['prefix_cache_tokens']} from the prefix cache, "
              f"{r['seconds']:.1f} s, reward mean {sum(r['rewards']) / len(r['rewards']):.3f}")
    off, on = results["off"]["prefill_tokens"], results["on"]["prefill_tokens"]
    same = results["off"]["replies"] == results["on"]["replies"]
    print(f"prefill tokens: {off} -> {on} ({100 * (1 - on / off):.0f} % fewer); identical calls and replies: {same}; "
          f"{args.dtype}; load average {os.getloadavg()[0]:.2f}")
    for name in results:
        if name not in ("off", "on"):
            print(f"pass {name} identical to the first pass without the cache: "
                  f"{results[name]['replies'] == results['off']['replies']}")


if __name__ == "__main__":
    main()
