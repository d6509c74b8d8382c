"""Asynchronous GRPO's scheduling: rollouts queued ahead, the staleness bound, importance weights, resume.

The pipeline runs on a real store; the test plays the runner through the store's own API (claim a
rollout, record one model call naming the weights version serving it, succeed), and the "update"
is the version moving on, so the order of events is the test's to decide.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from agentgrad import semconv as sc
from agentgrad.adapters import Trajectory
from agentgrad.algorithms.async_rollouts import RolloutPipeline, StepRollouts, fresh_groups
from agentgrad.algorithms.base import Algorithm, RunContext
from agentgrad.algorithms.grpo import GRPOConfig
from agentgrad.algorithms.grpo_update import grpo_update, tis_weights
from agentgrad.algorithms.sampling import TaskSampler
from agentgrad.algorithms.sft import SFTConfig
from agentgrad.engine.training import ScoredSequence, sequence_logprobs
from agentgrad.policy.base import still_running
from agentgrad.policy.config import PolicyConfig
from agentgrad.store import MemoryStore, SqliteStore, Store
from agentgrad.types import RolloutConfig, Span

PROMPTS, GROUP = 2, 3
TASKS = [{"question": f"q{i}"} for i in range(10)]


class Queueing(Algorithm[None]):
    """The algorithm side of a pipeline, bound to a store."""

    def __init__(self, store: Store) -> None:
        self.bind(RunContext(store=store))


def pipeline(store: Store, lookahead: int, max_staleness: int | None, steps: int = 4, **kwargs: Any) -> RolloutPipeline:
    skip = kwargs.pop("skip", 0)
    return RolloutPipeline(
        Queueing(store),
        TASKS,
        TaskSampler(len(TASKS), seed=5, skip=skip * PROMPTS),
        prompts_per_step=PROMPTS,
        group_size=GROUP,
        lookahead=lookahead,
        last_step=steps,
        resources_id="r",
        config=RolloutConfig(),
        max_staleness=max_staleness,
        **kwargs,
    )


async def serve(store: Store, version: Callable[[], int], served: list[str]) -> None:
    """A runner: every queued rollout makes one model call on the weights of `version()`, then succeeds."""
    while True:
        claimed = await store.dequeue_rollout("w")
        if claimed is None:
            await asyncio.sleep(0.005)  # poll the queue, as a runner does
            continue
        attributes = {sc.GEN_AI_OPERATION: sc.CHAT, sc.WEIGHTS_VERSION: version()}
        await store.add_span(
            Span(
                rollout_id=claimed.rollout_id, attempt_id=claimed.attempt.attempt_id, name="chat", attributes=attributes
            )
        )
        reward = float(len(served) % 2)  # rewards differ within each group
        await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded", reward=reward)
        served.append(claimed.rollout_id)


async def train(
    pipe: RolloutPipeline, store: Store, steps: range, queued_ahead: list[int], after_publish: list[int] | None = None
) -> list[StepRollouts]:
    """The loop of GRPO with the update reduced to its effect: one new weights version per step; `after_publish`
    gets the rollouts queued past each step once its weights are published (what validation overlaps)."""
    version = [0]
    served: list[str] = []
    runner = asyncio.create_task(serve(store, lambda: version[0], served))
    collected = []
    try:
        for step in steps:
            collected.append(await pipe.collect(step, version[0]))
            queued_ahead.append(len(await store.query_rollouts(mode="train")) - step * PROMPTS * GROUP)
            while await store.query_rollouts(status=["queuing", "running"]):  # the update, long enough for the
                await asyncio.sleep(0.005)  # rollouts queued ahead to run meanwhile
            version[0] += 1
            await pipe.published(step)
            if after_publish is not None:
                after_publish.append(len(await store.query_rollouts(mode="train")) - step * PROMPTS * GROUP)
    finally:
        runner.cancel()
    return collected


def inputs(step: StepRollouts) -> list[Any]:
    return [r.input for r in step.rollouts]


def test_max_staleness_0_queues_and_trains_exactly_the_synchronous_batches() -> None:
    store_sync, store_async = MemoryStore(), MemoryStore()
    ahead_sync: list[int] = []
    ahead_async: list[int] = []
    synchronous = asyncio.run(train(pipeline(store_sync, 0, None), store_sync, range(1, 5), ahead_sync))
    asynchronous = asyncio.run(train(pipeline(store_async, 0, 0), store_async, range(1, 5), ahead_async))
    assert ahead_sync == ahead_async == [0, 0, 0, 0]  # nothing queued before the previous update ended
    order = TaskSampler(len(TASKS), seed=5).take(4 * PROMPTS)
    for k, (a, b) in enumerate(zip(synchronous, asynchronous)):
        expected = [TASKS[i] for i in order[k * PROMPTS : (k + 1) * PROMPTS] for _ in range(GROUP)]
        assert inputs(a) == inputs(b) == expected
        assert a.groups == b.groups == [g for g in range(PROMPTS) for _ in range(GROUP)]
        assert b.trained[0] == b.rollouts and b.fresh is not None and b.fresh.dropped == 0
        assert b.fresh.staleness == [0] * PROMPTS  # each batch sampled by the weights it trains
        assert [r.metadata["step"] for r in b.rollouts] == [k + 1] * PROMPTS * GROUP


def test_max_staleness_1_runs_the_next_step_during_the_update_and_trains_nothing_older() -> None:
    store = MemoryStore()
    ahead: list[int] = []
    steps = asyncio.run(train(pipeline(store, 1, 1), store, range(1, 5), ahead))
    assert ahead == [PROMPTS * GROUP] * 3 + [0]  # step s+1 queued before step s's update (none past the last)
    lags = [lag for s in steps for lag in s.fresh.staleness]  # type: ignore[union-attr]
    assert max(lags) == 1 and lags.count(1) == 3 * PROMPTS  # steps 2-4 ran during the previous update
    for step in steps:
        assert step.fresh is not None and step.fresh.dropped == 0 and step.fresh.mixed == 0
        assert step.metrics()["async/staleness_max"] <= 1
    for rollout in asyncio.run(store.query_rollouts(mode="train")):  # every attempt's calls: one version
        versions = [sc.weights_version(s) for s in asyncio.run(store.query_spans(rollout.rollout_id))]
        assert len(set(versions)) == 1 and versions[0] is not None


def test_the_step_after_next_is_queued_once_an_update_is_published_and_never_when_synchronous() -> None:
    store, sync_store = MemoryStore(), MemoryStore()
    ahead: list[int] = []
    after_publish: list[int] = []
    steps = asyncio.run(train(pipeline(store, 1, 1), store, range(1, 5), ahead, after_publish))
    assert after_publish == [2 * PROMPTS * GROUP, 2 * PROMPTS * GROUP, PROMPTS * GROUP, 0]  # s+1 and s+2, to the last
    assert all(s.fresh is not None and s.fresh.dropped == 0 and max(s.fresh.staleness) <= 1 for s in steps)
    assert [r.metadata["step"] for r in asyncio.run(store.query_rollouts(mode="train"))] == [
        step for step in range(1, 5) for _ in range(PROMPTS * GROUP)
    ]  # each step queued once, in order
    sync_after: list[int] = []
    asyncio.run(train(pipeline(sync_store, 0, 0), sync_store, range(1, 5), [], sync_after))
    assert sync_after == [0, 0, 0, 0]  # max_staleness=0: the next step is queued when it begins, not before


def call(store: Store, version: int) -> str:
    """A finished rollout whose one model call the weights of `version` sampled."""

    async def make() -> str:
        claimed = await store.start_rollout({"q": version}, mode="train")
        await store.add_span(
            Span(
                rollout_id=claimed.rollout_id,
                attempt_id=claimed.attempt.attempt_id,
                name="chat",
                attributes={sc.GEN_AI_OPERATION: sc.CHAT, sc.WEIGHTS_VERSION: version},
            )
        )
        await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded", reward=1.0)
        return claimed.rollout_id

    return asyncio.run(make())


def test_a_group_sampled_more_than_max_staleness_updates_ago_is_dropped_and_counted() -> None:
    store = MemoryStore()
    ids = [call(store, 3), call(store, 3), call(store, 2), call(store, 1)]  # group 1: one call 2 updates old
    rollouts = [asyncio.run(store.get_rollout(i)) for i in ids]
    groups = [0, 0, 1, 1]
    fresh = asyncio.run(fresh_groups(store, rollouts, groups, current_version=3, max_staleness=1))
    assert [r.rollout_id for r in fresh.rollouts] == ids[:2] and fresh.groups == [0, 0]
    assert fresh.dropped == 1 and fresh.staleness == [0, 2]
    metrics = fresh.metrics()
    assert metrics["async/dropped_groups"] == 1 and metrics["async/staleness_max"] == 2
    assert (metrics["async/staleness_0"], metrics["async/staleness_1"], metrics["async/staleness_over"]) == (1, 0, 1)
    kept = asyncio.run(fresh_groups(store, rollouts, groups, 3, 1, stale_groups="keep"))
    assert kept.groups == groups and kept.dropped == 0 and kept.staleness == [0, 2]


def test_importance_weights_are_the_trainer_over_recorded_ratio_truncated_at_the_cap() -> None:
    trainer = torch.tensor([0.5, 0.2, 0.9]).log()
    recorded = torch.tensor([0.25, 0.4, 0.3]).log()  # ratios 2.0, 0.5, 3.0
    weights, truncated = tis_weights(trainer, recorded, cap=2.5)
    assert weights.tolist() == pytest.approx([2.0, 0.5, 2.5])
    assert truncated.tolist() == [0.0, 0.0, 1.0]


def test_the_update_reports_the_importance_weights_of_a_stale_batch() -> None:
    from tests.test_grpo import tiny_model

    model = tiny_model()
    prompt, completion = list(range(1, 9)), [20, 21, 22]
    with torch.no_grad():
        (now,) = sequence_logprobs(model, [ScoredSequence(prompt + completion, len(prompt))])
    recorded = [lp - math.log(2.0) for lp in now.tolist()[:2]] + [now.tolist()[2] - math.log(0.5)]  # ratios 2, 2, .5
    trajectory = Trajectory(
        token_ids=prompt + completion,
        loss_mask=[0] * len(prompt) + [1] * 3,
        logprobs=[0.0] * len(prompt) + recorded,
        prompt_length=len(prompt),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    capped = grpo_update(model, optimizer, [(trajectory, 1.0)], GRPOConfig(policy=PolicyConfig(tis_cap=1.5)))
    assert capped["is_weight_mean"] == pytest.approx((1.5 + 1.5 + 0.5) / 3, rel=1e-4)
    assert capped["is_weight_max"] == pytest.approx(1.5, rel=1e-4)
    assert capped["tis_truncated"] == pytest.approx(2 / 3)
    raw = grpo_update(model, optimizer, [(trajectory, 1.0)], GRPOConfig())
    assert raw["is_weight_mean"] == pytest.approx((2 + 2 + 0.5) / 3, rel=1e-4)
    assert raw["is_weight_max"] == pytest.approx(2.0, rel=1e-4)


def test_resume_from_a_checkpoint_trains_the_groups_it_had_queued_once_and_samples_none_again(tmp_path: Path) -> None:
    path = tmp_path / "run.db"
    store = SqliteStore(path)
    first = pipeline(store, 1, 1)
    steps = asyncio.run(train(first, store, range(1, 3), []))  # steps 1 and 2 trained; 3 and 4 queued once 2 published
    checkpoint = first.state()
    assert list(checkpoint) == ["3", "4"]
    queued_ids = checkpoint["3"]["ids"] + checkpoint["4"]["ids"]
    asyncio.run(store.close())

    reopened = SqliteStore(path)  # the run restarts from the checkpoint of step 2
    resumed = pipeline(reopened, 1, 1, queued=checkpoint, skip=2)
    later = asyncio.run(train(resumed, reopened, range(3, 5), []))
    assert [r.rollout_id for s in later for r in s.rollouts] == queued_ids  # the groups queued, not sampled again
    trained = [r.rollout_id for s in steps + later for r in s.trained[0]]
    everything = asyncio.run(reopened.query_rollouts(mode="train"))
    assert len(trained) == len(set(trained)) == len(everything) == 4 * PROMPTS * GROUP  # each once, none lost
    order = TaskSampler(len(TASKS), seed=5).take(4 * PROMPTS)
    assert [r.input for s in steps + later for r in s.rollouts] == [TASKS[i] for i in order for _ in range(GROUP)]


def test_queued_steps_the_store_lost_are_queued_again_from_their_tasks() -> None:
    checkpoint = {"2": {"ids": ["gone-1", "gone-2"], "tasks": [4, 7]}}
    store = MemoryStore()
    resumed = pipeline(store, 0, 0, queued=checkpoint, skip=1)
    (step,) = asyncio.run(train(resumed, store, range(2, 3), []))
    assert inputs(step) == [TASKS[4]] * GROUP + [TASKS[7]] * GROUP


def test_the_async_settings_are_checked() -> None:
    for bad in (-1, True):
        with pytest.raises(ValueError, match="max_staleness"):
            GRPOConfig(max_staleness=bad)
        with pytest.raises(ValueError, match="max_staleness"):
            SFTConfig(max_staleness=bad)
    with pytest.raises(ValueError, match="stale_groups"):
        GRPOConfig(max_staleness=1, stale_groups="reuse")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="attempt_wait_s must be >= 0 seconds"):
        PolicyConfig(attempt_wait_s=-1.0)


def test_a_rollout_whose_calls_straddle_an_update_counts_as_mixed_and_as_old_as_its_first_call() -> None:
    store = MemoryStore()

    async def two_calls() -> str:
        claimed = await store.start_rollout({"q": 0}, mode="train")
        for version in (4, 5):  # an update was published between its two calls
            await store.add_span(
                Span(
                    rollout_id=claimed.rollout_id,
                    attempt_id=claimed.attempt.attempt_id,
                    name="chat",
                    attributes={sc.GEN_AI_OPERATION: sc.CHAT, sc.WEIGHTS_VERSION: version},
                )
            )
        await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded", reward=1.0)
        return claimed.rollout_id

    rollouts = [
        asyncio.run(store.get_rollout(asyncio.run(two_calls()))),
        asyncio.run(store.get_rollout(call(store, 5))),
    ]
    fresh = asyncio.run(fresh_groups(store, rollouts, [0, 0], current_version=6, max_staleness=1))
    assert fresh.mixed == 1 and fresh.staleness == [2] and fresh.dropped == 1 and fresh.rollouts == []
    within = asyncio.run(fresh_groups(store, rollouts, [0, 0], current_version=5, max_staleness=1))
    assert within.dropped == 0 and within.staleness == [1]  # the group is within the bound and trains ...
    assert within.rollouts == rollouts[1:] and within.groups == [0] and within.mixed == 1  # ... less the mixed attempt
    assert within.metrics()["async/mixed_version_rollouts"] == 1


def test_still_running_names_the_attempts_that_did_not_end_and_returns_once_they_do() -> None:
    store = MemoryStore()
    done = call(store, 0)

    async def scenario() -> None:
        began = await store.start_rollout({"q": 1}, mode="train")
        assert await still_running(store, [began.rollout_id, done], timeout_s=0) == [began.rollout_id]
        waiting = asyncio.ensure_future(still_running(store, [began.rollout_id, done], timeout_s=60))
        await asyncio.sleep(0)
        assert not waiting.done()
        await store.update_attempt(began.rollout_id, began.attempt.attempt_id, status="succeeded", reward=1.0)
        assert await asyncio.wait_for(waiting, 10) == []  # woken by the rollout's end, well before 60 s

    asyncio.run(scenario())
