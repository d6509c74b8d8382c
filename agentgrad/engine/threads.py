"""How many threads the generation loop computes with (every core by default, or measured: `auto`), set
without `torch.set_num_threads` (`set_threads`), and keeping its OpenMP workers the only ones alive
(`in_own_thread`) and the other threads' freed memory reused (`limit_malloc_arenas`) or given back
(`return_free_memory`).

On a CPU shared with other processes, a matrix product split over every core waits at each
barrier for the thread the scheduler took away: on 2 cores with one kept busy elsewhere, a decode
step of SmolLM2 at batch 32 took 3.4 s on 2 threads and 0.34 s on 1. With `auto` the loop times a
small product on 1 thread and on all of them, keeps the faster, and measures again now and then,
since the other processes come and go. It is not the default: on a quiet 2-core machine the probe
chose 1 thread inside the demo, whose GRPO steps then took ~66 s instead of ~37 s on 2 (`agentgrad demo
--steps 2 --val-size 64`: 4.0 min against 2.5): a small probe product is not a decode step.
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")

THREADS_ENV = "AGENTGRAD_ENGINE_THREADS"
"""A number fixes the generation loop's threads, `auto` measures them; `Engine(threads=...)` too. Unset: every core."""
AUTO = "auto"
REPROBE_SECONDS = 60.0
"""How often a busy loop measures again which thread count is faster."""
PROBE_ROWS, PROBE_WIDTH = 16, 1024
MALLOC_ARENAS = 2
"""glibc malloc arenas the process keeps (`limit_malloc_arenas`); `$MALLOC_ARENA_MAX` overrides."""
M_ARENA_MAX = -8  # glibc's malloc.h


def fixed_threads(requested: int | str | None) -> int | None:
    """The thread count asked for (argument, else `$AGENTGRAD_ENGINE_THREADS`, else every core torch uses), or
    None for `auto`: measure."""
    value: int | str | None = requested if requested is not None else os.environ.get(THREADS_ENV)
    if value is None or value == "":
        return torch.get_num_threads()
    if value == AUTO:
        return None
    try:
        threads = int(value)
    except ValueError:
        raise ValueError(
            f"{THREADS_ENV}={value!r} is not a number of threads or 'auto' (measured); unset, every core"
        ) from None
    if threads < 1:
        raise ValueError(f"the engine's threads must be at least 1, got {threads}")
    return threads


PROBE_SECONDS = 0.04
"""How long each thread count computes per round of a measurement: several scheduler time slices, since a
probe shorter than one can miss a thread taken away (a probe of a few ms chose 2 threads at load 17, where they
decoded 5x slower than 1)."""
PROBE_ROUNDS = 3


@functools.cache
def _openmp_set_num_threads() -> Callable[[int], Any] | None:
    """The OpenMP runtime's `omp_set_num_threads` that torch's kernels run on, where the process exports it."""
    try:
        return ctypes.CDLL(None).omp_set_num_threads
    except (OSError, AttributeError):
        return None


def set_threads(count: int) -> None:
    """Compute with `count` threads in the calling thread, as `torch.set_num_threads` would, without what that
    also does to MKL: it turns MKL's dynamic threading off and has every thread that computes later (OpenMP's
    workers included) ask MKL for `count` threads of its own. The CPU flash attention kernel calls MKL's bf16
    matrix-vector products inside its own parallel loop, so each of them then started a nested parallel region:
    SmolLM2's decode attention took 1.0 ms a layer at 64 rows instead of 0.73, and a decode step 103 ms instead
    of 62 (8 rows: 32 against 23; `docs/engine.md`). Setting only OpenMP's count leaves MKL to run sequentially
    inside torch's parallel loops. Where the runtime cannot be reached (no `omp_set_num_threads` exported), it
    falls back to `torch.set_num_threads`."""
    torch.get_num_threads()  # torch's per-thread set-up first: run later, it would reset the count
    openmp = _openmp_set_num_threads()
    if openmp is None:
        torch.set_num_threads(count)
    else:
        openmp(count)


