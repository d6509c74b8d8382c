"""Helpers every test file shares: waiting on a condition, a free port, a store server's health,
and a clock the test moves (the store fixtures build every backend with it: tests/store/conftest.py)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentgrad.serving import free_port  # noqa: F401  (tests take it from here)
from examples.frameworks.run import AGENTS


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll `condition` until it returns something true (and return that), or fail saying `what` never came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up after {timeout:.0f} s waiting for {what}")


def agent_params(names: Iterable[str]) -> list[Any]:
    """Agent names of examples/frameworks/run.py as test parameters, those run in their framework's own environment
    (`.venv-crewai`, `.venv-autogen`) marked `envs`: `make test-fast` leaves them out."""
    return [pytest.param(name, marks=pytest.mark.envs) if AGENTS[name][0] != "core" else name for name in names]


def sigkill_at_checkpoint(command: list[str], run: Path, step: int, env: dict[str, str], timeout: float) -> int:
    """Run `command` from the repository root until the checkpoint of `step` under `run` is whole, SIGKILL it, and
    return the step of the last whole checkpoint it left (a later one may have finished meanwhile)."""
    from agentgrad.policy.checkpoints import TRAINER_STATE

    checkpoints = run / "checkpoints"
    began = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               cwd=Path(__file__).resolve().parents[1])
    try:
        while not (checkpoints / f"step-{step}" / TRAINER_STATE).exists():
            assert process.poll() is None, process.stdout.read() if process.stdout else ""
            assert time.monotonic() - began < timeout, f"no checkpoint of step {step} within {timeout:.0f} s"
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    return max(int(p.name.removeprefix("step-")) for p in checkpoints.glob("step-*") if (p / TRAINER_STATE).exists())


def healthy(url: str) -> bool:
    """Whether a store server answers its health check at `url`."""
    try:
        return httpx.get(url + "/api/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


VLLM_LORA_RANK = 8
"""The LoRA rank the session's SmolLM2 vLLM server is started for (tests/conftest.py's `smollm2_vllm`)."""


def serve_weights_from_disk(server: Any) -> None:
    """Push the model's weights as loaded from disk into a running vLLM server (a shared one that tests trained)."""
    from agentgrad.policy.vllm import VLLMPolicy
    from agentgrad.store import MemoryStore

    with VLLMPolicy(MemoryStore(), urls=[server.url]) as policy:  # attaching syncs the policy's (fresh) weights
        pass
    policy.engine.close()


class ManualClock:
    """A clock that stands still until the test moves it: `store = MemoryStore(clock=clock); clock.advance(31)`."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start
        self.reads = 0  # how often it was read: a test waits for a reader to look again after it moved it

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def grpo_batch(cfg: Any, store: Any, rollouts: list[Any], groups: list[int]) -> Any:
    """GRPO's batch (`grpo.GroupBatches`) of finished rollouts of one step, with their spans read from `store`."""
    from agentgrad.algorithms.async_rollouts import StepRollouts
    from agentgrad.algorithms.base import DEFAULT_CONSOLE
    from agentgrad.algorithms.grpo import GroupBatches

    spans = await store.query_spans_of([r.rollout_id for r in rollouts])
    return await GroupBatches(cfg, DEFAULT_CONSOLE).build(StepRollouts(1, rollouts, groups), spans)


def crewai_events_late(framework: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runner processes of CrewAI agents started after this run the handlers of finished tool runs a second late, as
    CrewAI's thread pool may on a busy machine (`late_crewai_events/sitecustomize.py`); other frameworks, as they are."""
    if framework.startswith("crewai"):
        monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent / "late_crewai_events"))
