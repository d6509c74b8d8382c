"""Engine throughput: tokens/s at batch 1, 8 and 32 for 32 and 128 new tokens, and time to first token.

    .venv/bin/python benchmarks/engine_bench.py [--model PATH] [--device cpu|cuda] [--dtype float32|bfloat16]
        [--decode auto|static|dynamic]

Each cell submits `batch` different prompts at once (as concurrent agents would) and generates
exactly `new_tokens` per prompt (end of turn ignored), so the figures compare across engines.
Time to first token is measured for a lone request through the streaming callback. In process, with no HTTP: the
engine's own ceiling (what a client sees is `engine_vs_vllm.py`'s). `--decode static` runs the static KV cache
(`docs/gpu.md`) on a CPU too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from agentgrad.engine import Engine, SamplingParams

QUESTIONS = [
    "What is {a} + {b}?",
    "Write one sentence about the number {a}.",
    "List {b} colours.",
    "Explain in a few words why {a} is smaller than {b}.",
]


@contextlib.contextmanager
def frozen(servers: Sequence[Any]) -> Iterator[None]:
    """Stop these vLLM servers' processes (SIGSTOP to each server's process group) while the built-in engine is
    timed, and let them go on afterwards. After serving, a vLLM server keeps polling for about a second (its
    processes took 91 % of a core in the second after a 64-request batch, ~1 % in each of the next seven), which
    an interleaved run would charge to the engine; the engine's loop blocks when idle, so vLLM's turns need no
    such pause."""
    groups = [os.getpgid(server.process.pid) for server in servers if server.process is not None]
    for group in groups:
        os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        for group in groups:
            os.killpg(group, signal.SIGCONT)


def prompts(engine: Engine, count: int) -> list[list[int]]:
    """Distinct chat prompts of ~40 tokens (the default system prompt plus a short question)."""
    return [
        engine.chat_prompt_ids([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)].format(a=10 + i, b=3 + i % 7)}])
        for i in range(count)
    ]


def throughput(engine: Engine, batch: int, new_tokens: int) -> tuple[float, float]:
    """(generated tokens per second, wall seconds) for one batch."""
    params = SamplingParams(max_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=0)
    began = time.perf_counter()
    generations = engine.generate(prompts(engine, batch), params)
    elapsed = time.perf_counter() - began
    return sum(len(c.token_ids) for g in generations for c in g.completions) / elapsed, elapsed


def time_to_first_token(engine: Engine, repeats: int = 5) -> float:
    times = []
    for i in range(repeats):
        first = threading.Event()
        began = time.perf_counter()
        future = engine.submit(prompts(engine, i + 1)[-1], SamplingParams(max_tokens=8, temperature=0),
                               on_token=lambda *_: first.set())
        first.wait(60)
        times.append(time.perf_counter() - began)
        future.result(60)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a Hugging Face path or id (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device")
    parser.add_argument("--dtype", help="sampling precision (default: bf16 where the hardware has it)")
    parser.add_argument("--decode", default="auto", choices=["auto", "static", "dynamic"], help="Engine(decode=...)")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--new-tokens", default="32,128")
    args = parser.parse_args()
    console = Console()
    began = time.perf_counter()
    engine = Engine(args.model, device=args.device, sampling_dtype=args.dtype, decode=args.decode)
    load_seconds = time.perf_counter() - began
    engine.generate(prompts(engine, 2), SamplingParams(max_tokens=4))  # warm up kernels
    batches = [int(b) for b in args.batches.split(",")]
    lengths = [int(n) for n in args.new_tokens.split(",")]
    threads = engine.stats.get("threads", __import__("torch").get_num_threads())  # what the generation loop chose
    table = Table(title=f"engine: {engine.name} on {engine.device}, {str(engine.sampling_dtype).replace('torch.', '')}, "
                        f"decode {args.decode}, "
                        f"{threads} threads, load average {__import__('os').getloadavg()[0]:.1f}")
    table.add_column("batch", justify="right")
    for n in lengths:
        table.add_column(f"{n} new tokens: tok/s", justify="right")
        table.add_column("wall s", justify="right")
    for batch in batches:
        row = [str(batch)]
        for n in lengths:
            rate, wall = throughput(engine, batch, n)
            row += [f"{rate:.0f}", f"{wall:.2f}"]
        table.add_row(*row)
    console.print(table)
    console.print(f"time to first token (lone request, median of 5): {1000 * time_to_first_token(engine):.0f} ms; "
                  f"model load: {load_seconds:.1f} s")
    engine.close()


if __name__ == "__main__":
    main()
