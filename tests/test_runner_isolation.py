"""An agent cannot take its runner down: whatever it raises fails its attempt; in process isolation, even
leaving the interpreter does. `--workers N` runs N attempts at once, sync agents too."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import agentgrad as ag
from agentgrad.rollout.runner import Runner
from agentgrad.types import LLM, AttemptStatus, RolloutConfig, RolloutStatus
from tests import process_agents
from tests.helpers import wait_until

ONE_TRY = RolloutConfig(max_attempts=1)


async def _run(agent, tasks, **runner_options):  # type: ignore[no-untyped-def]
    store = ag.MemoryStore()
    queued = await store.enqueue_rollouts([{"input": task, "config": ONE_TRY} for task in tasks])
    runner = Runner(agent, store, max_rollouts=len(tasks), **runner_options)
    await asyncio.wait_for(runner.run(), 60)
    rollouts = [await store.get_rollout(r.rollout_id) for r in queued]
    attempts = [(await store.query_attempts(r.rollout_id))[-1] for r in queued]
    return store, runner, rollouts, attempts


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_an_agent_raising_keyboardinterrupt_fails_its_attempt_and_the_runner_goes_on(kind: str) -> None:
    def sync_agent(task: int) -> float:
        if task == 0:
            raise KeyboardInterrupt("agent pressed Ctrl+C")
        return 1.0

    async def async_agent(task: int) -> float:
        return sync_agent(task)

    store, runner, rollouts, attempts = await _run(sync_agent if kind == "sync" else async_agent, [0, 1])
    assert attempts[0].status is AttemptStatus.FAILED and attempts[0].error == "KeyboardInterrupt: agent pressed Ctrl+C"
    assert rollouts[0].status is RolloutStatus.FAILED
    assert rollouts[1].status is RolloutStatus.SUCCEEDED and runner.completed == 2  # the runner went on
    exceptions = [s for s in await store.query_spans(rollouts[0].rollout_id) if s.name == "agentgrad.exception"]
    assert exceptions and exceptions[0].attributes["exception.type"] == "KeyboardInterrupt"


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_an_agent_calling_sys_exit_fails_its_attempt_with_the_code_and_the_runner_goes_on(kind: str) -> None:
    def sync_agent(task: int) -> float:
        if task == 0:
            sys.exit(3)
        return 1.0

    async def async_agent(task: int) -> float:
        return sync_agent(task)

    _, runner, rollouts, attempts = await _run(sync_agent if kind == "sync" else async_agent, [0, 1])
    assert attempts[0].status is AttemptStatus.FAILED and attempts[0].error == "SystemExit: 3"
    assert rollouts[1].status is RolloutStatus.SUCCEEDED and runner.completed == 2


async def test_an_agent_cancelling_itself_fails_its_attempt_and_the_runner_goes_on() -> None:
    async def agent(task: int) -> float:
        if task == 0:
            raise asyncio.CancelledError("the agent's own cancellation")
        return 1.0

    _, runner, rollouts, attempts = await _run(agent, [0, 1])
    assert attempts[0].status is AttemptStatus.FAILED and "CancelledError" in (attempts[0].error or "")
    assert rollouts[1].status is RolloutStatus.SUCCEEDED and runner.completed == 2


def test_a_ctrl_c_to_the_runner_process_still_stops_the_runner(tmp_path: Path) -> None:
    """The agent blocks the event loop, so the KeyboardInterrupt of the Ctrl+C is raised inside the agent's own
    code: the runner must tell it from an agent's `raise KeyboardInterrupt` and stop rather than fail the attempt."""
    started = tmp_path / "started"
    script = textwrap.dedent(f"""
        import asyncio, time
        import agentgrad as ag
        from agentgrad.rollout.runner import Runner

        async def busy(task):
            open({str(started)!r}, "w").close()
            while True:
                time.sleep(0.01)

        store = ag.MemoryStore()
        loop = asyncio.new_event_loop()
        loop.run_until_complete(store.enqueue_rollouts([{{"input": i}} for i in range(3)]))
        try:
            loop.run_until_complete(Runner(busy, store).run())
        except KeyboardInterrupt:
            raise SystemExit(130)
        raise SystemExit(0)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parent.parent)
    try:
        wait_until(started.exists, "the agent to start", timeout=60)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 130
    finally:
        process.kill()


def test_eight_sync_agents_with_eight_workers_run_at_once() -> None:
    """`agentgrad runner --workers 8` is eight runners in one event loop (`train.processes._workers`): each must
    run its sync agent at once; the loop's shared default pool held 4."""
    together = threading.Barrier(8, timeout=10)

    def waits_for_the_others(task: int) -> float:
        together.wait()  # passes only when all eight run at the same time
        return 1.0

    async def main() -> list[ag.Rollout]:
        store = ag.MemoryStore()
        queued = await store.enqueue_rollouts([{"input": i, "config": ONE_TRY} for i in range(8)])
        runners = [Runner(waits_for_the_others, store, worker_id=f"w{i}", max_rollouts=1) for i in range(8)]
        await asyncio.wait_for(asyncio.gather(*(r.run() for r in runners)), 60)
        return [await store.get_rollout(r.rollout_id) for r in queued]

    rollouts = asyncio.run(main())
    assert [r.status for r in rollouts] == [RolloutStatus.SUCCEEDED] * 8


async def test_a_sync_runner_with_concurrency_8_runs_eight_attempts_at_once() -> None:
    together = threading.Barrier(8, timeout=10)

    def waits_for_the_others(task: int) -> float:
        together.wait()
        return 1.0

    _, _, rollouts, _ = await _run(waits_for_the_others, list(range(8)), concurrency=8)
    assert [r.status for r in rollouts] == [RolloutStatus.SUCCEEDED] * 8


async def test_an_agent_calling_os_exit_in_process_isolation_fails_its_attempt_with_the_exit_code() -> None:
    store, runner, rollouts, attempts = await _run(process_agents.exits_hard, [{"code": 7}, {"segfault": True}],
                                                   isolation="process")
    assert attempts[0].status is AttemptStatus.FAILED and "exited with code 7" in (attempts[0].error or "")
    assert attempts[1].status is AttemptStatus.FAILED and "SIGSEGV" in (attempts[1].error or "")
    assert runner.completed == 2  # the runner survived both
    messages = [s for s in await store.query_spans(rollouts[0].rollout_id) if s.name == "agentgrad.message"]
    assert len(messages) == 1  # what the agent wrote before it went reached the store


@pytest.mark.slow
async def test_attempts_ending_at_once_in_process_isolation_each_report_their_own_exit_code() -> None:
    # a worker starting its next process reads the exit codes of finished ones while other workers read theirs:
    # unserialized, multiprocessing hands one of the two readers 255 (CI saw it as 'code 255' for 'code 5')
    codes = list(range(1, 101))
    _, runner, _, attempts = await _run(process_agents.exits_hard, [{"code": c} for c in codes],
                                        isolation="process", concurrency=8)
    assert [a.error for a in attempts] == [
        f"the agent's process exited with code {c} before it returned (isolation='process')" for c in codes]
    assert runner.completed == len(codes)


async def test_an_agent_in_process_isolation_reports_its_reward_and_spans_from_its_own_process() -> None:
    store, _, rollouts, _ = await _run(process_agents.rewards_in_a_process, [{"n": 2}, {"n": 3}],
                                              isolation="process", concurrency=2)
    assert [r.reward for r in rollouts] == [2.0, 3.0]
    for rollout in rollouts:
        spans = await store.query_spans(rollout.rollout_id)
        (message,) = [s for s in spans if s.name == "agentgrad.message"]
        assert message.attributes["agentgrad.message.body"] != f"pid {os.getpid()}"  # written in another process
        (root,) = [s for s in spans if s.name == "agentgrad.rollout"]
        assert message.parent_id == root.span_id and message.trace_id == root.trace_id


async def test_an_agent_raising_in_process_isolation_fails_its_attempt_with_the_exception() -> None:
    _, runner, _, attempts = await _run(process_agents.interrupts, [{"raise": "interrupt"}, {"raise": "exit"}],
                                        isolation="process")
    assert [a.error for a in attempts] == ["KeyboardInterrupt: agent pressed Ctrl+C", "SystemExit: 3"]
    assert runner.completed == 2


def test_an_unknown_isolation_is_refused() -> None:
    with pytest.raises(ValueError, match="isolation is 'thread' or 'process'"):
        Runner(lambda task: 1.0, ag.MemoryStore(), isolation="container")  # type: ignore[arg-type]


async def test_an_unreachable_llm_fails_the_attempt_naming_its_url() -> None:
    import openai

    url = "http://127.0.0.1:9/v1"  # the discard port: nothing listens

    def calls_the_llm(task: int, llm: LLM) -> float:
        client = openai.OpenAI(base_url=llm.base_url, api_key="k", max_retries=0)
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}])
        return 1.0

    store = ag.MemoryStore()
    await store.add_resources({"llm": LLM(base_url=url, model="m", api_key_env="NO_SUCH_KEY_VARIABLE")})
    queued = await store.enqueue_rollout(0, config=ONE_TRY)
    await asyncio.wait_for(Runner(calls_the_llm, store, max_rollouts=1).run(), 60)
    (attempt,) = await store.query_attempts(queued.rollout_id)
    assert attempt.error is not None and attempt.error.startswith("APIConnectionError: Connection error.")
    assert url in attempt.error, attempt.error


