"""The rollout phase of the demo's GRPO steps, built-in engine vs vLLM, interleaved in one run; and weight syncs.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/vllm_policy.py [--model smollm2-135m] [--task function]
        [--first-call required] [--steps 2] [--prompts 8] [--group 8]

Both run the calc agent through runners → gateway → policy with the demo's sampling (T=1,
48 tokens), the same tasks in the same order (`--task`: the demo's task; `--first-call required` forces
the first call's tool, as Qwen2.5-Coder-0.5B needs to call in its own format). The two policies share one trainer model and run
their steps alternately (built-in, vLLM, vLLM, built-in, ...), so load from other jobs on a
shared machine falls on both alike; the load average is printed with each step. vLLM servers
come from .venv-vllm (`make vllm`); `--vllm-url` attaches to a running one instead of starting
one (start-up is not timed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agentgrad as ag  # noqa: E402
from agentgrad.policy.local import LocalPolicy  # noqa: E402
from agentgrad.policy.vllm import VLLMPolicy  # noqa: E402
from agentgrad.engine import Engine  # noqa: E402
from engine_bench import frozen  # noqa: E402
from examples.calc_agent import calc_agent, make_splits  # noqa: E402

SAMPLING = {"temperature": 1.0, "max_tokens": 48}


class Phase:
    """One policy's rollout phases: a trainer of its own (so its store counts only its tokens), timed per batch."""

    def __init__(self, name: str, policy: LocalPolicy) -> None:
        self.name, self.store = name, policy.store
        assert isinstance(self.store, ag.MemoryStore)
        self.trainer = ag.Trainer(store=self.store, n_runners=4, runner_concurrency=16,
                                  resources={"llm": policy.llm(**SAMPLING)})
        self.seconds: list[float] = []
        self.tokens: list[int] = []

    def run(self, batch: list[Any], timed: bool = True) -> None:
        before = output_tokens(self.store)
        began = time.perf_counter()
        self.trainer.fit(calc_agent, batch)
        if timed:
            self.seconds.append(time.perf_counter() - began)
            self.tokens.append(output_tokens(self.store) - before)
            print(f"{self.name}: {self.seconds[-1]:.1f} s, {self.tokens[-1]} tokens, load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)


def output_tokens(store: ag.MemoryStore) -> int:
    """Tokens the model wrote in every recorded call so far."""
    spans = [s for r in asyncio.run(store.query_rollouts()) for s in asyncio.run(store.query_spans(r.rollout_id))]
    return sum(int(s.attributes.get("gen_ai.usage.output_tokens", 0)) for s in spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", default="function", choices=["function", "tool", "plain"])
    parser.add_argument("--first-call", default=None, help="the first call's tool_choice (task function), e.g. required")
    parser.add_argument("--steps", type=int, default=2, help="rollout phases timed per engine")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--vllm-url", action="append", default=[])
    parser.add_argument("--no-freeze", dest="freeze", action="store_false",
                        help="leave the vLLM servers running while the built-in engine is timed (`engine_bench.frozen`)")
    args = parser.parse_args()
    train, _ = make_splits(n_train=args.steps * args.prompts, n_val=1, demo=args.task)
    if args.first_call:
        for task in train:
            task["first_call"] = args.first_call
    batches = [[t for t in train[s * args.prompts : (s + 1) * args.prompts] for _ in range(args.group)]
               for s in range(args.steps)]
    load_before = os.getloadavg()
    engine = Engine(args.model)  # bf16 sampling copy for the built-in engine; its fp32 weights are what vLLM is synced to
    with LocalPolicy(ag.MemoryStore(), engine) as local, \
         VLLMPolicy(ag.MemoryStore(), engine, replicas=args.replicas, urls=args.vllm_url, transport="file") as vllm:
        phases = [Phase("built-in engine", local), Phase(f"vLLM ×{len(vllm.servers)}", vllm)]
        for phase in phases:
            phase.run(batches[0][:2], timed=False)  # warm-up: connections, first request
        for step, batch in enumerate(batches):
            for phase in phases if step % 2 == 0 else phases[::-1]:
                with frozen(vllm.servers) if phase is phases[0] and args.freeze else contextlib.nullcontext():
                    phase.run(batch)
        syncs = []
        for _ in range(args.syncs):
            engine.publish()
            syncs.append(vllm.sync())
        capabilities = vllm.capabilities
    engine.close()

    table = Table(title=f"rollout phase of a GRPO step: {args.model}, {args.prompts} tasks × {args.group}, calc agent ({args.task}), "
                        "T=1, ≤48 tokens")
    for column in ("engine", "seconds per step (median)", "tokens/s", "tokens per step"):
        table.add_column(column, justify="right")
    for phase in phases:
        table.add_row(phase.name, f"{statistics.median(phase.seconds):.2f}", f"{sum(phase.tokens) / sum(phase.seconds):.1f}",
                      f"{statistics.fmean(phase.tokens):.0f}")
    console = Console()
    console.print(table)
    base, fast = phases
    console.print(f"vLLM speed-up of the rollout phase: {statistics.median(base.seconds) / statistics.median(fast.seconds):.2f}× "
                  f"({args.prompts * args.group} rollouts per step, {args.steps} steps each, interleaved)")
    console.print(f"one weight sync (file transport: safetensors on /dev/shm, reload_weights, pause/resume): "
                  f"median {statistics.median(syncs):.2f} s of {', '.join(f'{s:.2f}' for s in syncs)}")
    console.print(f"load average (1 min) at the start {load_before[0]:.1f}, at the end {os.getloadavg()[0]:.1f}")
    console.print(capabilities)


if __name__ == "__main__":
    main()
