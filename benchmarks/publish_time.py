"""How long `Engine.publish` takes with the bf16 sampling copy: the copy of the trained weights and the re-pack.

    flock /tmp/agentgrad-big.lock .venv/bin/python benchmarks/publish_time.py --models smollm2-135m,qwen2.5-coder-0.5b

`publish` copies the fp32 trained weights into the bf16 sampling copy and packs its linear layers again for
oneDNN (`engine/prepack.py`); generation waits for it. Printed per model: the whole `publish` and `pack_linears`
alone (median of `--repeats`, wall and CPU seconds), with the load average. A LoRA run that samples from the
adapted fp32 model (the sql demo) has no sampling copy and packs nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

from agentgrad.engine import Engine
from agentgrad.engine.prepack import pack_linears


def timed(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `repeats` calls of `run`."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for model in args.models.split(","):
        engine = Engine(model)
        sampler = engine._weights.sampler
        layers = pack_linears(sampler)
        engine.publish()  # warm-up
        publish = timed(engine.publish, args.repeats)
        pack = timed(functools.partial(pack_linears, sampler), args.repeats)
        print(
            f"{model} ({engine.sampling_dtype}, {layers} linear layers packed): publish {publish[0]:.2f} s wall "
            f"({publish[1]:.2f} s CPU), of which re-pack {pack[0]:.2f} s wall ({pack[1]:.2f} s CPU); "
            f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores",
            flush=True,
        )
        engine.close()


if __name__ == "__main__":
    main()