def test_agentgrad_runner_with_isolation_process_survives_an_agent_that_exits(tmp_path: Path) -> None:
    from agentgrad.store import SqliteStore

    store = SqliteStore(tmp_path / "store.db")
    tasks = [{"code": 5}, {"segfault": True}, {"code": 9}]
    ids = [r.rollout_id for r in asyncio.run(store.enqueue_rollouts([{"input": t, "config": ONE_TRY} for t in tasks]))]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    runner = subprocess.Popen([sys.executable, "-m", "agentgrad.cli", "runner", "--store", str(store.path), "--agent",
                               "tests.process_agents:exits_hard", "--workers", "2", "--isolation", "process"], env=env)
    try:
        finished = asyncio.run(store.wait_for_rollouts(ids, timeout=60))
        assert [r.status for r in finished] == [RolloutStatus.FAILED] * 3
        errors = [(asyncio.run(store.query_attempts(rid)))[0].error for rid in ids]
        assert "code 5" in errors[0] and "SIGSEGV" in errors[1] and "code 9" in errors[2], errors
        assert runner.poll() is None  # still serving
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=20) == 0
    finally:
        runner.kill()


@pytest.mark.parametrize("strategy", ["threads", "processes"])
def test_a_trainer_with_runner_isolation_process_survives_an_agent_that_exits(tmp_path: Path, strategy: str) -> None:
    from agentgrad.store import SqliteStore

    trainer = ag.Trainer(store=SqliteStore(tmp_path / "store.db"), strategy=strategy,  # type: ignore[arg-type]
                         runner_isolation="process")
    results = trainer.fit(process_agents.exits_hard, [{"code": 4}, {"code": 5}])
    assert results["train"].n == 2 and results["train"].succeeded == 0
    errors = sorted(a.error or "" for r in asyncio.run(trainer.store.query_rollouts())
                    for a in asyncio.run(trainer.store.query_attempts(r.rollout_id)))
    assert len(errors) == 2 and "exited with code 4" in errors[0] and "exited with code 5" in errors[1], errors


async def test_an_attempt_process_past_its_timeout_is_killed_and_frees_the_runner() -> None:
    store = ag.MemoryStore()
    config = RolloutConfig(timeout_seconds=0.5, max_attempts=1)
    hung = await store.enqueue_rollout({"seconds": 60}, config=config)
    quick = await store.enqueue_rollout({"seconds": 0}, config=ONE_TRY)
    began = asyncio.get_running_loop().time()
    await asyncio.wait_for(Runner(process_agents.hangs, store, max_rollouts=2, isolation="process").run(), 30)
    assert asyncio.get_running_loop().time() - began < 20  # not the 60 s the agent would hang
    (attempt,) = await store.query_attempts(hung.rollout_id)
    assert attempt.status in (AttemptStatus.TIMEOUT, AttemptStatus.FAILED)  # the sweeper may get there first
    assert (await store.get_rollout(hung.rollout_id)).status is RolloutStatus.FAILED
    assert (await store.get_rollout(quick.rollout_id)).status is RolloutStatus.SUCCEEDED
