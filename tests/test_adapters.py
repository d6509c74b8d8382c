"""Spans → training data: credit assignment, trajectory merging, agent selection, chats."""

from __future__ import annotations

import json

import pytest

from agentgrad.adapters import final_reward, llm_calls, to_chats, to_trajectories, to_triplets
from agentgrad.types import Span


def call(t: float, prompt: list[int], response: list[int], model: str = "policy", **extra: object) -> Span:
    messages = extra.pop("messages", [{"role": "user", "content": f"q{t}"}])
    return Span(
        rollout_id="ro-1", attempt_id="at-1", span_id=f"s{t}", name="chat", start_time=t, end_time=t + 0.5,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.request.temperature": 0.8,
            "gen_ai.input.messages": json.dumps(messages),
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": f"a{t}"}]),
            "agentgrad.llm.prompt_token_ids": prompt,
            "agentgrad.llm.response_token_ids": response,
            "agentgrad.llm.response_logprobs": [-0.5] * len(response),
            **extra,
        },
    )


def reward(t: float, value: float) -> Span:
    return Span(rollout_id="ro-1", attempt_id="at-1", name="agentgrad.reward", start_time=t, end_time=t,
                attributes={"agentgrad.reward": value})


SPANS = [
    call(1, [1, 2], [3]),
    reward(2, 0.2),
    call(3, [1, 2, 3, 9], [4, 5]),
    call(4, [1, 2, 3, 9, 4, 5, 9], [6]),
    reward(5, 1.0),
]


def test_final_credit_gives_every_call_the_final_reward() -> None:
    triplets = to_triplets(SPANS)
    assert [t.reward for t in triplets] == [1.0, 1.0, 1.0]
    assert [t.response_token_ids for t in triplets] == [[3], [4, 5], [6]]
    assert triplets[1].prompt_token_ids == [1, 2, 3, 9] and triplets[1].response_logprobs == [-0.5, -0.5]
    assert [t.reward for t in to_triplets(SPANS, reward=0.0)] == [0.0, 0.0, 0.0]


def test_discounted_credit_decays_with_the_calls_left_to_the_end() -> None:
    triplets = to_triplets(SPANS, credit="discounted", gamma=0.5)
    assert [t.reward for t in triplets] == [0.25, 0.5, 1.0]


def test_matched_credit_pays_each_call_with_the_next_reward() -> None:
    triplets = to_triplets(SPANS, credit="matched")
    assert [t.reward for t in triplets] == [0.2, 1.0, 1.0]
    trailing = to_triplets(SPANS[:3], credit="matched", reward=0.7)  # a call after the last reward span
    assert [t.reward for t in trailing] == [0.2, 0.7]


def test_unknown_credit_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="'final', 'discounted' or 'matched'"):
        to_triplets(SPANS, credit="average")  # type: ignore[arg-type]


def test_calls_that_continue_the_conversation_merge_into_one_masked_trajectory() -> None:
    (trajectory,) = to_trajectories(SPANS)
    assert trajectory.token_ids == [1, 2, 3, 9, 4, 5, 9, 6]
    assert trajectory.loss_mask == [0, 0, 1, 0, 1, 1, 0, 1]
    assert trajectory.logprobs == [0, 0, -0.5, 0, -0.5, -0.5, 0, -0.5]
    assert trajectory.prompt_length == 2 and trajectory.reward == 1.0 and trajectory.temperature == 0.8
    assert trajectory.span_ids == ["s1", "s3", "s4"]


def test_a_prompt_that_does_not_continue_starts_a_new_trajectory() -> None:
    spans = [call(1, [1, 2], [3]), call(2, [1, 2, 7, 9], [4]), call(3, [1, 2, 7, 9, 4, 8], [5])]
    first, second = to_trajectories(spans, reward=0.5)
    assert first.token_ids == [1, 2, 3] and first.loss_mask == [0, 0, 1]
    assert second.token_ids == [1, 2, 7, 9, 4, 8, 5] and second.loss_mask == [0, 0, 0, 0, 1, 0, 1]
    assert first.reward == second.reward == 0.5


def test_agent_match_keeps_one_agent_of_a_multi_agent_system() -> None:
    spans = [
        call(1, [1], [2], model="planner"),
        call(2, [5], [6], model="coder"),
        call(3, [1, 2, 3], [4], model="planner"),
        call(4, [7], [8], model="anything", **{"agentgrad.agent.name": "coder-2"}),
    ]
    assert [c.response_token_ids for c in llm_calls(spans, agent_match="^planner$")] == [[2], [4]]
    assert [c.response_token_ids for c in llm_calls(spans, agent_match="coder")] == [[6], [8]]
    (planner,) = to_trajectories(spans, reward=1.0, agent_match="planner")
    assert planner.token_ids == [1, 2, 3, 4]


def test_calls_without_token_ids_or_with_errors_are_not_training_data() -> None:
    failed = call(2, [1], [2])
    failed.status.code = "ERROR"
    plain = Span(name="chat", attributes={"gen_ai.operation.name": "chat"})
    assert llm_calls([plain, failed, call(1, [1], [3])])[0].response_token_ids == [3]
    assert final_reward([]) is None and to_trajectories([plain]) == []


def test_chats_extend_while_the_conversation_continues() -> None:
    first = [{"role": "user", "content": "hi"}]
    second = first + [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "more"}]
    spans = [call(1, [1], [2], messages=first), call(2, [1, 2, 3], [4], messages=second),
             call(3, [9], [9], messages=[{"role": "user", "content": "other"}])]
    chats = to_chats(spans)
    assert chats == [
        second + [{"role": "assistant", "content": "a2"}],
        [{"role": "user", "content": "other"}, {"role": "assistant", "content": "a3"}],
    ]


def test_chats_keep_tool_calls_and_tool_results_across_the_calls_of_a_tool_conversation() -> None:
    tool_call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    question = [{"role": "system", "content": "use tools"}, {"role": "user", "content": "1+2?"}]
    asked = call(1, [1], [2], messages=question, **{
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": None, "tool_calls": [tool_call]}])})
    resent = {"role": "assistant", "content": None, "refusal": None, "function_call": None, "audio": None,
              "tool_calls": [{**tool_call, "index": 0}]}  # what the openai client sends back in its history
    history = question + [resent, {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    answered = call(2, [1, 2, 7], [8], messages=history, **{
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": "Answer: 3"}])})
    (chat,) = to_chats([asked, answered])
    assert chat == question + [
        {"role": "assistant", "content": "", "tool_calls": [tool_call]},
        {"role": "tool", "content": "3", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "Answer: 3"},
    ]
    (first,) = to_chats([asked])
    assert first[-1]["tool_calls"] == [tool_call]  # a conversation that ends in a call keeps it
