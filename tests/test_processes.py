"""Runner processes as users run them: the `processes` strategy, `agentgrad serve` and `agentgrad runner`,
and what happens when a runner or the server is SIGKILLed mid-run."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import agentgrad as ag
from agentgrad.store import SqliteStore, Store
from agentgrad.store.client import StoreClient
from agentgrad.store.server import store_server
from agentgrad.types import AttemptStatus, RolloutStatus, Span
from tests import process_agents
from tests.helpers import free_port, healthy, wait_until

TESTS = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}


def agentgrad_cli(*args: str, **options: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "agentgrad.cli", *args], text=True, **{"env": ENV, **options})


async def check_completed_once(store: Store, rollout_ids: list[str]) -> dict[str, list[Any]]:
    """Every rollout succeeded with exactly one succeeded attempt holding all its spans; returns the attempts."""
    attempts = {}
    for rollout in await store.query_rollouts(rollout_ids=rollout_ids):
        assert rollout.status is RolloutStatus.SUCCEEDED, rollout
        attempts[rollout.rollout_id] = await store.query_attempts(rollout.rollout_id)
        (winner,) = [a for a in attempts[rollout.rollout_id] if a.status is AttemptStatus.SUCCEEDED]
        names = [s.name for s in await store.query_spans(rollout.rollout_id, winner.attempt_id)]
        assert names == ["agentgrad.message"] * process_agents.STEPS + ["agentgrad.reward", "agentgrad.rollout"]
    assert len(attempts) == len(rollout_ids)
    return attempts


# ----------------------------------------------------------------------------- the processes strategy


def test_the_processes_strategy_runs_the_agent_in_runner_processes(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "run.db")
    trainer = ag.Trainer(n_runners=2, store=store, strategy="processes")
    results = trainer.fit(process_agents.square, [{"n": n} for n in range(8)])
    assert results["train"].n == 8 and results["train"].succeeded == 8

    async def check() -> None:
        for rollout in await store.query_rollouts():
            assert rollout.reward == rollout.input["n"] ** 2
            assert rollout.config.unresponsive_seconds == 30  # runners that vanish lose their attempts
            (attempt,) = await store.query_attempts(rollout.rollout_id)
            assert attempt.worker_id in ("runner-0", "runner-1")
            message = (await store.query_spans(rollout.rollout_id))[0].attributes["agentgrad.message.body"]
            assert message.startswith("pid ") and int(message[4:]) != os.getpid()

    asyncio.run(check())


def test_an_agent_that_cannot_be_sent_to_runner_processes_is_a_clear_error() -> None:
    trainer = ag.Trainer(store="memory", strategy="processes")
    with pytest.raises(TypeError, match="define it at module level"):
        trainer.fit(ag.rollout(lambda task: 1.0), [1])


def test_a_runner_process_that_dies_is_reported_and_its_rollout_runs_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteStore(tmp_path / "run.db")
    data = [{"i": i, "die": i == 2} for i in range(6)]
    with caplog.at_level(logging.ERROR, logger="agentgrad.rollout.workers"):
        results = ag.Trainer(n_runners=2, store=store, strategy="processes").fit(process_agents.dies_once, data)
    assert results["train"].succeeded == 6
    assert "was killed by SIGKILL" in caplog.text

    (doomed,) = [r for r in asyncio.run(store.query_rollouts()) if r.input["die"]]
    first, second = asyncio.run(store.query_attempts(doomed.rollout_id))
    assert first.status is AttemptStatus.UNRESPONSIVE and first.error == "runner was killed by SIGKILL"
    assert second.status is AttemptStatus.SUCCEEDED and second.worker_id != first.worker_id


CTRL_C_RUN = """
import sys, agentgrad as ag
from tests import process_agents
ag.Trainer(n_runners=2, store=sys.argv[1], strategy="processes").fit(process_agents.slow, [{"seconds": 0.6}] * 100)
"""


@pytest.mark.slow
def test_ctrl_c_stops_the_algorithm_and_every_runner_process_within_seconds(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    run = subprocess.Popen([sys.executable, "-c", CTRL_C_RUN, str(path)], env=ENV, start_new_session=True)
    try:
        wait_until(lambda: path.exists() and asyncio.run(SqliteStore(path).stats()).rollouts.get("running"),
                   "the runners to start")
        os.killpg(run.pid, signal.SIGINT)  # what Ctrl+C sends: the whole process group
        began = time.monotonic()
        run.wait(timeout=30)
        assert time.monotonic() - began < 10
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)

    def group_gone() -> bool:
        try:
            os.killpg(run.pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(group_gone, "every runner process to exit", timeout=5)
    stats = asyncio.run(SqliteStore(path).stats())
    assert "running" not in stats.rollouts and stats.rollouts.get("succeeded", 0) >= 1  # in-flight work finished


# ----------------------------------------------------------------------------- agentgrad runner / serve


def runner_attempts(store: Store, pid: int, status: AttemptStatus = AttemptStatus.RUNNING) -> list[Any]:
    async def find() -> list[Any]:
        found = []
        for rollout in await store.query_rollouts():
            found += [a for a in await store.query_attempts(rollout.rollout_id)
                      if a.status is status and (a.worker_id or "").split("/")[0].endswith(f"-{pid}")]
        return found

    return asyncio.run(find())


@pytest.mark.slow
def test_a_sigkilled_runner_loses_its_attempts_to_the_other_runners(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    config = {"unresponsive_seconds": 2, "max_attempts": 3}
    ids = [r.rollout_id for r in asyncio.run(store.enqueue_rollouts([{"input": {"seconds": 0.3}, "config": config}] * 24))]
    with store_server(store) as server:
        join = ("runner", "--store", server.url, "--agent", "tests.process_agents:slow", "--workers", "2")
        victim, survivor = agentgrad_cli(*join), agentgrad_cli(*join)
        try:
            wait_until(lambda: runner_attempts(store, victim.pid), "the victim to be running attempts")
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(timeout=10)
            lost = runner_attempts(store, victim.pid)
            assert lost
            finished = asyncio.run(store.wait_for_rollouts(ids, timeout=90))
            assert len(finished) == len(ids)
            attempts = asyncio.run(check_completed_once(store, ids))
            for attempt in lost:
                first, *rest = attempts[attempt.rollout_id]
                assert first.status is AttemptStatus.UNRESPONSIVE
                assert [a.status for a in rest] == [AttemptStatus.SUCCEEDED] and f"-{survivor.pid}/" in rest[0].worker_id
            survivor.send_signal(signal.SIGTERM)
            assert survivor.wait(timeout=15) == 0
        finally:
            for process in (victim, survivor):
                if process.poll() is None:
                    process.kill()


@pytest.mark.slow
def test_a_sigkilled_server_restarted_on_its_file_loses_nothing_and_the_run_finishes(tmp_path: Path) -> None:
    path, port = tmp_path / "store.db", free_port()
    url = f"http://127.0.0.1:{port}"
    serve = ("serve", "--store", str(path), "--port", str(port))
    processes = [agentgrad_cli(*serve, stdout=subprocess.DEVNULL)]
    wait_until(lambda: healthy(url), "the server to start")
    client = StoreClient(url)
    config = {"unresponsive_seconds": 4, "max_attempts": 3}
    queued = asyncio.run(client.enqueue_rollouts([{"input": {"seconds": 0.2}, "config": config}] * 40))
    ids = [r.rollout_id for r in queued]
    processes += [agentgrad_cli("runner", "--store", url, "--agent", "tests.process_agents:slow", "--workers", "2")
                  for _ in range(2)]

    acknowledged: list[str] = []
    writing = threading.Event()
    writing.set()

    def write_spans() -> None:  # a writer of our own, recording which spans the server acknowledged
        async def loop() -> None:
            writer = StoreClient(url)
            probe = await writer.start_rollout("probe")
            i = 0
            while writing.is_set():
                await writer.add_span(Span(rollout_id=probe.rollout_id, attempt_id=probe.attempt.attempt_id, name=f"p{i}"))
                acknowledged.append(f"p{i}")
                i += 1
            await writer.close()
            acknowledged.insert(0, probe.rollout_id)

        asyncio.run(loop())

    writer = threading.Thread(target=write_spans)
    writer.start()
    try:
        wait_until(lambda: asyncio.run(client.stats()).rollouts.get("succeeded", 0) >= 10, "a quarter of the run")
        processes[0].kill()
        processes[0].wait(timeout=10)
        spans_before_restart = len(acknowledged)
        processes.append(agentgrad_cli(*serve, stdout=subprocess.DEVNULL))
        wait_until(lambda: healthy(url), "the server to start again")
        finished = asyncio.run(client.wait_for_rollouts(ids, timeout=90))
        assert len(finished) == len(ids)
        writing.clear()
        writer.join(timeout=30)
        asyncio.run(check_completed_once(client, ids))
        probe_id, *written = acknowledged
        stored = [s.name for s in asyncio.run(client.query_spans(probe_id))]
        assert set(written) <= set(stored) and len(written) > spans_before_restart > 0
        assert all(process.poll() is None for process in processes[1:3])  # the runners rode it out
    finally:
        writing.clear()
        runners, servers = processes[1:3], processes[:1] + processes[3:]
        for group in (runners, servers):  # runners first: they say goodbye to the server
            for process in group:
                process.terminate()
            for process in group:
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()


def test_runner_command_errors_say_how_to_fix_them() -> None:
    for agent, message in (("tests.process_agents", "module:object"), ("no_such_module:x", "cannot import"),
                           ("tests.process_agents:missing", "no agent named 'missing'")):
        run = agentgrad_cli("runner", "--store", "http://127.0.0.1:9", "--agent", agent,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = run.communicate(timeout=60)
        assert run.returncode == 2 and message in " ".join(out.split()), out + err


def test_serve_refuses_to_listen_beyond_loopback_without_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "AGENTGRAD_TOKEN"}
    run = subprocess.run([sys.executable, "-m", "agentgrad.cli", "serve", "--store", str(tmp_path / "s.db"),
                          "--host", "0.0.0.0"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "without a token" in " ".join(run.stdout.split())
    assert not (tmp_path / "s.db").exists()  # refused before touching anything


@pytest.mark.slow
def test_a_runner_with_gateway_routes_agents_that_build_openai_without_arguments(tmp_path: Path, upstream: Any) -> None:
    """`agentgrad serve --backend` hosts the gateway; `agentgrad runner --gateway` sets OPENAI_BASE_URL per attempt."""
    path, port = tmp_path / "store.db", free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**ENV, "FAKE_UPSTREAM_KEY": "sk-upstream-secret-1234", "OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""}
    server = agentgrad_cli("serve", "--store", str(path), "--port", str(port), "--backend",
                           f"policy={upstream.url},key_env=FAKE_UPSTREAM_KEY", stdout=subprocess.DEVNULL, env=env)
    runner = None
    try:
        wait_until(lambda: healthy(url), "the server to start")
        client = StoreClient(url)
        ids = [r.rollout_id for r in asyncio.run(client.enqueue_rollouts([{"input": {"q": f"question {i}"}} for i in range(4)]))]
        runner = agentgrad_cli("runner", "--store", url, "--agent", "tests.process_agents:bare_openai", "--workers", "1",
                               "--gateway", url + "/v1", env=env)
        assert len(asyncio.run(client.wait_for_rollouts(ids, timeout=60))) == 4

        async def calls() -> dict[str, list[Span]]:
            return {rid: [s for s in await client.query_spans(rid) if s.attributes.get("gen_ai.operation.name") == "chat"]
                    for rid in ids}

        recorded = asyncio.run(calls())
        for rid, spans in recorded.items():
            (span,) = spans  # each agent's call landed in its own attempt
            assert span.rollout_id == rid and "question" in span.attributes["gen_ai.input.messages"]
        assert all(r.reward == 1.0 for r in asyncio.run(client.query_rollouts(rollout_ids=ids)))
    finally:
        for process in (runner, server):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=20)


def test_a_runner_process_of_another_environment_that_dies_has_its_attempts_run_by_the_other(tmp_path: Path) -> None:
    from agentgrad.rollout.venvs import RunnerProcesses, serve_store
    from agentgrad.train.processes import run_with_runners

    store = SqliteStore(tmp_path / "run.db")
    data = [{"i": i, "die": i == 0} for i in range(4)]
    with serve_store(store) as url:
        runners = [
            RunnerProcesses(sys.executable, url, "tests.process_agents:dies_once", name=name, cwd=TESTS.parent)
            for name in ("venv-a", "venv-b")
        ]
        for runner in runners:
            runner.start()
        try:
            results = asyncio.run(run_with_runners(ag.Baseline(), store, runners, data))
        finally:
            for runner in runners:
                runner.stop()
    assert results["train"].succeeded == 4
    (doomed,) = [r for r in asyncio.run(store.query_rollouts()) if r.input["die"]]
    first, second = asyncio.run(store.query_attempts(doomed.rollout_id))
    assert (first.status, first.error) == (AttemptStatus.UNRESPONSIVE, "runner was killed by SIGKILL")
    assert second.status is AttemptStatus.SUCCEEDED and {first.worker_id, second.worker_id} == {"venv-a", "venv-b"}
