"""Where a decode step's time goes: model forward vs sampling, and the top operators (torch.profiler).

    .venv/bin/python benchmarks/engine_profile.py [--model PATH] [--batch 32] [--steps 16] [--threads N]

It drives the engine's own prefill and decode methods in this thread (no server, no batching window),
so a step is exactly what the generation loop runs. `--threads` fixes torch's threads (default: what
the engine's loop would measure, `engine/threads.py`); run it with 1 and 2 on a shared machine to see
why the loop measures. Prints the load average: on a shared machine the figures move with it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import time

import torch
from engine_bench import prompts
from torch.profiler import ProfilerActivity, profile

from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.engine import _Request, _Row
from agentgrad.engine.threads import ThreadChooser


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    engine = Engine(args.model)
    threads = ThreadChooser(args.threads, next(engine._sampler.parameters()).dtype).apply()
    requests = []
    for prompt in prompts(engine, args.batch):
        params = SamplingParams(max_tokens=100_000, temperature=1.0, ignore_eos=True, seed=0)
        request = _Request(prompt, params, concurrent.futures.Future(), None)
        request.rows.append(_Row(request, 0, torch.Generator().manual_seed(0)))
        requests.append(request)
    sampling = [0.0]
    take_tokens = engine._take_tokens

    def timed(batch, logits):  # type: ignore[no-untyped-def]
        began = time.perf_counter()
        take_tokens(batch, logits)
        sampling[0] += time.perf_counter() - began

    engine._take_tokens = timed  # type: ignore[method-assign]
    with torch.inference_mode():
        (batch,) = engine._prefill(requests)
        for _ in range(4):
            batch = engine._decode(batch)
        sampling[0] = 0.0
        began = time.perf_counter()
        for _ in range(args.steps):
            batch = engine._decode(batch)
        step = (time.perf_counter() - began) / args.steps
        share = sampling[0] / args.steps
        print(f"{engine.name}, batch {args.batch}, {threads} thread(s), {engine.sampling_dtype}: "
              f"{1000 * step:.0f} ms a step ({args.batch / step:.1f} tok/s): forward and cache {1000 * (step - share):.0f} ms, "
              f"sampling and bookkeeping {1000 * share:.0f} ms; load average {os.getloadavg()[0]:.2f}")
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(min(args.steps, 8)):
                batch = engine._decode(batch)
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
