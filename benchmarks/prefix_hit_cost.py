"""When a prefix cache hit pays: prefilling a request alone from its cached tokens, or with the others.

    .venv/bin/python benchmarks/prefix_hit_cost.py [--model PATH] [--batch 8] [--hits 8,16,32,64,128,256]

A request whose prompt starts with a finished request's tokens (`engine/prefix_cache.py`) is prefilled
alone from the end of that hit, in a forward of its own; without the hit it joins the other new
prompts' forward (padded to the longest). This times the engine's own `_prefill` for `--batch` new
chat prompts, one of which starts with `hit` cached tokens, both ways (the minimum hit set to 0, then
past any hit), on one thread, best of `--repeats`, in CPU time (it moves less with the load than wall
time). The hit is worth taking where "alone" is cheaper; `PREFIX_HIT_MIN_TOKENS` is set from this.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import time
from typing import Any

import torch
from engine_bench import prompts

import agentgrad.engine.prefill as prefill_module
from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.rows import Request, Row


def requests(batch_prompts: list[list[int]]) -> list[Any]:
    made = []
    for prompt in batch_prompts:
        request = Request(prompt, SamplingParams(max_tokens=8, temperature=0), concurrent.futures.Future(), None)
        request.rows.append(Row(request, 0, None))
        made.append(request)
    return made


def prefill_cpu(engine: Engine, batch_prompts: list[list[int]], minimum: int, repeats: int) -> tuple[float, int]:
    """Best CPU seconds of one `_prefill` of these prompts with the hit minimum at `minimum`, and how many
    of them were prefilled alone (a short hit matches every prompt that shares the system prompt)."""
    prefill_module.PREFIX_HIT_MIN_TOKENS = minimum
    best, alone = float("inf"), 0
    for _ in range(repeats):
        engine._prefiller.shared.clear()  # the batch's shared prefix (system prompt) computed as on a first join
        made = requests(batch_prompts)
        groups = prefill_module.prefill_groups(made, engine.prefix_cache, engine.version)
        alone = sum(len(group) for group, (cached, _) in groups if cached)  # prefilled from their hit
        began = time.process_time()
        engine._prefill(made)
        best = min(best, time.process_time() - began)
    return best, alone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--hits", default="8,16,32,64,128,256")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine(args.model)
    others = prompts(engine, args.batch)
    # an earlier conversation with its own system prompt, so that only the next turn's prompt hits its entry
    earlier = engine.chat_prompt_ids([{"role": "system", "content": "You tell long stories."},
                                      {"role": "user", "content": "Tell me a long story about a calculator. " * 30}])
    print(f"{engine.name}, {engine.sampling_dtype}, 1 thread, {args.batch} new prompts of ~{len(others[0])} tokens")
    print("hit tokens | taken (ms CPU) | prompts alone | ignored (ms CPU) | taken / ignored")
    with torch.inference_mode():
        for hit in (int(h) for h in args.hits.split(",")):
            cached = earlier[:hit]
            kv = engine._prefiller.shared_kv(tuple(cached), None, engine.version, engine.adapters)
            engine.prefix_cache.put(engine.version, tuple(cached), kv)
            batch_prompts = [cached + others[0][-12:]] + others[1:]  # the next turn: the cached tokens, then new ones
            taken, alone = prefill_cpu(engine, batch_prompts, hit, args.repeats)
            ignored, _ = prefill_cpu(engine, batch_prompts, 10**9, args.repeats)
            print(f"{hit:10d} | {1000 * taken:14.1f} | {alone:13d} | {1000 * ignored:16.1f} | {taken / ignored:.2f}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
