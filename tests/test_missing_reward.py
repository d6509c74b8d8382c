"""A rollout whose agent reports no reward is visible as such: failed by default, or counted as 0 when asked."""

from __future__ import annotations

import asyncio

import agentgrad as ag
from agentgrad import semconv
from agentgrad.algorithms.base import Evaluation
from agentgrad.rollout.runner import Runner
from agentgrad.types import Attempt, Rollout, RolloutConfig, RolloutStatus


def silent(task: str) -> None:
    """An agent that returns nothing and never calls emit_reward."""


def emitting(task: str) -> None:
    ag.emit_reward(0.5)


async def run_one(agent: object, config: RolloutConfig | None = None) -> tuple[Rollout, list[Attempt]]:
    store = ag.MemoryStore()
    queued = await store.enqueue_rollout("t", config=config or RolloutConfig())
    await Runner(agent, store, max_rollouts=1).run()  # type: ignore[arg-type]
    return await store.get_rollout(queued.rollout_id), await store.query_attempts(queued.rollout_id)


def test_a_rollout_with_no_reward_fails_by_default_with_a_message_naming_emit_reward() -> None:
    rollout, (attempt,) = asyncio.run(run_one(silent))
    assert rollout.status is RolloutStatus.FAILED and rollout.reward is None
    assert "emit_reward" in (attempt.error or "") and "missing_reward='zero'" in (attempt.error or "")
    assert rollout.metadata[semconv.NO_REWARD] is True


def test_a_rollout_with_no_reward_counts_as_zero_when_configured_and_is_still_reported() -> None:
    rollout, (attempt,) = asyncio.run(run_one(silent, RolloutConfig(missing_reward="zero")))
    assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward is None and attempt.error is None
    evaluation = Evaluation.of([rollout])
    assert (evaluation.no_reward, evaluation.reward_mean, evaluation.succeeded) == (1, 0.0, 1)


def test_an_emitted_reward_is_a_reward() -> None:
    rollout, _ = asyncio.run(run_one(emitting))
    assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward == 0.5
    assert semconv.NO_REWARD not in rollout.metadata


def test_baseline_reports_how_many_rollouts_had_no_reward() -> None:
    def half(task: int) -> float | None:
        return 1.0 if task % 2 else None

    results = ag.Trainer(ag.Baseline(missing_reward="zero"), store="memory").fit(half, [1, 2, 3, 4])
    assert (results["train"].no_reward, results["train"].reward_mean) == (2, 0.5)
    failed = ag.Trainer(store="memory").fit(half, [1, 2, 3, 4])
    assert (failed["train"].no_reward, failed["train"].succeeded) == (2, 2)
