"""Where a decode step's time goes: model forward vs sampling, and the top operators (torch.profiler).

    .venv/bin/python benchmarks/engine_profile.py [--model PATH] [--batch 32] [--steps 16] [--threads N] [--warm 4]
        [--attention sdpa]

It drives the engine's own prefill and decode methods in this thread (no server, no batching window),
so a step is exactly what the generation loop runs. `--threads` fixes torch's threads (default: what
the engine's loop would measure, `engine/threads.py`); run it with 1 and 2 on a shared machine to see
why the loop measures. Prints the load average: on a shared machine the figures move with it; the CPU
time a step took (process time, all threads) moves less than its wall time, and on 1 thread it is the
figure to compare before and after a change. `--warm` decodes that many tokens before timing (the
completion's length matters to whatever grows with it: detokenization, attention over the cache).
`--attention sdpa` profiles transformers' own attention instead of the engine's (`engine/attention.py`), to
compare the two; `--shapes` groups the operators by their input shapes.
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
from agentgrad.engine.rows import Request, Row
from agentgrad.engine.threads import ThreadChooser


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--warm", type=int, default=4, help="tokens decoded before the timed steps")
    parser.add_argument("--attention", help="an attention implementation of transformers to use instead (sdpa)")
    parser.add_argument("--shapes", action="store_true", help="group the operators by input shapes")
    args = parser.parse_args()
    engine = Engine(args.model)
    if args.attention:
        engine._weights.sampler.set_attn_implementation(args.attention)
    threads = ThreadChooser(args.threads, next(engine._weights.sampler.parameters()).dtype).apply()
    requests = []
    for prompt in prompts(engine, args.batch):
        params = SamplingParams(max_tokens=100_000, temperature=1.0, ignore_eos=True, seed=0)
        request = Request(prompt, params, concurrent.futures.Future(), None)
        request.rows.append(Row(request, 0, torch.Generator().manual_seed(0)))
        requests.append(request)
    sampling, appending = [0.0, 0.0], [0.0, 0.0]  # wall, CPU seconds
    take_tokens, append = engine._take_tokens, engine._append

    def timed(batch, logits):  # type: ignore[no-untyped-def]
        wall, cpu = time.perf_counter(), time.process_time()
        take_tokens(batch, logits)
        sampling[0] += time.perf_counter() - wall
        sampling[1] += time.process_time() - cpu

    def timed_append(*args, **kwargs):  # type: ignore[no-untyped-def]
        wall, cpu = time.perf_counter(), time.process_time()
        append(*args, **kwargs)
        appending[0] += time.perf_counter() - wall
        appending[1] += time.process_time() - cpu

    engine._take_tokens = timed  # type: ignore[method-assign]
    engine._append = timed_append  # type: ignore[method-assign]
    with torch.inference_mode():
        (batch,) = engine._prefill(requests)
        for _ in range(args.warm):
            batch = engine._decode(batch)
        sampling[:], appending[:] = [0.0, 0.0], [0.0, 0.0]
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            batch = engine._decode(batch)
        step, step_cpu = (time.perf_counter() - wall) / args.steps, (time.process_time() - cpu) / args.steps
        sample, sample_cpu = (sampling[0] - appending[0]) / args.steps, (sampling[1] - appending[1]) / args.steps
        rest, rest_cpu = appending[0] / args.steps, appending[1] / args.steps
        print(
            f"{engine.name}, batch {args.batch}, {threads} thread(s), {engine.sampling_dtype}, "
            f"{engine._weights.sampler.config._attn_implementation} attention, tokens "
            f"{args.warm + 1}-{args.warm + args.steps}: {1000 * step:.1f} ms a step ({args.batch / step:.1f} tok/s), "
            f"{1000 * step_cpu:.1f} ms CPU; forward and cache {1000 * (step - sample - rest):.1f} "
            f"({1000 * (step_cpu - sample_cpu - rest_cpu):.1f} CPU), sampling {1000 * sample:.1f} "
            f"({1000 * sample_cpu:.1f} CPU), text and stops {1000 * rest:.1f} ({1000 * rest_cpu:.1f} CPU); "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        with profile(activities=[ProfilerActivity.CPU], record_shapes=args.shapes) as profiler:
            for _ in range(min(args.steps, 8)):
                batch = engine._decode(batch)
    averages = profiler.key_averages(group_by_input_shape=args.shapes)
    print(averages.table(sort_by="self_cpu_time_total", row_limit=args.top, max_shapes_column_width=90))


if __name__ == "__main__":
    main()
