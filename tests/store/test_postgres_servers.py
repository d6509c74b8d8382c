"""Several `agentgrad serve` processes on one PostgreSQL database: runners spread across them run every
rollout once, and a server SIGKILLed under 32 writers loses, doubles and strands nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgrad.rollout.runner import Runner
from agentgrad.store.client import StoreClient
from agentgrad.store.postgres import PostgresStore
from agentgrad.types import AttemptStatus, RolloutStatus, Span
from tests.helpers import free_port, healthy, wait_until
from tests.postgres_server import fresh_schema_url

pytestmark = pytest.mark.slow  # PostgreSQL and store servers as processes: `make test-fast` leaves it out

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
SERVERS = 4


def serve(store: str, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "agentgrad.cli", "serve", "--store", store, "--port", str(port)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class Servers:
    """`SERVERS` store servers on one database, each on its own port; `restart(i)` SIGKILLs one and starts it again."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.ports = [free_port() for _ in range(SERVERS)]
        self.processes = [serve(store, port) for port in self.ports]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.ports]
        for url in self.urls:
            wait_until(lambda url=url: healthy(url), f"the server at {url} to start")

    def restart(self, index: int) -> None:
        os.kill(self.processes[index].pid, signal.SIGKILL)
        self.processes[index].wait(timeout=10)
        self.processes[index] = serve(self.store, self.ports[index])
        wait_until(lambda: healthy(self.urls[index]), "the killed server to start again")

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait(timeout=20)


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    """One set for the module (starting four servers takes seconds); each test reads back only its own rollouts."""
    running = Servers(fresh_schema_url())
    yield running
    running.stop()


def in_thread(work: Any, errors: list[BaseException]) -> threading.Thread:
    """A thread running the coroutine function `work` on a loop of its own; what it raises goes to `errors`."""

    def run() -> None:
        try:
            asyncio.run(work())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_runners_spread_over_four_store_servers_on_one_database_run_every_rollout_once(servers: Servers) -> None:
    n_rollouts, n_runners = 200, 8
    calls: list[tuple[str, int]] = []
    errors: list[BaseException] = []
    runners: list[Runner] = []
    loops: list[asyncio.AbstractEventLoop] = []

    def agent(task: dict[str, int]) -> float:
        calls.append((threading.current_thread().name, task["i"]))
        return float(task["i"])

    def runner_on(index: int) -> Any:
        async def run() -> None:
            runner = Runner(agent, StoreClient(servers.urls[index % SERVERS]), worker_id=f"runner-{index}")
            runners.append(runner)
            loops.append(asyncio.get_running_loop())
            await runner.run()

        return run

    threads = [in_thread(runner_on(i), errors) for i in range(n_runners)]

    async def algorithm() -> list[Any]:  # enqueues through one server, waits through another
        rollouts = await StoreClient(servers.urls[0]).enqueue_rollouts([{"input": {"i": i}} for i in range(n_rollouts)])
        return await StoreClient(servers.urls[1]).wait_for_rollouts([r.rollout_id for r in rollouts], timeout=120)

    finished = asyncio.run(algorithm())
    wait_until(lambda: len(loops) == n_runners, "every runner to start")
    for runner, loop in zip(runners, loops):
        loop.call_soon_threadsafe(runner.stop)
    for thread in threads:
        thread.join(30)
    assert not errors, errors

    assert len(finished) == n_rollouts and {r.status for r in finished} == {RolloutStatus.SUCCEEDED}
    assert sorted(i for _, i in calls) == list(range(n_rollouts))  # each ran once, none twice
    assert sorted(r.reward for r in finished) == [float(i) for i in range(n_rollouts)]

    async def claimed_by() -> dict[str, int]:
        store = PostgresStore(servers.store, sweep_seconds=None)
        workers: dict[str, int] = {}
        for rollout in finished:
            (attempt,) = await store.query_attempts(rollout.rollout_id)
            workers[attempt.worker_id or ""] = workers.get(attempt.worker_id or "", 0) + 1
        await store.close()
        return workers

    workers = asyncio.run(claimed_by())
    served = {int(worker.split("-")[1]) % SERVERS for worker in workers}
    assert served == set(range(SERVERS))  # runners on every server took rollouts


def test_a_store_server_sigkilled_under_32_writers_loses_doubles_and_strands_nothing(servers: Servers) -> None:
    writers, per_writer, spans_per_rollout = 32, 6, 2
    enqueued: list[str] = []
    completed: list[str] = []
    errors: list[BaseException] = []
    total = writers // 2 * per_writer

    def producer(index: int) -> Any:
        async def run() -> None:
            client = StoreClient(servers.urls[index % SERVERS])
            for i in range(per_writer):
                enqueued.append((await client.enqueue_rollout({"w": index, "i": i})).rollout_id)

        return run

    def consumer(index: int) -> Any:
        async def run() -> None:
            client = StoreClient(servers.urls[index % SERVERS])
            while len(completed) < total:
                claimed = await client.dequeue_rollout(worker_id=f"c{index}")
                if claimed is None:
                    await asyncio.sleep(0.02)
                    continue
                rollout_id, attempt_id = claimed.rollout_id, claimed.attempt.attempt_id
                spans = [
                    Span(rollout_id=rollout_id, attempt_id=attempt_id, name=f"s{j}", span_id=uuid.uuid4().hex[:16])
                    for j in range(spans_per_rollout)
                ]
                await client.add_spans(spans)
                await client.update_attempt(rollout_id, attempt_id, status="succeeded", reward=1)
                completed.append(rollout_id)

        return run

    threads = [in_thread(producer(i), errors) for i in range(writers // 2)]
    threads += [in_thread(consumer(i), errors) for i in range(writers // 2)]
    for kill in range(SERVERS):
        wait_until(lambda k=kill: len(completed) >= (k + 1) * total // (SERVERS + 2) or errors, "progress under load")
        servers.restart(kill)
    for thread in threads:
        thread.join(120)
    assert not errors, errors

    async def check() -> None:
        store = PostgresStore(servers.store, sweep_seconds=None)
        rollouts = [r for r in await store.query_rollouts() if "w" in r.input]  # a duplicate would be here too
        inputs = sorted((r.input["w"], r.input["i"]) for r in rollouts)
        assert inputs == [(w, i) for w in range(writers // 2) for i in range(per_writer)]  # 0 lost, 0 duplicated
        assert sorted(r.rollout_id for r in rollouts) == sorted(enqueued) == sorted(completed)
        assert {r.status for r in rollouts} == {RolloutStatus.SUCCEEDED}  # 0 stuck
        for rollout in rollouts:  # each claimed once, its spans written once
            assert [a.status for a in await store.query_attempts(rollout.rollout_id)] == [AttemptStatus.SUCCEEDED]
            spans = await store.query_spans(rollout.rollout_id)
            assert [s.sequence_id for s in spans] == list(range(1, spans_per_rollout + 1))
        await store.close()

    asyncio.run(check())