def _products(threads: int, weight: torch.Tensor, rows: torch.Tensor) -> tuple[int, float]:
    """How many products `threads` threads compute in about `PROBE_SECONDS`, and the seconds they took."""
    set_threads(threads)
    torch.nn.functional.linear(rows, weight)  # warm up this thread count
    began = time.perf_counter()
    count, elapsed = 0, 0.0
    while elapsed < PROBE_SECONDS:
        torch.nn.functional.linear(rows, weight)
        count += 1
        elapsed = time.perf_counter() - began
    return count, elapsed


def fastest_threads(dtype: torch.dtype, most: int, rounds: int = PROBE_ROUNDS) -> int:
    """1 or `most`, whichever computes decode-sized matrix products faster right now (rounds alternated, so a
    burst of load elsewhere falls on both), set on the calling thread."""
    if most <= 1:
        set_threads(1)
        return 1
    weight = torch.randn(4 * PROBE_WIDTH, PROBE_WIDTH).to(dtype)
    rows = torch.randn(PROBE_ROWS, PROBE_WIDTH).to(dtype)
    totals = {1: [0, 0.0], most: [0, 0.0]}
    for _ in range(rounds):
        for threads in (1, most):
            count, seconds = _products(threads, weight, rows)
            totals[threads][0] += count
            totals[threads][1] += seconds
    chosen = max(totals, key=lambda t: totals[t][0] / totals[t][1])
    set_threads(chosen)
    return chosen


class ThreadChooser:
    """Keeps the calling thread's torch threads at the fixed count, or at the faster one, measured again every
    `REPROBE_SECONDS` (`clock` injectable for tests)."""

    def __init__(
        self, requested: int | str | None, dtype: torch.dtype, clock: Callable[[], float] | None = None
    ) -> None:
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
                set_threads(self.fixed)
                self.threads = self.fixed
            return self.fixed
        now = self.clock()
        if self.threads is None or now - self._measured_at >= REPROBE_SECONDS:
            self.threads = fastest_threads(self.dtype, self.most)
            self._measured_at = now
        return self.threads


def in_own_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a thread that ends with it (context variables kept): its result, or its exception raised here.

    PyTorch's CPU kernels run on OpenMP, and libgomp gives each thread that computes in parallel a pool of
    worker threads that lives as long as that thread. Once the workers of all pools outnumber the cores, every
    worker sleeps after each parallel region instead of spinning, and a decode step, hundreds of small
    regions, pays a wake-up for each: SmolLM2 at 64 rows decoded 400 tok/s in the engine's loop after the
    model was loaded in the main thread, 790 when it was loaded in a thread that had ended (2 cores). So the
    heavy work outside the loop (loading, publishing, the update) runs here, and its pool goes with the thread.
    """
    outcome: list[tuple[bool, Any]] = []
    context = contextvars.copy_context()

    def run() -> None:
        try:
            outcome.append((True, context.run(fn, *args, **kwargs)))
        except BaseException as exc:  # handed to the caller
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name=f"agentgrad-compute-{getattr(fn, '__name__', 'fn')}", daemon=True)
    thread.start()
    thread.join()
    succeeded, value = outcome[0]
    if not succeeded:
        raise value
    return value


@functools.cache
def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas at `arenas` (unless `$MALLOC_ARENA_MAX` sets them); True if set.

    glibc gives new threads arenas of their own (up to 8 per core), and memory freed in an arena stays with it,
    so the threads that load, publish and update (`in_own_thread`) each kept their own peak: `agentgrad demo`
    peaked at 11.7 GiB of resident memory, and at 7.2 GiB with 2 arenas."""
    if os.environ.get("MALLOC_ARENA_MAX") or not sys.platform.startswith("linux"):
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(M_ARENA_MAX, arenas))
    except (OSError, AttributeError):  # not glibc
        return False


def return_free_memory() -> None:
    """Give the pages glibc's malloc holds free back to the system (`malloc_trim`), after a burst of large frees:
    an update's activations and optimizer temporaries, an old packed twin, a closed engine. Tensors of a few MB
    come from malloc's heap, not their own mappings, and freed there they stayed resident: over a test suite's
    GRPO and SFT steps a process held 4.2 GB resident where a trim left 1.8 GB (`docs/engine.md`)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
