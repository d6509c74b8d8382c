"""How GRPO credits a multi-call attempt (the tool demo: the call, then the answer after the result).

The attempt's reward becomes one advantage (normalized within its task's group) that every token
the model wrote, in either call, is trained with; the tool result between them is masked. When
the second prompt continues the first call token for token the two calls are one trajectory;
when it does not (a framework that changes the prompt, or a non-canonical tokenization) they are
two, each carrying the attempt's full advantage.
"""

from __future__ import annotations

import json

import pytest

from agentgrad.algorithms.grpo import GRPOConfig
from agentgrad.store import MemoryStore
from agentgrad.types import Rollout, RolloutStatus, Span
from tests.helpers import grpo_batch

SYSTEM = [1, 2, 3]
TOOL_RESULT = [90, 91]  # the tool turn holding "579": not written by the model


def call(rollout: Rollout, attempt_id: str, t: float, prompt: list[int], response: list[int]) -> Span:
    return Span(
        rollout_id=rollout.rollout_id, attempt_id=attempt_id, span_id=f"{rollout.rollout_id}-{t}", name="chat",
        start_time=t, end_time=t + 0.5,
        attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "policy", "gen_ai.request.temperature": 1.0,
            "gen_ai.input.messages": json.dumps([{"role": "user", "content": "q"}]),
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": "a"}]),
            "agentgrad.llm.prompt_token_ids": prompt, "agentgrad.llm.response_token_ids": response,
            "agentgrad.llm.response_logprobs": [-0.1] * len(response),
        },
    )


async def batch_of(attempts: list[tuple[float, list[tuple[list[int], list[int]]]]]) -> list[tuple[object, float]]:
    """GRPO's batch for one group of attempts, each (reward, [(prompt, response), ...])."""
    store = MemoryStore()
    rollouts = await store.enqueue_rollouts([{"input": {"i": i}} for i in range(len(attempts))])
    finished = []
    for rollout, (reward, calls) in zip(rollouts, attempts):
        attempted = await store.dequeue_rollout("runner-0")
        assert attempted is not None and attempted.rollout_id == rollout.rollout_id
        attempt_id = attempted.attempt.attempt_id
        await store.add_spans([call(rollout, attempt_id, t, prompt, response) for t, (prompt, response) in enumerate(calls)])
        finished.append(rollout.model_copy(update={"status": RolloutStatus.SUCCEEDED, "reward": reward}))
    batch = await grpo_batch(GRPOConfig(), store, finished, [0] * len(finished))
    assert batch.metrics["train/groups_used"] == 1
    return batch.data


async def test_a_tool_call_and_its_answer_are_one_trajectory_trained_with_the_attempt_advantage() -> None:
    first_prompt, tool_call, answer = SYSTEM + [10], [20, 21], [30]
    second_prompt = first_prompt + tool_call + TOOL_RESULT
    batch = await batch_of([
        (1.0, [(first_prompt, tool_call), (second_prompt, answer)]),  # called the tool, right
        (0.0, [(first_prompt, [40])]),  # answered in its head, wrong
    ])
    (called, advantage), (direct, other) = batch
    assert advantage == pytest.approx(1.0, abs=1e-5) and other == pytest.approx(-1.0, abs=1e-5)
    assert called.token_ids == second_prompt + answer
    assert called.loss_mask == [0] * len(first_prompt) + [1, 1] + [0, 0] + [1]  # both calls trained, result masked
    assert called.logprobs[len(first_prompt):] == [-0.1, -0.1, 0.0, 0.0, -0.1]
    assert called.reward == 1.0 and direct.reward == 0.0 and len(called.span_ids) == 2


async def test_calls_whose_prompts_do_not_continue_are_two_trajectories_with_the_same_advantage() -> None:
    first_prompt, tool_call, answer = SYSTEM + [10], [20, 21], [30]
    changed_prompt = [1, 2, 99, 10, 20, 21] + TOOL_RESULT  # e.g. the tools left the system turn (AutoGen's reflection)
    batch = await batch_of([
        (1.0, [(first_prompt, tool_call), (changed_prompt, answer)]),
        (0.0, [(first_prompt, [40])]),
    ])
    (call_part, a1), (answer_part, a2), (_, a3) = batch
    assert a1 == a2 == pytest.approx(1.0, abs=1e-5) and a3 == pytest.approx(-1.0, abs=1e-5)
    assert call_part.loss_mask == [0] * len(first_prompt) + [1, 1]
    assert answer_part.loss_mask == [0] * len(changed_prompt) + [1]  # the whole second prompt is context
    assert call_part.reward == answer_part.reward == 1.0
