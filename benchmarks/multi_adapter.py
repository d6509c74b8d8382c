"""Decode throughput of the engine serving several LoRA adapters together (`agentgrad/engine/adapters.py`).

    .venv/bin/python benchmarks/multi_adapter.py [--rows 16] [--tokens 32] [--rank 8] [--repeats 2]

Greedy, `ignore_eos` (every row writes `--tokens`), fp32, on SmolLM2. Passes, each with the same prompts:
the engine before any adapter (the plain model), one adapter for every row, two adapters mixed in one
batch (half the rows each: one forward pass per step, peft's per-row `adapter_names`), and the same
two adapters served one after the other (a batch per adapter: what serving one adapter at a time costs).
Each figure is the best of `--repeats`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import torch

from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.adapters import serve_adapters


def timed(engine: Engine, batches: Sequence[Sequence[tuple[list[int], str | None]]], params: SamplingParams) -> float:
    """Seconds to serve these batches one after the other (every request of a batch queued together)."""
    began = time.perf_counter()
    for batch in batches:
        with engine._cv:  # queued together: taken into one batch
            futures = [engine.submit(prompt, params, adapter=adapter) for prompt, adapter in batch]
        for future in futures:
            future.result()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    engine = Engine(sampling_dtype="float32", device="cpu", prefix_cache_bytes=0)
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    questions = [f"What is {i} + {2 * i + 1}? Answer briefly." for i in range(args.rows)]
    prompts = [engine.chat_prompt_ids([{"role": "user", "content": q}]) for q in questions]
    half = args.rows // 2

    def best(batches: Sequence[Sequence[tuple[list[int], str | None]]]) -> float:
        return min(timed(engine, batches, params) for _ in range(args.repeats))

    timed(engine, [[(p, None) for p in prompts[:2]]], params)  # warm up
    results = {"plain model (no adapters)": best([[(p, None) for p in prompts]])}
    torch.manual_seed(0)
    serve_adapters(engine, {"a": "^a$", "b": "^b$"}, rank=args.rank, init_lora_weights=False)
    results["one adapter, every row"] = best([[(p, "a") for p in prompts]])
    results["two adapters mixed in one batch"] = best([[(p, "a" if i < half else "b") for i, p in enumerate(prompts)]])
    results["two adapters, a batch each"] = best([[(p, "a") for p in prompts[:half]], [(p, "b") for p in prompts[half:]]])
    generated = args.rows * args.tokens
    load = os.getloadavg()[0]
    print(f"{args.rows} rows x {args.tokens} tokens, LoRA rank {args.rank}, load average {load:.1f}")
    for name, seconds in results.items():
        print(f"  {name:34s} {seconds:6.2f} s  {generated / seconds:7.1f} tokens/s")
    print(f"  mixed decode steps counted by the engine: {engine.stats['mixed_adapter_steps']}")
    engine.close()


if __name__ == "__main__":
    main()
