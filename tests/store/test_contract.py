"""The store contract: what every backend guarantees, whatever keeps the data."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agentgrad.store import InvalidTransitionError, NotFoundError, Store, StoreError
from agentgrad.types import (
    LLM,
    AttemptStatus,
    Metric,
    PromptTemplate,
    RolloutConfig,
    RolloutStatus,
    Run,
    RunStatus,
    Span,
    WorkerStatus,
)
from tests.helpers import ManualClock


def span(rollout_id: str | None, attempt_id: str | None, name: str = "step", **attributes: object) -> Span:
    return Span(rollout_id=rollout_id, attempt_id=attempt_id, name=name, attributes=attributes)


async def test_rollouts_are_dequeued_first_in_first_out_with_a_new_attempt(store: Store) -> None:
    first = await store.enqueue_rollout({"q": 1}, mode="train")
    second = await store.enqueue_rollout({"q": 2}, mode="val")
    assert first.status is RolloutStatus.QUEUING

    claimed = await store.dequeue_rollout(worker_id="w1")
    assert claimed is not None and claimed.rollout_id == first.rollout_id
    assert claimed.input == {"q": 1} and claimed.status is RolloutStatus.RUNNING
    assert claimed.attempt.sequence == 1 and claimed.attempt.worker_id == "w1"
    assert claimed.attempt.status is AttemptStatus.RUNNING

    assert (await store.dequeue_rollout()).rollout_id == second.rollout_id  # type: ignore[union-attr]
    assert await store.dequeue_rollout() is None
    stored = await store.get_rollout(first.rollout_id)
    assert stored.status is RolloutStatus.RUNNING and stored.latest_attempt_id == claimed.attempt.attempt_id


async def test_batch_enqueue_keeps_order_and_fields(store: Store) -> None:
    rollouts = await store.enqueue_rollouts(
        [{"input": i, "mode": "train", "metadata": {"i": i}} for i in range(5)]
    )
    assert [r.input for r in rollouts] == list(range(5))
    claimed = [await store.dequeue_rollout() for _ in range(5)]
    assert [c.input for c in claimed] == list(range(5))  # type: ignore[union-attr]
    assert claimed[3].metadata == {"i": 3}  # type: ignore[union-attr]


def test_exactly_one_worker_claims_each_rollout_under_16_threads(store: Store) -> None:
    n_rollouts, n_workers = 300, 16
    asyncio.run(store.enqueue_rollouts([{"input": i} for i in range(n_rollouts)]))
    claims: list[list[str]] = [[] for _ in range(n_workers)]
    start = threading.Barrier(n_workers)

    def worker(index: int) -> None:
        async def loop() -> None:
            start.wait()
            while (claimed := await store.dequeue_rollout(worker_id=f"w{index}")) is not None:
                claims[index].append(claimed.rollout_id)
                await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")

        asyncio.run(loop())

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [rid for worker_claims in claims for rid in worker_claims]
    assert len(everything) == n_rollouts and len(set(everything)) == n_rollouts
    stats = asyncio.run(store.stats())
    assert stats.rollouts == {"succeeded": n_rollouts} and stats.attempts == {"succeeded": n_rollouts}


async def test_start_rollout_runs_at_once_without_the_queue(store: Store) -> None:
    started = await store.start_rollout({"x": 1}, mode="dev", worker_id="me")
    assert started.status is RolloutStatus.RUNNING and started.attempt.worker_id == "me"
    assert await store.dequeue_rollout() is None
    await store.update_attempt(started.rollout_id, started.attempt.attempt_id, status="succeeded", reward=0.5)
    assert (await store.get_rollout(started.rollout_id)).reward == 0.5


async def test_a_failed_attempt_is_retried_until_max_attempts(store: Store) -> None:
    rollout = await store.enqueue_rollout("t", config=RolloutConfig(max_attempts=2))
    first = await store.dequeue_rollout()
    await store.update_attempt(rollout.rollout_id, first.attempt.attempt_id, status="failed", error="boom")  # type: ignore[union-attr]
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.REQUEUING

    second = await store.dequeue_rollout()
    assert second is not None and second.rollout_id == rollout.rollout_id and second.attempt.sequence == 2
    await store.update_attempt(rollout.rollout_id, second.attempt.attempt_id, status="failed")
    final = await store.get_rollout(rollout.rollout_id)
    assert final.status is RolloutStatus.FAILED and final.num_attempts == 2 and final.end_time is not None
    assert await store.dequeue_rollout() is None
    attempts = await store.query_attempts(rollout.rollout_id)
    assert [a.status for a in attempts] == [AttemptStatus.FAILED, AttemptStatus.FAILED]
    assert attempts[0].error == "boom"


async def test_retry_on_decides_which_outcomes_are_retried(store: Store) -> None:
    config = RolloutConfig(max_attempts=3, retry_on=[AttemptStatus.TIMEOUT])
    rollout = await store.enqueue_rollout("t", config=config)
    claimed = await store.dequeue_rollout()
    await store.update_attempt(rollout.rollout_id, claimed.attempt.attempt_id, status="failed")  # type: ignore[union-attr]
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.FAILED


async def test_an_attempt_past_its_timeout_is_marked_and_the_rollout_requeued(store: Store, clock: ManualClock) -> None:
    rollout = await store.enqueue_rollout("t", config=RolloutConfig(timeout_seconds=10, max_attempts=2))
    first = await store.dequeue_rollout()
    clock.advance(10)  # exactly the timeout: not past it yet
    await store.check_attempts(force=True)
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.RUNNING

    clock.advance(0.001)
    await store.check_attempts(force=True)
    (timed_out,) = await store.query_attempts(rollout.rollout_id)
    assert timed_out.status is AttemptStatus.TIMEOUT and timed_out.end_time == clock.now
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.REQUEUING

    # the late worker cannot complete the attempt it lost
    with pytest.raises(InvalidTransitionError, match="already timeout"):
        await store.update_attempt(rollout.rollout_id, first.attempt.attempt_id, status="succeeded")  # type: ignore[union-attr]

    second = await store.dequeue_rollout()
    assert second is not None and second.attempt.sequence == 2 and second.attempt.start_time == clock.now
    clock.advance(10.001)
    await store.check_attempts(force=True)
    final = await store.get_rollout(rollout.rollout_id)
    assert final.status is RolloutStatus.FAILED and final.num_attempts == 2  # max_attempts respected
    assert final.end_time == clock.now


async def test_spans_and_heartbeats_keep_an_attempt_alive_silence_does_not(store: Store, clock: ManualClock) -> None:
    config = RolloutConfig(unresponsive_seconds=10, max_attempts=2)
    rollout = await store.enqueue_rollout("t", config=config)
    claimed = await store.dequeue_rollout(worker_id="w")
    assert claimed is not None
    for _ in range(3):
        clock.advance(9)
        await store.add_span(span(rollout.rollout_id, claimed.attempt.attempt_id))
        await store.check_attempts(force=True)
    clock.advance(9)
    await store.heartbeat("w", active_attempts=[(rollout.rollout_id, claimed.attempt.attempt_id)])
    clock.advance(10)  # 10 s since the heartbeat: not more than the limit
    await store.check_attempts(force=True)
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.RUNNING

    clock.advance(0.001)
    await store.check_attempts(force=True)
    attempts = await store.query_attempts(rollout.rollout_id)
    assert attempts[0].status is AttemptStatus.UNRESPONSIVE
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.REQUEUING


async def test_the_health_check_runs_by_itself_at_most_every_half_second(store: Store, clock: ManualClock) -> None:
    rollout = await store.enqueue_rollout("t", config=RolloutConfig(timeout_seconds=0.2))
    await store.dequeue_rollout()  # scans first, finding nothing
    clock.advance(0.3)  # past the timeout, but the last scan was under half a second ago
    await store.check_attempts()
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.RUNNING
    clock.advance(0.2)
    await store.check_attempts()
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.FAILED


async def test_a_stuck_attempt_is_timed_out_on_time_with_no_one_asking_the_store(store: Store, clock: ManualClock) -> None:
    """Every runner is stuck: no dequeue, no wait, no check. The store's own sweeper ends the attempt once its
    clock passes the timeout, and the rollout is requeued, then failed, by its retry policy."""
    rollout = await store.enqueue_rollout("t", config=RolloutConfig(timeout_seconds=5, max_attempts=2))
    first = await store.dequeue_rollout(worker_id="stuck")
    assert first is not None

    async def status_after(seconds: float) -> RolloutStatus:
        clock.advance(seconds)  # only reads from here on: get_rollout looks at no attempt's time
        for _ in range(200):  # the sweeper looks every half second of wall time
            status = (await store.get_rollout(rollout.rollout_id)).status
            if status is not RolloutStatus.RUNNING:
                return status
            await asyncio.sleep(0.02)
        return status

    assert await status_after(5.6) is RolloutStatus.REQUEUING
    (timed_out,) = await store.query_attempts(rollout.rollout_id)
    assert timed_out.status is AttemptStatus.TIMEOUT and timed_out.end_time == clock.now
    second = await store.dequeue_rollout(worker_id="stuck-too")
    assert second is not None and second.attempt.sequence == 2
    assert await status_after(5.6) is RolloutStatus.FAILED  # max_attempts spent


async def test_a_dead_runners_rollout_runs_again_under_the_default_config(store: Store, clock: ManualClock) -> None:
    from agentgrad.rollout.runner import HEARTBEAT_SECONDS

    default = RolloutConfig()
    assert default.unresponsive_seconds is not None and default.unresponsive_seconds >= 10 * HEARTBEAT_SECONDS
    rollout = await store.enqueue_rollout("t")  # the default config
    lost = await store.dequeue_rollout(worker_id="killed")
    assert lost is not None
    clock.advance(default.unresponsive_seconds + 1)  # the runner died: no span, no heartbeat
    await store.check_attempts(force=True)
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.REQUEUING
    again = await store.dequeue_rollout(worker_id="alive")
    assert again is not None and again.rollout_id == rollout.rollout_id and again.attempt.sequence == 2
    await store.update_attempt(rollout.rollout_id, again.attempt.attempt_id, status="succeeded", reward=1)
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.SUCCEEDED

    failing = await store.start_rollout("t")  # an agent's own failure is not retried by default
    await store.update_attempt(failing.rollout_id, failing.attempt.attempt_id, status="failed")
    assert (await store.get_rollout(failing.rollout_id)).status is RolloutStatus.FAILED


async def test_a_lost_runner_is_retried_up_to_max_attempts_if_lost(store: Store, clock: ManualClock) -> None:
    rollout = await store.enqueue_rollout("t", config=RolloutConfig(unresponsive_seconds=5, max_attempts_if_lost=2))
    for _ in range(2):
        assert await store.dequeue_rollout() is not None
        clock.advance(6)
        await store.check_attempts(force=True)
    final = await store.get_rollout(rollout.rollout_id)
    assert final.status is RolloutStatus.FAILED and final.num_attempts == 2


async def test_records_are_stamped_by_the_stores_clock(store: Store, clock: ManualClock) -> None:
    queued = await store.enqueue_rollout("t")
    assert queued.enqueue_time == clock.now
    clock.advance(3)
    claimed = await store.dequeue_rollout(worker_id="w")
    assert claimed is not None and claimed.start_time == claimed.attempt.start_time == clock.now
    clock.advance(2)
    worker = await store.heartbeat("w")
    assert worker.last_heartbeat_time == clock.now
    await store.update_attempt(queued.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    assert (await store.get_rollout(queued.rollout_id)).end_time == clock.now
    assert (await store.add_resources({"p": PromptTemplate(template="x")})).create_time == clock.now


async def test_spans_come_back_in_sequence_order_per_attempt(store: Store) -> None:
    rollout = await store.enqueue_rollout("t", config=RolloutConfig(max_attempts=2))
    first = await store.dequeue_rollout()
    assert first is not None
    stored = await store.add_spans([span(rollout.rollout_id, first.attempt.attempt_id, f"s{i}") for i in range(5)])
    assert [s.sequence_id for s in stored] == [1, 2, 3, 4, 5]
    await store.add_span(span(rollout.rollout_id, first.attempt.attempt_id, "s5"))
    await store.update_attempt(rollout.rollout_id, first.attempt.attempt_id, status="failed")
    second = await store.dequeue_rollout()
    assert second is not None
    await store.add_span(span(rollout.rollout_id, second.attempt.attempt_id, "retry"))

    latest = await store.query_spans(rollout.rollout_id)
    assert [s.name for s in latest] == ["retry"] and latest[0].sequence_id == 7
    of_first = await store.query_spans(rollout.rollout_id, first.attempt.attempt_id)
    assert [s.name for s in of_first] == [f"s{i}" for i in range(6)]
    everything = await store.query_spans(rollout.rollout_id, all_attempts=True)
    assert [s.sequence_id for s in everything] == list(range(1, 8))


async def test_spans_of_many_rollouts_are_read_at_once_each_of_its_latest_attempt(store: Store) -> None:
    retried = await store.enqueue_rollout("t", config=RolloutConfig(max_attempts=2))
    first = await store.dequeue_rollout()
    assert first is not None
    await store.add_span(span(retried.rollout_id, first.attempt.attempt_id, "lost"))
    await store.update_attempt(retried.rollout_id, first.attempt.attempt_id, status="failed")
    second = await store.dequeue_rollout()
    assert second is not None
    await store.add_spans([span(retried.rollout_id, second.attempt.attempt_id, f"r{i}") for i in range(3)])
    other, silent = await store.start_rollout("o"), await store.enqueue_rollout("never started")
    await store.add_spans([span(other.rollout_id, other.attempt.attempt_id, "o1"), span(None, None, "free")])

    read = await store.query_spans_of([other.rollout_id, retried.rollout_id, silent.rollout_id])
    assert list(read) == [other.rollout_id, retried.rollout_id, silent.rollout_id]
    assert [s.name for s in read[retried.rollout_id]] == ["r0", "r1", "r2"]
    assert [s.name for s in read[other.rollout_id]] == ["o1"] and read[silent.rollout_id] == []
    assert read[retried.rollout_id] == await store.query_spans(retried.rollout_id)
    assert await store.query_spans_of([]) == {}
    with pytest.raises(NotFoundError, match="ro-nope"):
        await store.query_spans_of([other.rollout_id, "ro-nope"])


async def test_a_span_written_again_is_stored_once_as_a_retried_write_needs(store: Store) -> None:
    started = await store.start_rollout("t")
    rid, aid = started.rollout_id, started.attempt.attempt_id
    first = await store.add_spans([Span(rollout_id=rid, attempt_id=aid, span_id=f"{i:016x}", name=f"s{i}") for i in range(3)])
    again = await store.add_spans(
        [Span(rollout_id=rid, attempt_id=aid, span_id=f"{i:016x}", name=f"s{i}") for i in (1, 3, 3)]
        + [span(rid, aid, "anonymous"), span(rid, aid, "anonymous")]  # no span id: never taken for a repeat
    )
    assert [s.sequence_id for s in first] == [1, 2, 3]
    assert [s.sequence_id for s in again] == [2, 4, 4, 5, 6]
    assert [s.name for s in await store.query_spans(rid)] == ["s0", "s1", "s2", "s3", "anonymous", "anonymous"]
    assert (await store.stats()).spans == 6


async def test_spans_of_several_rollouts_in_one_batch_come_back_in_the_order_given(store: Store) -> None:
    a, b = await store.start_rollout("a"), await store.start_rollout("b")
    stored = await store.add_spans([span(a.rollout_id, a.attempt.attempt_id, "a1"), span(b.rollout_id, b.attempt.attempt_id, "b1"),
                                    span(None, None, "free"), span(a.rollout_id, a.attempt.attempt_id, "a2")])
    assert [(s.name, s.sequence_id) for s in stored] == [("a1", 1), ("b1", 1), ("free", 1), ("a2", 2)]


async def test_span_attributes_round_trip(store: Store) -> None:
    started = await store.start_rollout("t")
    original = Span(
        rollout_id=started.rollout_id,
        attempt_id=started.attempt.attempt_id,
        trace_id="a" * 32,
        span_id="b" * 16,
        parent_id="c" * 16,
        name="llm",
        start_time=1.5,
        end_time=2.5,
        attributes={"gen_ai.usage.input_tokens": 7, "agentgrad.llm.prompt_token_ids": [1, 2, 3], "x": {"y": None}},
        events=[{"name": "e", "time": 2.0, "attributes": {"k": "v"}}],
        status={"code": "ERROR", "description": "bad"},
    )
    await store.add_span(original)
    (read,) = await store.query_spans(started.rollout_id)
    assert read.model_dump(exclude={"sequence_id"}) == original.model_dump(exclude={"sequence_id"})


async def test_spans_outside_any_rollout_are_kept_apart(store: Store) -> None:
    await store.add_spans([span(None, None, "a"), span(None, None, "b")])
    started = await store.start_rollout("t")
    await store.add_span(span(started.rollout_id, started.attempt.attempt_id, "inside"))
    assert [s.name for s in await store.query_spans(None)] == ["a", "b"]
    assert [s.name for s in await store.query_spans(started.rollout_id)] == ["inside"]


async def test_spans_for_unknown_attempts_are_refused_and_nothing_is_stored(store: Store) -> None:
    started = await store.start_rollout("t")
    good = span(started.rollout_id, started.attempt.attempt_id, "good")
    with pytest.raises(NotFoundError, match="at-nope"):
        await store.add_spans([good, span(started.rollout_id, "at-nope")])
    with pytest.raises(NotFoundError, match="ro-nope"):
        await store.add_span(span("ro-nope", "at-nope"))
    with pytest.raises(StoreError, match="attempt_id"):
        await store.add_span(span(started.rollout_id, None))
    assert await store.query_spans(started.rollout_id) == []


async def test_the_final_reward_is_stored_with_the_rollout(store: Store) -> None:
    explicit = await store.start_rollout("t")
    await store.update_attempt(explicit.rollout_id, explicit.attempt.attempt_id, status="succeeded", reward=0.75)

    emitted = await store.start_rollout("t")
    for value in (0.1, 0.9):
        await store.add_span(span(emitted.rollout_id, emitted.attempt.attempt_id, "agentgrad.reward", **{"agentgrad.reward": value}))
    await store.update_attempt(emitted.rollout_id, emitted.attempt.attempt_id, status="succeeded")

    silent = await store.start_rollout("t")
    await store.update_attempt(silent.rollout_id, silent.attempt.attempt_id, status="succeeded")

    assert (await store.get_rollout(explicit.rollout_id)).reward == 0.75
    assert (await store.get_rollout(emitted.rollout_id)).reward == 0.9
    assert (await store.get_rollout(silent.rollout_id)).reward is None


async def test_invalid_transitions_and_unknown_ids_raise_clear_errors(store: Store) -> None:
    started = await store.start_rollout("t")
    rid, aid = started.rollout_id, started.attempt.attempt_id
    with pytest.raises(InvalidTransitionError, match="only 'cancelled'"):
        await store.update_rollout(rid, status="succeeded")
    with pytest.raises(InvalidTransitionError, match="already running"):
        await store.update_attempt(rid, aid, status="running")
    await store.update_attempt(rid, aid, status="succeeded", reward=1.0)
    with pytest.raises(InvalidTransitionError, match="already succeeded"):
        await store.update_attempt(rid, aid, status="failed")
    with pytest.raises(InvalidTransitionError, match="already succeeded"):
        await store.update_rollout(rid, status="cancelled")
    with pytest.raises(NotFoundError, match="ro-missing"):
        await store.get_rollout("ro-missing")
    with pytest.raises(NotFoundError, match="at-missing"):
        await store.update_attempt(rid, "at-missing", status="failed")
    with pytest.raises(NotFoundError, match="ro-missing"):
        await store.query_attempts("ro-missing")
    with pytest.raises(NotFoundError, match="res-99"):
        await store.get_resources("res-99")
    with pytest.raises(ValueError):
        await store.update_attempt(rid, aid, status="exploded")
    assert (await store.get_rollout(rid)).reward == 1.0  # nothing was changed by the bad calls


async def test_a_cancelled_rollout_is_never_dequeued_and_keeps_its_status(store: Store) -> None:
    queued = await store.enqueue_rollout("q")
    await store.update_rollout(queued.rollout_id, status="cancelled", metadata={"why": "test"})
    assert await store.dequeue_rollout() is None
    running = await store.start_rollout("r")
    await store.update_rollout(running.rollout_id, status="cancelled")
    await store.update_attempt(running.rollout_id, running.attempt.attempt_id, status="succeeded")
    assert (await store.get_rollout(running.rollout_id)).status is RolloutStatus.CANCELLED
    assert (await store.get_rollout(queued.rollout_id)).metadata == {"why": "test"}


async def test_query_rollouts_filters_and_paginates(store: Store) -> None:
    rollouts = await store.enqueue_rollouts([{"input": i, "mode": "train" if i % 2 else "val"} for i in range(10)])
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    train = await store.query_rollouts(mode="train")
    assert [r.input for r in train] == [1, 3, 5, 7, 9]
    page = await store.query_rollouts(limit=3, offset=2)
    assert [r.input for r in page] == [2, 3, 4]
    running = await store.query_rollouts(status=["running"])
    assert [r.rollout_id for r in running] == [rollouts[0].rollout_id]
    some = await store.query_rollouts(rollout_ids=[rollouts[5].rollout_id, rollouts[2].rollout_id, "ro-unknown"])
    assert sorted(r.input for r in some) == [2, 5]
    assert await store.query_rollouts(rollout_ids=[]) == []


async def test_wait_for_rollouts_returns_as_soon_as_the_last_one_finishes(store: Store) -> None:
    started = [await store.start_rollout(i) for i in range(3)]

    async def finish_later() -> None:
        for item in started:
            await asyncio.sleep(0.1)
            await store.update_attempt(item.rollout_id, item.attempt.attempt_id, status="succeeded", reward=1)

    finisher = asyncio.create_task(finish_later())
    began = time.perf_counter()
    done = await store.wait_for_rollouts([s.rollout_id for s in started], timeout=10)
    elapsed = time.perf_counter() - began
    await finisher
    assert [r.rollout_id for r in done] == [s.rollout_id for s in started]
    assert all(r.status is RolloutStatus.SUCCEEDED for r in done)
    assert elapsed < 1.0


async def test_wait_for_rollouts_gives_up_after_its_timeout_with_what_finished(store: Store, clock: ManualClock) -> None:
    finished = await store.start_rollout("a")
    pending = await store.start_rollout("b")
    await store.update_attempt(finished.rollout_id, finished.attempt.attempt_id, status="succeeded")
    waiting = asyncio.ensure_future(store.wait_for_rollouts([finished.rollout_id, pending.rollout_id], timeout=10))
    for step in (0, 9.999):  # the store's clock has not reached the timeout: still waiting
        clock.advance(step)
        assert not (await asyncio.wait({waiting}, timeout=0.2))[0]
    clock.advance(0.001)
    done = await asyncio.wait_for(waiting, timeout=10)
    assert [r.rollout_id for r in done] == [finished.rollout_id]


async def test_resources_are_versioned_and_the_newest_is_latest(store: Store) -> None:
    assert await store.get_latest_resources() is None
    first = await store.add_resources({"llm": LLM(base_url="http://x/v1", model="m")})
    second = await store.add_resources(
        {"prompt": PromptTemplate(template="Hi {name}"), "llm": LLM(base_url="http://y/v1", model="m2")},
        metadata={"parent": first.resources_id},
    )
    assert (first.version, second.version) == (1, 2)
    latest = await store.get_latest_resources()
    assert latest is not None and latest.resources_id == second.resources_id
    assert isinstance(latest.resources["prompt"], PromptTemplate)
    assert (await store.get_resources(first.resources_id)).resources["llm"].base_url == "http://x/v1"  # type: ignore[union-attr]
    updated = await store.update_resources(second.resources_id, {"score": 0.8})
    assert updated.metadata == {"parent": first.resources_id, "score": 0.8}
    assert [s.metadata.get("score") for s in await store.query_resources()] == [None, 0.8]


async def test_workers_report_heartbeats(store: Store) -> None:
    started = await store.start_rollout("t", worker_id="w1")
    await store.heartbeat("w1", status="busy", active_attempts=[(started.rollout_id, started.attempt.attempt_id)], info={"pid": 1})
    await store.heartbeat("w2", status=WorkerStatus.IDLE)
    workers = {w.worker_id: w for w in await store.query_workers()}
    assert workers["w1"].status is WorkerStatus.BUSY and workers["w1"].active_attempts == [started.attempt.attempt_id]
    assert workers["w1"].info == {"pid": 1} and workers["w2"].status is WorkerStatus.IDLE
    with pytest.raises(NotFoundError):
        await store.heartbeat("w1", active_attempts=[(started.rollout_id, "at-unknown")])


async def test_metrics_are_kept_by_name_and_step(store: Store) -> None:
    await store.add_metrics([Metric(name="train/reward_mean", step=s, value=s / 10) for s in (2, 0, 1)])
    await store.add_metrics([Metric(name="val/accuracy", step=0, value=0.5)])
    assert [m.value for m in await store.query_metrics("train/reward_mean")] == [0.0, 0.1, 0.2]
    assert [m.name for m in await store.query_metrics(prefix="val/")] == ["val/accuracy"]
    assert len(await store.query_metrics()) == 4


async def test_metrics_of_one_run_are_read_apart_from_the_others(store: Store) -> None:
    await store.add_metrics([Metric(name="val/accuracy", step=0, value=0.1, run_id="run-a")])
    await store.add_metrics([Metric(name="val/accuracy", step=0, value=0.7, run_id="run-b")])
    await store.add_metrics([Metric(name="val/accuracy", step=1, value=0.2, run_id="run-a")])
    assert [(m.step, m.value) for m in await store.query_metrics("val/accuracy", run_id="run-a")] == [(0, 0.1), (1, 0.2)]
    assert [m.run_id for m in await store.query_metrics(prefix="val/", run_id="run-b")] == ["run-b"]
    assert len(await store.query_metrics("val/accuracy")) == 3


async def test_the_latest_metrics_are_the_newest_point_of_each_curve_by_time(store: Store) -> None:
    await store.add_metrics([Metric(name="train/loss", step=s, value=1 - s / 10, time=100 + s, run_id="a") for s in (0, 2, 1)])
    await store.add_metrics([Metric(name="train/loss", step=0, value=0.9, time=200, run_id="b")])  # a newer run
    await store.add_metrics([Metric(name="val/accuracy", step=4, value=0.5, time=150, run_id="a")])
    latest = {m.name: (m.step, m.value, m.run_id) for m in await store.latest_metrics()}
    assert latest == {"train/loss": (0, 0.9, "b"), "val/accuracy": (4, 0.5, "a")}


async def test_stats_count_every_return_of_a_rollout_to_the_queue(store: Store, clock: ManualClock) -> None:
    await store.enqueue_rollout("t", config=RolloutConfig(timeout_seconds=10, max_attempts=3))
    assert (await store.stats()).requeues == 0
    counts = []
    for _ in range(3):
        await store.dequeue_rollout()
        counts.append((await store.stats()).requeues)
        clock.advance(10.001)
        await store.check_attempts(force=True)
        counts.append((await store.stats()).requeues)
    assert counts == [0, 1, 1, 2, 2, 2]  # the third timeout fails the rollout: no requeue
    await store.enqueue_rollout("never claimed")
    assert (await store.stats()).requeues == 2


async def test_a_run_is_recorded_replaced_by_id_and_listed_by_start_time(store: Store) -> None:
    later = Run(run_id="r2", name="second", algorithm="GRPO", start_time=200.0, config={"steps": 3}, seed=1)
    first = Run(run_id="r1", name="first", algorithm="Baseline", start_time=100.0, versions={"python": "3.11.9"})
    await store.put_run(later)
    await store.put_run(first)
    done = later.model_copy(update={"status": RunStatus.SUCCEEDED, "end_time": 260.0, "final": {"val/accuracy": 0.5}})
    assert (await store.put_run(done)).status is RunStatus.SUCCEEDED
    assert [r.run_id for r in await store.query_runs()] == ["r1", "r2"]
    got = await store.get_run("r2")
    assert got == done and got.config == {"steps": 3} and got.seed == 1
    assert (await store.get_run("r1")).versions == {"python": "3.11.9"}
    with pytest.raises(NotFoundError, match="no run with id 'nope'"):
        await store.get_run("nope")


async def test_stats_count_by_status(store: Store) -> None:
    await store.enqueue_rollouts([{"input": i} for i in range(3)])
    claimed = await store.dequeue_rollout()
    assert claimed is not None
    await store.add_span(span(claimed.rollout_id, claimed.attempt.attempt_id))
    await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    stats = await store.stats()
    assert stats.rollouts == {"queuing": 2, "succeeded": 1}
    assert stats.attempts == {"succeeded": 1} and stats.spans == 1


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
async def test_a_reward_that_is_not_a_finite_number_is_refused_and_changes_nothing(store: Store, bad: float) -> None:
    started = await store.start_rollout("t")
    rid, aid = started.rollout_id, started.attempt.attempt_id
    with pytest.raises(StoreError, match="not a finite number"):
        await store.update_attempt(rid, aid, status="succeeded", reward=bad)
    with pytest.raises(StoreError, match="not a finite number"):
        await store.add_span(span(rid, aid, "agentgrad.reward", **{"agentgrad.reward": bad}))
    assert (await store.get_rollout(rid)).status is RolloutStatus.RUNNING
    assert await store.query_spans(rid) == []
    (attempt,) = await store.query_attempts(rid)
    assert attempt.status is AttemptStatus.RUNNING and attempt.reward is None


async def test_a_number_json_cannot_carry_in_an_input_or_metadata_is_refused_naming_the_field(store: Store) -> None:
    """NaN and infinities would come back as null over HTTP: every backend refuses them, saying where."""
    nan, inf = float("nan"), float("inf")
    with pytest.raises(StoreError, match=r"request 1's input\['scores'\]\[1\] is nan, not a finite number"):
        await store.enqueue_rollouts([{"input": 1}, {"input": {"scores": [0.5, nan]}}])
    with pytest.raises(StoreError, match=r"metadata\['weight'\] is inf, not a finite number"):
        await store.start_rollout("t", metadata={"weight": inf})
    with pytest.raises(StoreError, match=r"input is -inf"):
        await store.start_rollout(-inf)
    kept = await store.enqueue_rollout("t", metadata={"ok": 1.5})
    with pytest.raises(StoreError, match=r"metadata of rollout .*\['bad'\] is nan"):
        await store.update_rollout(kept.rollout_id, metadata={"bad": nan})
    with pytest.raises(StoreError, match=r"request 0's input is .*object.*which JSON cannot hold"):
        await store.enqueue_rollouts([{"input": object()}])
    assert [r.metadata for r in await store.query_rollouts()] == [{"ok": 1.5}]  # nothing else was stored


async def test_every_backend_words_its_errors_the_same(store: Store) -> None:
    started = await store.start_rollout("t")
    rid, aid = started.rollout_id, started.attempt.attempt_id
    expected = [
        (store.get_rollout("ro-x"), NotFoundError, "no rollout with id 'ro-x'"),
        (store.query_attempts("ro-x"), NotFoundError, "no rollout with id 'ro-x'"),
        (store.update_attempt(rid, "at-x", status="failed"), NotFoundError, f"rollout '{rid}' has no attempt 'at-x'"),
        (store.update_attempt("ro-x", "at-x", status="failed"), NotFoundError, "no rollout with id 'ro-x'"),
        (store.add_span(span(rid, "at-x")), NotFoundError, f"rollout '{rid}' has no attempt 'at-x'"),
        (store.add_span(span(rid, None, "lonely")), StoreError, f"span 'lonely' names rollout '{rid}' but no attempt_id"),
        (store.heartbeat("w", active_attempts=[(rid, "at-x")]), NotFoundError, f"rollout '{rid}' has no attempt 'at-x'"),
        (store.query_spans(rid, "at-x"), NotFoundError, f"rollout '{rid}' has no attempt 'at-x'"),
        (store.get_resources("res-9"), NotFoundError, "no resources with id 'res-9'"),
        (store.update_resources("res-9", {}), NotFoundError, "no resources with id 'res-9'"),
        (store.update_rollout(rid, status="failed"), InvalidTransitionError,
         "a rollout's status follows its attempts; only 'cancelled' can be set directly, not 'failed'"),
        (store.update_attempt(rid, aid, status="running"), InvalidTransitionError, f"attempt {aid} is already running"),
    ]
    for call, kind, message in expected:
        with pytest.raises(kind) as caught:
            await call
        assert type(caught.value) is kind and str(caught.value) == message
    await store.update_attempt(rid, aid, status="succeeded")
    with pytest.raises(InvalidTransitionError) as caught:
        await store.update_attempt(rid, aid, status="failed")
    assert str(caught.value) == f"attempt {aid} of rollout {rid} is already succeeded; it cannot become failed"
    with pytest.raises(InvalidTransitionError) as caught:
        await store.update_rollout(rid, status="cancelled")
    assert str(caught.value) == f"rollout {rid} is already succeeded"
