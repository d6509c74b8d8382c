"""Training that cannot silently do nothing (issue 19): every call reaches the policy with the trainer's sampling,
a step with nothing to train on or with every rollout failed stops and says why, a run owns its resources."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from typing import Any

import pytest
from openai import OpenAI
from rich.console import Console

import agentgrad as ag
from agentgrad import semconv
from agentgrad.algorithms.grpo import GRPO, IDENTICAL_STEPS, GRPOConfig
from agentgrad.algorithms.sft import SFT, SFTConfig
from agentgrad.serving import ServerThread
from tests.fake_openai import FakeLLM, app

TASKS = [{"question": f"What is {a} + {b}?", "answer": a + b} for a, b in [(12, 30), (7, 8), (41, 1), (5, 5)]]
SMALL = {"steps": 1, "prompts_per_step": 2, "group_size": 2, "max_tokens": 8, "val_every": 0}


@pytest.fixture
def elsewhere() -> Iterator[str]:
    """Another OpenAI-compatible server (a hosted API, say): what a bypassing client calls."""
    with ServerThread(app(FakeLLM(answers={}))) as server:
        yield server.url + "/v1"


def captured() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=300), out


@pytest.mark.model
@pytest.mark.parametrize("algorithm", ["GRPO", "SFT"])
def test_a_training_step_whose_agent_bypasses_the_gateway_stops_with_how_to_route_it(
    engine: Any, elsewhere: str, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", elsewhere)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-hosted")
    own_client = OpenAI()  # built at import time, from the shell's environment: it keeps calling `elsewhere`

    def bypassing(task: dict[str, Any]) -> float:
        own_client.chat.completions.create(model="agent-model", messages=[{"role": "user", "content": task["question"]}])
        return 1.0

    store = ag.MemoryStore()
    console, out = captured()
    version = engine.version  # the session's engine: earlier tests may have trained it
    trained = (GRPO(GRPOConfig(**SMALL), local_engine=engine) if algorithm == "GRPO" else
               SFT(SFTConfig(steps=1, prompts_per_step=2, group_size=2, max_tokens=8), local_engine=engine))
    with pytest.raises(RuntimeError, match=f"{algorithm}: none of the step's 4 rewarded rollouts made a model call "
                       "through the gateway") as raised:
        ag.Trainer(trained, store=store, console=console).fit(bypassing, TASKS)
    assert "OpenAI(base_url=llm.base_url, api_key=llm.api_key)" in str(raised.value)
    assert f"warning: OPENAI_BASE_URL was {elsewhere} when the trainer started" in out.getvalue()
    rollouts = asyncio.run(store.query_rollouts(mode="train"))
    assert len(rollouts) == 4 and all(r.metadata[semconv.NO_MODEL_CALLS] for r in rollouts)
    assert engine.version == version  # nothing was trained


@pytest.mark.model
def test_an_agent_pinning_temperature_zero_trains_on_varied_groups_and_validates_greedily(engine: Any) -> None:
    @ag.rollout
    def pinned(task: dict[str, Any], llm: ag.LLM) -> float:
        client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}],
                                       temperature=0, max_tokens=300)  # as LangChain examples write it
        return 1.0

    store = ag.MemoryStore()
    config = GRPOConfig(**{**SMALL, "prompts_per_step": 1, "group_size": 4, "skip_uniform_groups": False})
    ag.Trainer(GRPO(config, local_engine=engine), store=store, runner_concurrency=4).fit(pinned, TASKS[:1], TASKS[1:2])

    def calls(mode: str) -> list[ag.types.Span]:
        rollouts = asyncio.run(store.query_rollouts(mode=mode))
        return [s for r in rollouts for s in asyncio.run(store.query_spans(r.rollout_id)) if semconv.is_llm_call(s)]

    train, val = calls("train"), calls("val")
    assert len(train) == 4 and len(val) == 2  # validated before the first step and after the last
    assert {s.attributes["gen_ai.request.temperature"] for s in train} == {1.0}
    assert {s.attributes["gen_ai.request.max_tokens"] for s in train + val} == {8}
    assert {s.attributes["gen_ai.request.temperature"] for s in val} == {0.0}
    assert {s.attributes[semconv.AGENT_REQUEST_PARAMS["temperature"]] for s in train + val} == {0}
    assert len({tuple(s.attributes[semconv.RESPONSE_TOKEN_IDS]) for s in train}) > 1  # the group varies


@pytest.mark.model
def test_groups_sampled_identically_for_several_steps_are_reported_once_with_the_likely_cause(engine: Any) -> None:
    @ag.rollout
    def pinned(task: dict[str, Any], llm: ag.LLM) -> float:
        OpenAI(base_url=llm.base_url, api_key=llm.api_key).chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["question"]}], temperature=0)
        return 1.0

    console, out = captured()
    config = GRPOConfig(**{**SMALL, "steps": IDENTICAL_STEPS + 1, "prompts_per_step": 1, "max_tokens": 4,
                           "sampling": "agent"})  # the agent's temperature=0 is kept
    ag.Trainer(GRPO(config, local_engine=engine), store="memory", console=console).fit(pinned, TASKS)
    assert out.getvalue().count(f"for {IDENTICAL_STEPS} steps in a row every group's rollouts sampled the same") == 1
    assert "temperature=0" in out.getvalue()


@pytest.mark.model
def test_grpo_stops_after_a_step_in_which_every_rollout_failed(engine: Any) -> None:
    def broken(task: dict[str, Any]) -> float:
        raise ValueError("the tool server is down")

    store = ag.MemoryStore()
    console, _ = captured()
    with pytest.raises(RuntimeError, match="GRPO stopped at step 1: every rollout failed") as raised:
        ag.Trainer(GRPO(GRPOConfig(**{**SMALL, "steps": 5}), local_engine=engine), store=store,
                   console=console).fit(broken, TASKS)
    assert "4× ValueError: the tool server is down" in str(raised.value)
    assert "agentgrad rollouts ls --store" in str(raised.value)
    assert len(asyncio.run(store.query_rollouts(mode="train"))) == 4  # one step, not five


@pytest.mark.model
def test_a_second_dev_on_the_same_store_file_serves_its_own_model(tmp_path: Any) -> None:
    @ag.rollout
    def agent(task: str, llm: ag.LLM) -> float:
        reply = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0).chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task}], max_tokens=2)
        return 1.0 if reply.choices else 0.0

    path = tmp_path / "run.db"
    first = ag.Trainer(store=path).dev(agent, ["Say hi."])
    second = ag.Trainer(store=path).dev(agent, ["Say bye."])  # the first run's gateway is gone
    assert first["train"].succeeded == second["train"].succeeded == 1
