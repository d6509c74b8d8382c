"""The rollout phase of the demo's GRPO steps, built-in engine vs vLLM, side by side; and one weight sync.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/vllm_policy.py [--steps 2] [--prompts 8] [--group 8]

Both run the calc agent through runners → gateway → policy with the demo's sampling (T=1,
48 tokens), the same tasks in the same order. vLLM servers come from .venv-vllm (`make vllm`);
`--vllm-url` attaches to a running one instead of starting one (start-up is not timed).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agentgrad as ag  # noqa: E402
from agentgrad.algorithms.policy import LocalPolicy  # noqa: E402
from agentgrad.algorithms.vllm_policy import VLLMPolicy  # noqa: E402
from agentgrad.engine import Engine  # noqa: E402
from examples.calc_agent import calc_agent, make_splits  # noqa: E402

SAMPLING = {"temperature": 1.0, "max_tokens": 48}


def rollout_phase(policy: LocalPolicy, store: ag.MemoryStore, batches: list[list[Any]]) -> tuple[list[float], int]:
    """Seconds of each batch's rollouts, and the tokens generated in all of them."""
    trainer = ag.Trainer(store=store, n_runners=4, runner_concurrency=16, resources={"llm": policy.llm(**SAMPLING)})
    trainer.fit(calc_agent, batches[0][:2])  # warm-up: connections, first request
    before = _output_tokens(store)
    seconds = []
    for batch in batches:
        began = time.perf_counter()
        trainer.fit(calc_agent, batch)
        seconds.append(time.perf_counter() - began)
    return seconds, _output_tokens(store) - before


def _output_tokens(store: ag.MemoryStore) -> int:
    spans = asyncio.run(store.query_spans(None))
    for rollout in asyncio.run(store.query_rollouts()):
        spans += asyncio.run(store.query_spans(rollout.rollout_id))
    return sum(int(s.attributes.get("gen_ai.usage.output_tokens", 0)) for s in spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--vllm-url", action="append", default=[])
    args = parser.parse_args()
    train, _ = make_splits(n_train=args.steps * args.prompts, n_val=1)
    batches = [[t for t in train[s * args.prompts : (s + 1) * args.prompts] for _ in range(args.group)]
               for s in range(args.steps)]
    results: dict[str, tuple[list[float], int]] = {}

    store = ag.MemoryStore()
    engine = Engine()
    with LocalPolicy(store, engine) as policy:
        results["built-in engine"] = rollout_phase(policy, store, batches)
    print("built-in engine: seconds per step", results["built-in engine"][0], "tokens", results["built-in engine"][1],
          flush=True)
    engine.close()
    del engine, policy

    store = ag.MemoryStore()
    with VLLMPolicy(store, replicas=args.replicas, urls=args.vllm_url, transport="file") as vllm:
        results[f"vLLM ×{len(vllm.servers)}"] = rollout_phase(vllm, store, batches)
        syncs = []
        for _ in range(3):
            vllm.engine.publish()
            syncs.append(vllm.sync())
        capabilities = vllm.capabilities

    rollouts = args.prompts * args.group
    table = Table(title=f"rollout phase of a GRPO step: {args.prompts} tasks × {args.group}, calc agent, T=1, 48 tokens")
    for column in ("engine", "seconds per step (median)", "tokens/s", "tokens per step"):
        table.add_column(column, justify="right")
    for name, (seconds, tokens) in results.items():
        table.add_row(name, f"{statistics.median(seconds):.2f}", f"{tokens / sum(seconds):.1f}",
                      f"{tokens / len(seconds):.0f}")
    console = Console()
    console.print(table)
    (base, _), (fast, _) = results.values()
    console.print(f"vLLM speed-up of the rollout phase: {statistics.median(base) / statistics.median(fast):.2f}× "
                  f"({rollouts} rollouts per step)")
    console.print(f"one weight sync (file transport: safetensors on /dev/shm, reload_weights, pause/resume): "
                  f"median {statistics.median(syncs):.2f} s of {', '.join(f'{s:.2f}' for s in syncs)}")
    console.print(capabilities)


if __name__ == "__main__":
    main()
