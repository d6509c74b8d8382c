"""What a test run must not leave behind: processes it started (servers, runners, vLLM and its workers) still running
at the end, and shared engines whose weights a test changed (tests/conftest.py wires both into the run)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

EXPECTED = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
"""Descendants that live as long as pytest by design: the resource tracker and the fork server (process isolation's
runners fork from it) that multiprocessing starts once per process; each ends when pytest closes its end."""


@dataclass(eq=False)  # a pytest plugin: pluggy keeps plugins in sets, so it hashes by identity
class ProcessWatch:
    """A pytest plugin: every descendant of this process seen after a test, with the test after which it was first
    seen; at the end of the run, the ones still running (reparented ones included: they are remembered by pid and
    start time) are listed, ended, and fail the run. Under pytest-xdist each worker watches its own and the
    controller reports them all."""

    seen: dict[tuple[int, float], tuple[str, str]] = field(default_factory=dict)
    left_by_workers: list[str] = field(default_factory=list)
    controller: bool = False  # pytest-xdist's controller: its children are the workers, it runs no test

    def pytest_configure(self, config: pytest.Config) -> None:
        self.controller = config.pluginmanager.hasplugin("dsession")

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if not self.controller:
            self.after(nodeid)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any) -> None:
        self.left_by_workers.extend(getattr(node, "workeroutput", {}).get("left_running", []))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        left = [] if self.controller else self.still_running()
        lines = [f"pid {p.pid} ({cmdline}), first seen after {test}" for p, cmdline, test in left]
        for process, _, _ in left:
            process.kill()
        lines += self.left_by_workers
        if hasattr(session.config, "workeroutput"):  # a worker: the controller reports and fails the run
            session.config.workeroutput["left_running"] = lines
        elif lines:
            report = session.config.pluginmanager.get_plugin("terminalreporter")
            if report is not None:
                report.ensure_newline()
                report.section("processes left running", sep="=", red=True, bold=True)
                for line in lines:
                    report.line(line)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def after(self, test: str) -> None:
        for child in psutil.Process(os.getpid()).children(recursive=True):
            try:
                key = (child.pid, child.create_time())
                if key not in self.seen:
                    self.seen[key] = (" ".join(child.cmdline())[:200], test)
            except psutil.Error:  # it ended meanwhile
                continue

    def still_running(self, grace_s: float = 10.0) -> list[tuple[psutil.Process, str, str]]:
        """The remembered processes still running after `grace_s` (they may be on their way out), zombies and
        `EXPECTED` ones left out: (process, command line, the test after which it was first seen)."""
        deadline = time.monotonic() + grace_s
        while True:
            left = []
            for (pid, started), (cmdline, test) in self.seen.items():
                if any(expected in cmdline for expected in EXPECTED):
                    continue
                try:
                    process = psutil.Process(pid)
                    if process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE:
                        left.append((process, cmdline, test))
                except psutil.Error:
                    continue
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.2)


def weights_fingerprint(engine: Any) -> tuple[Any, ...]:
    """What changes when a test trains, publishes other weights into, or wraps an engine's model: the model object,
    its parameters' names and float64 sums, and the adapters it serves."""
    import torch

    with engine.weights_lock, torch.no_grad():
        sums = tuple((name, float(torch.sum(p, dtype=torch.float64))) for name, p in engine.model.named_parameters())
    return id(engine.model), repr(engine.adapters), sums


def same_weights(before: tuple[Any, ...], after: tuple[Any, ...]) -> bool:
    """Whether two fingerprints name the same weights (sums may round apart in the last bits, by summing order)."""
    (model, adapters, sums), (model_after, adapters_after, sums_after) = before, after
    return (
        model == model_after
        and adapters == adapters_after
        and [name for name, _ in sums] == [name for name, _ in sums_after]
        and all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for (_, a), (_, b) in zip(sums, sums_after))
    )


def restore_weights(engine: Any) -> None:
    """Load the engine's weights back from the folder it was loaded from, and serve them (a new version)."""
    from safetensors.torch import load_file

    state = load_file(Path(engine.source) / "model.safetensors")
    with engine.training() as model:
        missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in name for name in missing), (missing, unexpected)  # tied: not saved
    engine.publish()
