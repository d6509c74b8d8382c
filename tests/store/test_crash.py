"""Writes retried across a SIGKILL of the SQLite-backed server are applied exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agentgrad.store import SqliteStore
from agentgrad.store.client import StoreClient
from agentgrad.types import AttemptStatus, RolloutStatus
from tests.helpers import free_port, healthy, wait_until

pytestmark = pytest.mark.slow  # processes SIGKILLed in turn: `make test-fast` leaves it out

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
ROLLOUTS = 150
KILLS = 4


def serve(path: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "agentgrad.cli", "serve", "--store", str(path), "--port", str(port)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_enqueues_claims_and_completions_retried_across_sigkills_are_applied_exactly_once(tmp_path: Path) -> None:
    path, port = tmp_path / "store.db", free_port()
    url = f"http://127.0.0.1:{port}"
    server = serve(path, port)
    wait_until(lambda: healthy(url), "the server to start")
    enqueued: list[str] = []
    completed: list[str] = []
    errors: list[BaseException] = []

    def produce() -> None:
        async def loop() -> None:
            client = StoreClient(url)
            for i in range(ROLLOUTS):
                enqueued.append((await client.enqueue_rollout({"i": i})).rollout_id)

        asyncio.run(loop())

    def consume(name: str) -> None:
        async def loop() -> None:
            client = StoreClient(url)
            while len(completed) < ROLLOUTS:
                claimed = await client.dequeue_rollout(worker_id=name)
                if claimed is None:
                    await asyncio.sleep(0.01)
                    continue
                await client.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded", reward=1)
                completed.append(claimed.rollout_id)

        try:
            asyncio.run(loop())
        except BaseException as exc:  # a 409 on a retried completion, say
            errors.append(exc)

    threads = [threading.Thread(target=produce), *(threading.Thread(target=consume, args=(f"w{i}",)) for i in range(2))]
    for thread in threads:
        thread.start()
    try:
        for kill in range(KILLS):
            wait_until(lambda k=kill: len(completed) >= (k + 1) * ROLLOUTS // (KILLS + 1) or errors, "progress under load")
            os.kill(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
            server = serve(path, port)
            wait_until(lambda: healthy(url), "the server to start again")
        for thread in threads:
            thread.join(timeout=120)
    finally:
        server.terminate()
        server.wait(timeout=20)
    assert not errors, errors

    async def check() -> None:
        store = SqliteStore(path)
        rollouts = await store.query_rollouts()
        assert sorted(r.input["i"] for r in rollouts) == list(range(ROLLOUTS))  # 0 lost, 0 duplicated
        assert sorted(r.rollout_id for r in rollouts) == sorted(enqueued) == sorted(completed)
        assert {r.status for r in rollouts} == {RolloutStatus.SUCCEEDED}  # 0 stuck
        for rollout in rollouts:  # each claimed once: one attempt, and it succeeded
            assert [a.status for a in await store.query_attempts(rollout.rollout_id)] == [AttemptStatus.SUCCEEDED]

    asyncio.run(check())
