"""The runner: attempt lifecycle, hooks, concurrency, stopping."""

from __future__ import annotations

import asyncio
import threading

import pytest

import agentgrad as ag
from agentgrad.rollout.runner import Runner
from agentgrad.types import LLM, AttemptStatus, RolloutStatus


async def test_concurrent_async_rollouts_in_one_runner_keep_their_spans_apart() -> None:
    store = ag.MemoryStore()
    in_flight = 0
    most_in_flight = 0

    @ag.rollout
    async def interleaving(task: int) -> None:
        nonlocal in_flight, most_in_flight
        in_flight += 1
        most_in_flight = max(most_in_flight, in_flight)
        for step in range(3):
            with ag.operation(f"step-{step}", task=task):
                await asyncio.sleep(0.01)
            ag.emit_object({"task": task, "step": step})
        in_flight -= 1
        ag.emit_reward(task / 100)

    rollouts = await store.enqueue_rollouts([{"input": i} for i in range(16)])
    runner = Runner(interleaving, store, concurrency=8, max_rollouts=16)
    await runner.run()
    assert most_in_flight > 1  # they really overlapped
    for rollout in rollouts:
        stored = await store.get_rollout(rollout.rollout_id)
        assert stored.status is RolloutStatus.SUCCEEDED and stored.reward == rollout.input / 100
        spans = await store.query_spans(rollout.rollout_id)
        objects = [s.attributes["agentgrad.object.json"] for s in spans if s.name == "agentgrad.object"]
        assert objects == [f'{{"task": {rollout.input}, "step": {s}}}' for s in range(3)]
        operations = [s for s in spans if s.name.startswith("step-")]
        assert all(s.attributes["agentgrad.operation.input"] == f'{{"task": {rollout.input}}}' for s in operations)
        (root,) = [s for s in spans if s.name == "agentgrad.rollout"]
        assert all(s.parent_id == root.span_id for s in spans if s is not root)
        assert len({s.trace_id for s in spans}) == 1


async def test_hooks_run_in_order_around_each_rollout() -> None:
    store = ag.MemoryStore()
    calls: list[tuple[str, str]] = []

    class Recorder(ag.Hook):
        def on_rollout_start(self, *, agent, runner, rollout):  # type: ignore[no-untyped-def]
            calls.append(("rollout_start", rollout.status.value))

        async def on_trace_start(self, *, agent, runner, rollout):  # type: ignore[no-untyped-def]
            calls.append(("trace_start", rollout.rollout_id))

        def on_trace_end(self, *, agent, runner, rollout):  # type: ignore[no-untyped-def]
            calls.append(("trace_end", rollout.rollout_id))

        def on_rollout_end(self, *, agent, runner, rollout):  # type: ignore[no-untyped-def]
            calls.append(("rollout_end", rollout.status.value))

    class Broken(ag.Hook):
        def on_trace_start(self, *, agent, runner, rollout):  # type: ignore[no-untyped-def]
            raise RuntimeError("a broken hook does not break the rollout")

    queued = await store.enqueue_rollout("task")
    await Runner(lambda task: 1.0, store, hooks=[Broken(), Recorder()], max_rollouts=1).run()
    rid = queued.rollout_id
    assert calls == [("rollout_start", "running"), ("trace_start", rid), ("trace_end", rid), ("rollout_end", "succeeded")]


async def test_llm_resources_reach_the_agent_routed_to_its_attempt() -> None:
    store = ag.MemoryStore()
    await store.add_resources({
        "llm": LLM(base_url="http://127.0.0.1:9/v1", model="m", proxied=True),
        "plain": LLM(base_url="http://api.example/v1", model="m"),
    })
    seen: dict[str, str] = {}

    @ag.rollout
    def agent(task: str, llm: LLM, plain: LLM, rollout: ag.Rollout) -> float:
        seen.update(llm=llm.base_url, plain=plain.base_url, rollout=rollout.rollout_id)
        return 1.0

    queued = await store.enqueue_rollout("t")
    await Runner(agent, store, max_rollouts=1).run()
    attempt = (await store.query_attempts(queued.rollout_id))[0]
    assert seen["llm"] == f"http://127.0.0.1:9/rollouts/{queued.rollout_id}/attempts/{attempt.attempt_id}/v1"
    assert seen["plain"] == "http://api.example/v1" and seen["rollout"] == queued.rollout_id


async def test_an_agent_asking_for_a_missing_resource_fails_with_a_clear_error() -> None:
    store = ag.MemoryStore()

    @ag.rollout
    def agent(task: str, llm: LLM) -> float:
        return 1.0

    queued = await store.enqueue_rollout("t")
    await Runner(agent, store, max_rollouts=1).run()
    (attempt,) = await store.query_attempts(queued.rollout_id)
    assert attempt.status is AttemptStatus.FAILED
    assert "asks for llm: LLM, but the resources hold 0 of that type" in (attempt.error or "")


