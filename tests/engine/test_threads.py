"""The generation loop's thread count: fixed when asked for, else measured and measured again."""

from __future__ import annotations

import threading

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
