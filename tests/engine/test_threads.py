"""The generation loop's thread count: fixed when asked for, else measured and measured again."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch

from agentgrad.engine import threads
from agentgrad.engine.threads import REPROBE_SECONDS, THREADS_ENV, ThreadChooser, fixed_threads


def test_a_fixed_count_comes_from_the_argument_or_the_environment_and_bad_values_are_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(THREADS_ENV, "3")
    assert fixed_threads(None) == 3 and fixed_threads(1) == 1
    monkeypatch.setenv(THREADS_ENV, "")
    assert fixed_threads(None) == torch.get_num_threads()  # unset: every core, as torch has them
    monkeypatch.setenv(THREADS_ENV, "auto")
    assert fixed_threads(None) is None  # measured
    monkeypatch.setenv(THREADS_ENV, "two")
    with pytest.raises(ValueError, match="AGENTGRAD_ENGINE_THREADS='two'"):
        fixed_threads(None)
    with pytest.raises(ValueError, match="at least 1, got 0"):
        fixed_threads(0)


def test_the_measured_count_is_set_on_the_calling_thread_and_measured_again_when_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(THREADS_ENV, "auto")
    now = [0.0]
    probes: list[int] = []
    real = threads.fastest_threads

    def counted(dtype: torch.dtype, most: int, rounds: int = 3) -> int:
        probes.append(most)
        return real(dtype, most, rounds=1)

    monkeypatch.setattr(threads, "fastest_threads", counted)
    chooser = ThreadChooser(None, torch.float32, clock=lambda: now[0])
    seen: list[int] = []

    def loop() -> None:
        for at in (0.0, 1.0, REPROBE_SECONDS - 1, REPROBE_SECONDS + 1):
            now[0] = at
            chosen = chooser.apply()
            assert chosen in (1, chooser.most) and torch.get_num_threads() == chosen
            seen.append(chosen)

    worker = threading.Thread(target=loop)
    worker.start()
    worker.join()
    assert len(seen) == 4 and len(probes) == 2  # at the start, and again once REPROBE_SECONDS had passed


def test_a_fixed_count_is_applied_without_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "fastest_threads", lambda *a, **k: pytest.fail("measured a fixed count"))
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(ThreadChooser(1, torch.float32).apply()))
    worker.start()
    worker.join()
    assert result == [1]


OPENMP_WORKERS = """
import os, sys, threading, time
import torch

torch.set_num_threads(2)
before = set(os.listdir("/proc/self/task"))
from agentgrad.engine import Engine, SamplingParams

engine = Engine(sys.argv[1], sampling_dtype="bfloat16")
engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4))
engine.publish()  # copies the trained weights into the bf16 sampling copy and packs them again

def workers():
    python = {thread.native_id for thread in threading.enumerate()}
    return {int(task) for task in set(os.listdir("/proc/self/task")) - before} - python

deadline = time.monotonic() + 30  # the workers of an ended thread's pool exit on their own, soon after it
while len(workers()) > 1 and time.monotonic() < deadline:
    time.sleep(0.05)
print(len(workers()))
"""


@pytest.mark.slow
def test_loading_and_publishing_leave_the_generation_loop_the_only_openmp_workers(tiny_smollm2_dir: Path) -> None:
    """Every thread that computes in parallel keeps a pool of OpenMP workers for as long as it lives, and once
    the workers outnumber the cores they sleep between the hundreds of small regions of a decode step
    (`threads.in_own_thread`). Loading and publishing in the caller's thread would leave it a pool: the new
    threads the process keeps, Python's aside, must be the loop's one worker (2 threads) and nothing else."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", OPENMP_WORKERS, str(tiny_smollm2_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "2"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "1", run.stdout


def test_in_own_thread_returns_the_result_raises_the_exception_and_keeps_context_variables() -> None:
    import contextvars

    from agentgrad.engine.threads import in_own_thread

    name: contextvars.ContextVar[str] = contextvars.ContextVar("name")
    name.set("rollout-7")
    callers: list[threading.Thread] = []

    def work(suffix: str, *, repeat: int = 1) -> str:
        callers.append(threading.current_thread())
        return name.get() + suffix * repeat

    assert in_own_thread(work, "!") == "rollout-7!"
    assert in_own_thread(work, "!", repeat=2) == "rollout-7!!"
    assert callers[0] is not threading.current_thread() and not callers[0].is_alive()
    with pytest.raises(KeyError, match="missing"):
        in_own_thread(lambda: {}["missing"])


@pytest.mark.parametrize("env", [{}, {"MALLOC_ARENA_MAX": "4"}])
def test_malloc_arenas_are_capped_unless_the_environment_sets_them(env: dict[str, str]) -> None:
    """Threads that end (`in_own_thread`) would each keep an arena with their peak in it; a user's setting wins."""
    import os
    import subprocess
    import sys

    code = "from agentgrad.engine.threads import limit_malloc_arenas; print(limit_malloc_arenas())"
    environment = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    out = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ("False" if env else "True")


SET_THREADS = """
import threading, torch
from agentgrad.engine.threads import set_threads

set_threads(1)
seen = []
worker = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
worker.start()
worker.join()
print(torch.get_num_threads(), seen[0])
"""


def test_set_threads_sets_the_calling_thread_only_not_torchs_process_wide_count() -> None:
    """`torch.set_num_threads` records its count for the whole process: every thread that computes afterwards,
    OpenMP's workers included, sets it again on itself, MKL's per-thread count with it, and turns MKL's dynamic
    threading off, which made the CPU attention kernel's MKL calls start nested parallel regions
    (`threads.set_threads`). A thread started after `set_threads(1)` must keep the default count (2 here)."""
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", SET_THREADS],
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["1", "2"]
