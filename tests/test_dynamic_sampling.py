"""GRPO's dynamic sampling (DAPO): a step whose batch trains too few groups draws more tasks, on the same weights, up
to its cap; the groups are counted by the credit rule; a resumed run draws on where the checkpointed one stopped."""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

import agentgrad as ag
from agentgrad import semconv
from agentgrad.algorithms.grpo import GRPO, GRPOConfig
from agentgrad.algorithms.sampling import TaskSampler

TASKS = [{"question": f"Say {word}."} for word in ("one", "two", "three", "four", "five", "six")]
VARIED = 0
"""The one task whose two rollouts earn different rewards (0 then 1); every other task's earn 1.0 each."""
SEED = 0
ORDER = TaskSampler(len(TASKS), SEED).take(len(TASKS))
SMALL = {"prompts_per_step": 1, "group_size": 2, "max_tokens": 4, "val_every": 0, "seed": SEED}


def rewarding(per_turn: bool = False) -> Any:
    """An agent whose rollouts earn 1.0 but the varied task's, which earn 0 then 1; `per_turn`: that is what their
    first call earns (emitted), and a second call ends every episode right (1.0)."""
    attempts = itertools.count()
    lock = threading.Lock()

    @ag.rollout
    def agent(task: dict[str, Any], llm: ag.LLM) -> float:
        client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
        messages: Any = [{"role": "user", "content": task["question"]}]
        client.chat.completions.create(model=llm.model, messages=messages)
        with lock:
            earned = float(next(attempts) % 2) if task["question"] == TASKS[VARIED]["question"] else 1.0
        if not per_turn:
            return earned
        ag.emit_reward(earned)
        client.chat.completions.create(model=llm.model, messages=messages)
        return 1.0

    return agent


def test_the_seed_puts_the_varied_task_third() -> None:
    assert ORDER.index(VARIED) == 2  # what the draws below count on


@pytest.mark.model
@pytest.mark.parametrize(("extra_draws", "drawn", "trained"), [(0, 1, False), (1, 2, False), (4, 3, True)])
def test_a_step_draws_more_tasks_until_a_group_differs_or_its_draws_run_out(
    fresh_tiny_engine: Any, extra_draws: int, drawn: int, trained: bool
) -> None:
    store = ag.MemoryStore()
    version = fresh_tiny_engine.version
    config = GRPOConfig(steps=1, dynamic_sampling=extra_draws, **SMALL)
    result = ag.Trainer(GRPO(config, local_engine=fresh_tiny_engine), store=store).fit(rewarding(), TASKS)

    rollouts = sorted(asyncio.run(store.query_rollouts(mode="train")), key=lambda r: r.metadata["group"])
    assert [r.input["question"] for r in rollouts] == [TASKS[i]["question"] for i in ORDER[:drawn] for _ in "ab"]
    assert [r.metadata["group"] for r in rollouts] == [g for g in range(drawn) for _ in "ab"]
    assert {r.metadata["step"] for r in rollouts} == {1}
    assert len({r.metadata[semconv.SAMPLING_SEED] for r in rollouts}) == 2 * drawn  # each samples differently
    figures = result.history[0]
    assert figures["train/groups_sampled"] == drawn
    assert figures["train/groups_used"] == int(trained)
    assert (fresh_tiny_engine.version > version) == trained  # no group differed: nothing to update


@pytest.mark.model
@pytest.mark.parametrize(("credit", "drawn", "trained"), [("per_turn", 3, True), ("final", 5, False)])
def test_a_group_ending_alike_whose_calls_earned_differently_stops_the_draws_under_per_turn_credit(
    fresh_tiny_engine: Any, credit: str, drawn: int, trained: bool
) -> None:
    store = ag.MemoryStore()
    config = GRPOConfig(steps=1, dynamic_sampling=4, credit=credit, gamma=0.0, **SMALL)  # type: ignore[arg-type]
    result = ag.Trainer(GRPO(config, local_engine=fresh_tiny_engine), store=store).fit(rewarding(per_turn=True), TASKS)

    assert result.history[0]["train/groups_sampled"] == drawn  # the credit rule's count: per turn, the third task
    assert result.history[0]["train/groups_used"] == int(trained)


@pytest.mark.model
def test_a_resumed_run_draws_the_tasks_after_those_its_steps_drew(fresh_tiny_engine: Any, tmp_path: Path) -> None:
    store = ag.MemoryStore()
    config = GRPOConfig(steps=1, dynamic_sampling=4, checkpoint_dir=str(tmp_path), **SMALL)
    ag.Trainer(GRPO(config, local_engine=fresh_tiny_engine), store=store).fit(rewarding(), TASKS)
    resumed = GRPO(config, steps=2, dynamic_sampling=0, local_engine=fresh_tiny_engine)
    ag.Trainer(resumed, store=store).fit(rewarding(), TASKS)

    second = [r for r in asyncio.run(store.query_rollouts(mode="train")) if r.metadata["step"] == 2]
    assert [r.input["question"] for r in second] == [TASKS[ORDER[3]]["question"]] * 2  # not step 1's second task


def test_dynamic_sampling_is_checked() -> None:
    with pytest.raises(ValueError, match="synchronous training only"):
        GRPOConfig(dynamic_sampling=2, max_staleness=1)
    with pytest.raises(ValueError, match="extra draws"):
        GRPOConfig(dynamic_sampling=-1)

    async def judge(task: Any, answers: Any) -> list[float]:
        return [0.0] * len(answers)

    with pytest.raises(ValueError, match="use one or the other"):
        GRPO(dynamic_sampling=1, group_reward=judge)
