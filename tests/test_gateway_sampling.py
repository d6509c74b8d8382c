"""The trainer's sampling is applied where the calls pass: the gateway rewrites each rollout's calls by its mode."""

from __future__ import annotations

import logging

import pytest

from agentgrad import semconv
from agentgrad.gateway import SamplingPlan
from agentgrad.gateway.sampling import apply_sampling
from tests.conftest import Served, Upstream
from tests.test_gateway import client, llm_spans_of

PLAN = {"train": {"temperature": 1.0, "top_p": 0.9, "max_tokens": 48}, "val": {"temperature": 0.0, "max_tokens": 48}}


async def call_in(served: Served, mode: str, **sampling: object) -> tuple[str, dict[str, object]]:
    rollout = await served.store.start_rollout("task", mode=mode)
    route = f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"
    client(route).chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], **sampling)  # type: ignore[call-overload]
    return rollout.rollout_id, dict((await llm_spans_of(served, rollout.rollout_id))[0].attributes)


def sampling_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the gateway's sampling said, without other loggers' records (a client another test leaked and the garbage
    collector closes inside this test's loop logs an asyncio error)."""
    return [r.getMessage() for r in caplog.records if r.name == "agentgrad.gateway.sampling"]


async def test_training_calls_get_the_trainers_sampling_and_validation_is_greedy_whatever_the_agent_asks(
    served: Served, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    served.gateway.set_sampling(SamplingPlan(PLAN))
    caplog.set_level(logging.WARNING, logger="agentgrad.gateway.sampling")
    _, train = await call_in(served, "train", temperature=0, max_tokens=500)
    sent = upstream.fake.requests[-1]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (1.0, 0.9, 48)
    assert (train["gen_ai.request.temperature"], train["gen_ai.request.top_p"], train["gen_ai.request.max_tokens"]) == (1.0, 0.9, 48)
    assert train[semconv.AGENT_REQUEST_PARAMS["temperature"]] == 0 and train[semconv.AGENT_REQUEST_PARAMS["max_tokens"]] == 500
    assert semconv.AGENT_REQUEST_PARAMS["top_p"] not in train and train[semconv.SAMPLING_SOURCE] == "trainer"

    _, val = await call_in(served, "val", temperature=0.7)
    assert upstream.fake.requests[-1]["temperature"] == 0.0 and val["gen_ai.request.temperature"] == 0.0
    assert val[semconv.AGENT_REQUEST_PARAMS["temperature"]] == 0.7
    await call_in(served, "val", temperature=0.7)
    await call_in(served, "val", temperature=0.0)  # what the plan sets: nothing replaced
    said = sampling_warnings(caplog)  # once per mode and setting the agent set otherwise
    assert [m.split(",")[0] for m in said] == [
        "the trainer's sampling sets temperature=1.0 on 'train' calls",
        "the trainer's sampling sets max_tokens=48 on 'train' calls",
        "the trainer's sampling sets temperature=0.0 on 'val' calls",
    ]
    assert "replacing the 0.7 the agent asked for" in said[-1] and "sampling='agent'" in said[-1]


async def test_with_sampling_agent_the_agents_own_values_win_and_the_trainers_fill_the_rest(
    served: Served, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    served.gateway.set_sampling(SamplingPlan(PLAN, source="agent"))
    caplog.set_level(logging.WARNING, logger="agentgrad.gateway.sampling")
    _, span = await call_in(served, "train", temperature=0)
    sent = upstream.fake.requests[-1]
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0, 0.9, 48)
    assert span[semconv.SAMPLING_SOURCE] == "agent" and span["gen_ai.request.temperature"] == 0
    assert not sampling_warnings(caplog)  # nothing the agent asked for was replaced


async def test_without_a_plan_or_outside_a_rollout_the_request_is_relayed_as_it_is(served: Served, upstream: Upstream) -> None:
    _, span = await call_in(served, "train", temperature=0.3)
    assert upstream.fake.requests[-1]["temperature"] == 0.3 and semconv.SAMPLING_SOURCE not in span
    served.gateway.set_sampling(SamplingPlan(PLAN))
    client(f"{served.url}/v1").chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}],
                                                        temperature=0.3)
    assert upstream.fake.requests[-1]["temperature"] == 0.3


def test_each_api_gets_its_own_output_cap_and_a_bad_plan_is_refused() -> None:
    responses: dict[str, object] = {"model": "m", "input": "x", "max_output_tokens": 9}
    assert apply_sampling(semconv.RESPONSES_API, responses, {"max_tokens": 48}, "trainer") == {
        semconv.SAMPLING_SOURCE: "trainer", semconv.AGENT_REQUEST_PARAMS["max_tokens"]: 9}
    assert responses["max_output_tokens"] == 48 and "max_tokens" not in responses
    chat: dict[str, object] = {"model": "m", "max_completion_tokens": 900}
    apply_sampling(semconv.CHAT_COMPLETIONS_API, chat, {"max_tokens": 48}, "trainer")
    assert chat["max_completion_tokens"] == 48 and "max_tokens" not in chat
    with pytest.raises(ValueError, match="'trainer'"):
        SamplingPlan(PLAN, source="mine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="can set temperature, top_p, max_tokens"):
        SamplingPlan({"train": {"seed": 1}})


async def test_a_seeded_rollouts_calls_each_get_the_next_seed_and_a_val_or_unseeded_rollout_none(
    served: Served, upstream: Upstream
) -> None:
    served.gateway.set_sampling(SamplingPlan(PLAN))
    rollout = await served.store.start_rollout("task", mode="train", metadata={semconv.SAMPLING_SEED: 1000})
    route = f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"
    for _ in range(3):
        client(route).chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], seed=7)
    assert [r["seed"] for r in upstream.fake.requests[-3:]] == [1000, 1001, 1002]  # the trainer's, not the agent's 7
    spans = await llm_spans_of(served, rollout.rollout_id)
    assert sorted(s.attributes["gen_ai.request.seed"] for s in spans) == [1000, 1001, 1002]
    assert {s.attributes[semconv.AGENT_REQUEST_PARAMS["seed"]] for s in spans} == {7}

    await call_in(served, "train")  # no seed in its metadata: sampled unseeded
    assert "seed" not in upstream.fake.requests[-1]
    served.gateway.set_sampling(SamplingPlan(PLAN, source="agent"))
    agents = await served.store.start_rollout("task", mode="train", metadata={semconv.SAMPLING_SEED: 5})
    client(f"{served.url}/rollouts/{agents.rollout_id}/attempts/{agents.attempt.attempt_id}/v1").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], seed=7)
    assert upstream.fake.requests[-1]["seed"] == 7  # sampling="agent": the agent's own seed wins


def test_the_seed_goes_only_to_the_apis_that_take_one() -> None:
    responses: dict[str, object] = {"model": "m", "input": "x"}
    apply_sampling(semconv.RESPONSES_API, responses, {"temperature": 1.0}, "trainer", seed=3)
    assert "seed" not in responses
    completion: dict[str, object] = {"model": "m", "prompt": "x"}
    apply_sampling(semconv.COMPLETIONS_API, completion, {"temperature": 1.0}, "trainer", seed=3)
    assert completion["seed"] == 3
