"""How many threads the generation loop computes with, chosen by measuring, not by counting cores.

On a CPU shared with other processes, a matrix product split over every core waits at each
barrier for the thread the scheduler took away: on 2 cores with one kept busy elsewhere, a decode
step of SmolLM2 at batch 32 took 3.4 s on 2 threads and 0.34 s on 1. So the loop times a small
product on 1 thread and on all of them, keeps the faster, and measures again now and then, since
the other processes come and go.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

THREADS_ENV = "AGENTGRAD_ENGINE_THREADS"
"""Set to a number to fix the generation loop's threads (no measuring); `Engine(threads=...)` too."""
REPROBE_SECONDS = 60.0
"""How often a busy loop measures again which thread count is faster."""
PROBE_ROWS, PROBE_WIDTH = 16, 1024


def fixed_threads(requested: int | None) -> int | None:
    """The thread count asked for (argument, else `$AGENTGRAD_ENGINE_THREADS`), or None to measure."""
    value: int | str | None = requested if requested is not None else os.environ.get(THREADS_ENV)
    if value is None or value == "":
        return None
    try:
        threads = int(value)
    except ValueError:
        raise ValueError(
            f"{THREADS_ENV}={value!r} is not a number of threads; unset it to let the engine choose"
        ) from None
    if threads < 1:
        raise ValueError(f"the engine's threads must be at least 1, got {threads}")
    return threads


def _seconds(threads: int, weight: torch.Tensor, rows: torch.Tensor, repeats: int) -> float:
    torch.set_num_threads(threads)
    torch.nn.functional.linear(rows, weight)  # warm up this thread count
    began = time.perf_counter()
    for _ in range(repeats):
        torch.nn.functional.linear(rows, weight)
    return time.perf_counter() - began


def fastest_threads(dtype: torch.dtype, most: int, repeats: int = 8) -> int:
    """1 or `most`, whichever computes a decode-sized matrix product faster right now, set on the calling thread."""
    if most <= 1:
        torch.set_num_threads(1)
        return 1
    weight = torch.randn(4 * PROBE_WIDTH, PROBE_WIDTH).to(dtype)
    rows = torch.randn(PROBE_ROWS, PROBE_WIDTH).to(dtype)
    one = min(_seconds(1, weight, rows, repeats) for _ in range(2))
    many = min(_seconds(most, weight, rows, repeats) for _ in range(2))
    chosen = 1 if one < many else most
    torch.set_num_threads(chosen)
    return chosen


class ThreadChooser:
    """Keeps the calling thread's torch threads at the fixed count, or at the faster one, measured again every
    `REPROBE_SECONDS` (`clock` injectable for tests)."""

    def __init__(self, requested: int | None, dtype: torch.dtype, clock: Callable[[], float] | None = None) -> None:
        self.fixed = fixed_threads(requested)
        self.most = torch.get_num_threads()
        self.dtype = dtype
        self.clock: Callable[[], float] = clock or time.monotonic
        self.threads: int | None = None
        self._measured_at = float("-inf")

    def apply(self) -> int:
        """Set the calling thread's torch threads (measuring if due); returns the count in use."""
        if self.fixed is not None:
            if self.threads != self.fixed:
                torch.set_num_threads(self.fixed)
                self.threads = self.fixed
            return self.fixed
        now = self.clock()
        if self.threads is None or now - self._measured_at >= REPROBE_SECONDS:
            self.threads = fastest_threads(self.dtype, self.most)
            self._measured_at = now
        return self.threads