async def test_a_non_numeric_return_is_a_failed_attempt_that_says_what_to_return() -> None:
    store = ag.MemoryStore()
    queued = await store.enqueue_rollout("t")
    await Runner(lambda task: "great", store, max_rollouts=1).run()
    (attempt,) = await store.query_attempts(queued.rollout_id)
    assert attempt.status is AttemptStatus.FAILED and "return a float reward" in (attempt.error or "")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
async def test_a_reward_that_is_not_finite_fails_the_attempt_at_once_saying_so(value: float) -> None:
    store = ag.MemoryStore()
    returned, emitted = await store.enqueue_rollouts([{"input": "t"}, {"input": "t"}])

    def agent(task: str, rollout: ag.Rollout) -> float | None:
        if rollout.rollout_id == emitted.rollout_id:
            ag.emit_reward(value)
            return None
        return value

    await Runner(agent, store, max_rollouts=2, concurrency=2).run()
    for queued, says in ((returned, "which is not finite"), (emitted, "a reward must be a finite number")):
        (attempt,) = await store.query_attempts(queued.rollout_id)
        assert attempt.status is AttemptStatus.FAILED and says in (attempt.error or "")  # not left to go unresponsive
        assert (await store.get_rollout(queued.rollout_id)).status is RolloutStatus.FAILED


async def test_a_result_the_store_refuses_fails_the_attempt_with_the_store_s_reason() -> None:
    class Refusing(ag.MemoryStore):
        async def update_attempt(self, rollout_id, attempt_id, **changes):  # type: ignore[no-untyped-def]
            if changes.get("status") is AttemptStatus.SUCCEEDED:
                raise ag.StoreError("reward refused for a reason of the store's")
            return await super().update_attempt(rollout_id, attempt_id, **changes)

    store = Refusing()
    queued = await store.enqueue_rollout("t")
    await Runner(lambda task: 1.0, store, max_rollouts=1).run()
    (attempt,) = await store.query_attempts(queued.rollout_id)
    assert attempt.status is AttemptStatus.FAILED
    assert attempt.error == "the store refused the attempt's result: reward refused for a reason of the store's"


def test_stop_lets_the_rollouts_in_flight_finish_then_reports_the_worker_stopped() -> None:
    store = ag.MemoryStore()
    started = threading.Event()
    release = threading.Event()

    def slow(task: int) -> float:
        started.set()
        release.wait(10)
        return 1.0

    asyncio.run(store.enqueue_rollouts([{"input": i} for i in range(5)]))
    runner = Runner(slow, store, worker_id="w")
    thread = threading.Thread(target=lambda: asyncio.run(runner.run()))
    thread.start()
    assert started.wait(10)
    runner.stop()
    release.set()
    thread.join(10)
    assert not thread.is_alive()
    stats = asyncio.run(store.stats())
    assert stats.rollouts == {"succeeded": 1, "queuing": 4}
    (worker,) = asyncio.run(store.query_workers())
    assert worker.status.value == "stopped" and worker.active_attempts == []


def test_runner_rejects_a_nonsense_concurrency() -> None:
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        Runner(lambda task: 1.0, ag.MemoryStore(), concurrency=0)


def test_the_runner_reaches_gateways_only_over_http() -> None:
    """Its flush barrier is the gateway's documented endpoint (`semconv.FLUSH_ENDPOINT`), not gateway code."""
    import subprocess
    import sys

    script = "import sys, agentgrad.rollout.runner; print(sorted(m for m in sys.modules if m.startswith('agentgrad.gateway')))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


async def test_a_flush_on_a_kept_alive_connection_the_gateway_just_closed_is_sent_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """The race behind `Server disconnected without sending a response`: the server closes an idle
    connection just as the runner reuses it. A real loopback server plays the gateway, answering the
    first request on each connection and dropping the connection when a second one arrives."""
    answered = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        for request in range(2):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"POST /v1/agentgrad/flush ")
            if request == 1:
                break  # closed with no answer
            answered += 1
            writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 17\r\n\r\n{"flushed":true}\n')
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    runner = Runner(lambda task: 1.0, ag.MemoryStore())
    with caplog.at_level("WARNING", logger="agentgrad.rollout.runner"):
        for _ in range(3):
            await runner.flush_gateways([url])
    await runner._http.aclose()
    server.close()
    assert answered == 3  # the second and third flushes each met a dropped connection and went again
    assert not caplog.records
