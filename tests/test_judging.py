"""Judge rewards: pointwise and group judges through a real gateway to a fake judge model, recorded with their
reasoning and marked as no training data; and a GRPO step whose rewards come from the group judge."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

import agentgrad as ag
from agentgrad.adapters import to_chats
from agentgrad.gateway import Backend, Gateway, SamplingPlan
from agentgrad.rollout.judging import JudgeError
from agentgrad.semconv import gateway_route, is_llm_call
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from agentgrad.types import Span
from tests.fake_judge import FakeJudge
from tests.process_agents import unchanged_calc

RUBRIC = "Longer answers are better."


@dataclass
class Served:
    url: str  # the gateway's /v1
    gateway: Gateway
    store: MemoryStore
    fake: FakeJudge


@pytest.fixture
def served() -> Iterator[Served]:
    fake, store = FakeJudge(), MemoryStore()
    with ServerThread(fake.app) as upstream:
        gateway = Gateway(store, default=Backend(upstream.url + "/v1"))
        with ServerThread(gateway) as server:
            yield Served(server.url + "/v1", gateway, store, fake)


def spans_of(served: Served, rollout_id: str | None) -> list[Span]:
    asyncio.run(served.gateway.flush())
    return [s for s in asyncio.run(served.store.query_spans(rollout_id)) if is_llm_call(s)]


def test_a_pointwise_judgement_scores_in_0_1_and_its_reasoning_is_recorded_as_not_training_data(served: Served) -> None:
    verdict = ag.judge("one two three", RUBRIC, judge=ag.Judge(served.url, "judge"), task="Say three words.")
    assert verdict.score == pytest.approx(0.3) and "One point per word" in verdict.reasoning
    asked = served.fake.requests[-1]
    assert asked["temperature"] == 0.0 and RUBRIC in asked["messages"][-1]["content"]
    assert "Say three words." in asked["messages"][-1]["content"]

    (span,) = spans_of(served, None)
    assert span.attributes["agentgrad.llm.not_trained"] == "judge"
    assert span.attributes["agentgrad.agent.name"] == "judge"
    output = json.loads(span.attributes["gen_ai.output.messages"])
    assert output[0]["content"] == verdict.reasoning
    assert to_chats([span]) == []  # never training data


def test_a_group_judge_scores_the_rollouts_of_a_task_side_by_side(served: Served) -> None:
    outputs = ["short", "a bit longer", "the longest answer of the three"]
    verdicts = ag.group_judge(outputs, RUBRIC, judge=ag.Judge(served.url, "judge"))
    assert [v.score for v in verdicts] == [pytest.approx(0.1), pytest.approx(0.3), pytest.approx(0.6)]
    (asked,) = served.fake.requests
    assert all(text in asked["messages"][-1]["content"] for text in outputs)  # one call for the whole group
    assert ag.group_judge([], RUBRIC, judge=ag.Judge(served.url, "judge")) == []


async def test_the_async_twins_give_the_same_judgements(served: Served) -> None:
    judge = ag.Judge(served.url, "judge")
    assert (await ag.ajudge("one two", RUBRIC, judge=judge)).score == pytest.approx(0.2)
    assert [v.score for v in await ag.agroup_judge(["a", "b c"], RUBRIC, judge=judge)] == [
        pytest.approx(0.1), pytest.approx(0.2)]


def test_a_reply_without_a_score_is_an_error_that_quotes_it(served: Served) -> None:
    with pytest.raises(JudgeError, match="no 'SCORE: <0-10>' line: 'One point per word"):
        ag.judge("one", RUBRIC, judge=ag.Judge(served.url, "mute-judge"))
    with pytest.raises(JudgeError, match=r"scores no response \[2\] of 2"):
        ag.group_judge(["one", "two"], RUBRIC, judge=ag.Judge(served.url, "forgetful-judge"))
    with pytest.raises(ValueError, match="Judge.base_url is an http"):
        ag.Judge("localhost:8000", "judge")


def test_a_judge_called_inside_a_training_rollout_keeps_its_own_sampling_and_stays_out_of_the_chats(
    served: Served,
) -> None:
    served.gateway.set_sampling(SamplingPlan.for_training(temperature=1.0, top_p=0.9, max_tokens=8))
    rollout = asyncio.run(served.store.start_rollout("task", mode="train"))
    route = gateway_route(served.url, rollout.rollout_id, rollout.attempt.attempt_id)
    agent = OpenAI(base_url=route, api_key="x").chat.completions.create(
        model="judge", messages=[{"role": "user", "content": "## Response\nmy answer"}])
    verdict = ag.judge(agent.choices[0].message.content or "", RUBRIC, judge=ag.Judge(route, "judge"))
    assert 0 < verdict.score <= 1
    agent_call, judge_call = served.fake.requests
    assert agent_call["temperature"] == 1.0 and agent_call["max_tokens"] == 8  # the trainer's plan
    assert judge_call["temperature"] == 0.0 and judge_call["max_tokens"] == 512  # the judge's own
    spans = sorted(spans_of(served, rollout.rollout_id), key=lambda s: s.start_time)
    assert len(spans) == 2 and [len(chat) for chat in to_chats(spans)] == [2]


@pytest.mark.model
def test_a_grpo_step_trains_on_rewards_from_the_group_judge() -> None:
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.engine import Engine

    fake, judge_store = FakeJudge(), MemoryStore()
    engine = Engine(sampling_dtype="float32", device="cpu")
    try:
        with ServerThread(fake.app) as upstream, ServerThread(
            Gateway(judge_store, default=Backend(upstream.url + "/v1"))
        ) as judges:
            rubric = "The answer is a sum; a longer explanation is better."
            grpo = GRPO(GRPOConfig(steps=1, prompts_per_step=2, group_size=2, max_tokens=8, val_every=0,
                                   skip_uniform_groups=False), local_engine=engine,
                        group_reward=ag.GroupJudge(ag.Judge(judges.url + "/v1", "judge"), rubric))
            tasks = [{"question": f"What is {a} + {b}?", "answer": a + b} for a, b in [(12, 30), (7, 8)]]
            result = ag.Trainer(grpo, store="memory", n_runners=2, runner_concurrency=2).fit(unchanged_calc, tasks)
        (step,) = result.history
        assert step["train/failed_rollouts"] == 0 and engine.version == 1
        assert len(fake.requests) == 2  # one judge call per group
        assert step["train/reward_mean"] == pytest.approx(sum(fake.given) / 10 / len(fake.given))
        assert all("What is" in r["messages"][-1]["content"] for r in fake.requests)  # the judge saw the task
    finally:
        engine.close()


@pytest.mark.model
def test_the_local_judge_example_scores_an_anthropic_agent_with_the_engines_own_model(engine: Any) -> None:
    import importlib.util

    from agentgrad.adapters import to_trajectories
    from agentgrad.engine.server import create_engine_app

    spec = importlib.util.spec_from_file_location("judged_agent", Path(__file__).parent.parent / "examples" / "judged_agent.py")
    assert spec and spec.loader
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    store = MemoryStore()
    with ServerThread(create_engine_app(engine)) as local:
        gateway = Gateway(store, default=Backend(local.url + "/v1", model=engine.name, system="agentgrad"))
        with ServerThread(gateway) as server:
            rollout = asyncio.run(store.start_rollout("task"))
            route = gateway_route(server.url + "/v1", rollout.rollout_id, rollout.attempt.attempt_id)
            score = example.answer_and_judge(example.TASKS[0], route)
            asyncio.run(gateway.flush())
            calls = sorted((s for s in asyncio.run(store.query_spans(rollout.rollout_id)) if is_llm_call(s)),
                           key=lambda s: s.start_time)
    assert 0.0 <= score <= 1.0
    agent_call, judge_call = calls
    assert agent_call.attributes["agentgrad.llm.api"] == "messages" and "agentgrad.llm.not_trained" not in agent_call.attributes
    verdict = json.loads(json.loads(judge_call.attributes["gen_ai.output.messages"])[0]["content"])
    assert judge_call.attributes["agentgrad.llm.not_trained"] == "judge" and verdict["score"] / 10 == score
    (trajectory,) = to_trajectories(calls, reward=score)  # the judge's call is no training data
    assert trajectory.token_ids[-len(agent_call.attributes["agentgrad.llm.response_token_ids"]):] == \
        agent_call.attributes["agentgrad.llm.response_token_ids"]


def test_a_structured_judge_asks_for_a_json_verdict_and_reads_it(served: Served) -> None:
    from agentgrad.rollout.judging import parse_group, parse_pointwise, schema

    request = ag.Judge(served.url, "judge", structured=True)._request([{"role": "system", "content": "Grade."}], 3)
    assert request["response_format"]["json_schema"]["schema"] == schema(3)
    assert schema(3)["properties"]["scores"]["minItems"] == 3 and "JSON" in request["messages"][0]["content"]
    assert parse_pointwise('{"reasoning": "fine", "score": 7}') == ag.Judgement(0.7, "fine")
    assert [j.score for j in parse_group('{"reasoning": "b wins", "scores": [2, 9]}', 2)] == [0.2, 0.9]
    with pytest.raises(JudgeError):
        parse_group('{"reasoning": "one missing", "scores": [2]}', 2)
