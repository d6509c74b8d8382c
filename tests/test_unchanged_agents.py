"""Agents that build `OpenAI()` with no arguments train unchanged: the trainer's gateway has an address known
before `fit`, and the runners' environment (threads: one URL, calls routed by headers; processes: the
attempt's route) points there."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import agentgrad as ag
from agentgrad.algorithms.base import Algorithm, RunContext
from agentgrad.gateway import Backend, Gateway
from agentgrad.semconv import is_llm_call
from agentgrad.serving import ServerThread, free_port
from tests.fake_upstream import FakeUpstream
from tests.process_agents import bare_openai, unchanged_anthropic_calc, unchanged_calc


class ServesAGateway(Algorithm[list[ag.Rollout]]):
    """What GRPO does around its model, with the fake upstream for a model: a gateway on the trainer's port."""

    serves_gateway = True

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream

    async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> list[ag.Rollout]:
        self.bind(ctx)
        with ServerThread(Gateway(ctx.store, default=Backend(self.upstream, system="vllm")), port=ctx.gateway_port) as gw:
            llm = ag.LLM(base_url=gw.url + "/v1", model="policy", proxied=True)  # flushed before each attempt ends
            return await self.run_rollouts(train_data, mode="train", resources_id=await self.publish({"llm": llm}))


@pytest.fixture
def fake_url() -> Iterator[str]:
    with ServerThread(FakeUpstream().app) as server:
        yield server.url + "/v1"


def test_the_trainer_s_gateway_address_is_known_when_it_is_built() -> None:
    port = free_port()
    assert ag.Trainer(store="memory", gateway_port=port).gateway_url == f"http://127.0.0.1:{port}/v1"
    chosen = ag.Trainer(store="memory")
    assert chosen.gateway_url.startswith("http://127.0.0.1:") and chosen.gateway_port > 0


@pytest.mark.parametrize("strategy", ["threads", pytest.param("processes", marks=pytest.mark.slow)])
def test_an_agent_building_openai_with_no_arguments_is_routed_to_each_attempt(fake_url: str, strategy: str) -> None:
    store = ag.MemoryStore() if strategy == "threads" else ag.SqliteStore(":memory:")
    trainer = ag.Trainer(ServesAGateway(fake_url), store=store, strategy=strategy,  # type: ignore[arg-type]
                         n_runners=2, runner_concurrency=3)
    rollouts = trainer.fit(bare_openai, [{"q": f"question {i}"} for i in range(8)])
    assert [r.status.value for r in rollouts] == ["succeeded"] * 8

    async def calls_of(rollout: ag.Rollout) -> list[Any]:
        return [s for s in await trainer.store.query_spans(rollout.rollout_id) if is_llm_call(s)]

    for rollout in rollouts:  # each call in its own attempt: headers (threads) or the attempt's route (processes)
        (span,) = asyncio.run(calls_of(rollout))
        assert span.attributes["gen_ai.input.messages"].count(rollout.input["q"]) == 1
        assert span.attempt_id is not None and span.attributes["agentgrad.llm.response_token_ids"]


def test_a_missing_llm_says_how_to_give_one() -> None:
    @ag.rollout
    def agent(task: str, model: ag.LLM) -> float:
        return 1.0

    store = ag.MemoryStore()
    queued = asyncio.run(store.enqueue_rollout("t"))
    asyncio.run(ag.Runner(agent, store, max_rollouts=1).run())
    (attempt,) = asyncio.run(store.query_attempts(queued.rollout_id))
    assert "give one: Trainer(resources={'model': ag.LLM(...)})" in (attempt.error or "")


# ----------------------------------------------------------------------------- the engine (the tiny model)


@pytest.mark.parametrize(("strategy", "agent"), [("threads", unchanged_calc),
                                                 pytest.param("processes", unchanged_calc, marks=pytest.mark.slow),
                                                 ("threads", unchanged_anthropic_calc),
                                                 pytest.param("processes", unchanged_anthropic_calc, marks=pytest.mark.slow)])
def test_an_unchanged_agent_trains_for_a_grpo_step_with_no_failed_rollouts(
    strategy: str, agent: Any, fresh_tiny_engine: Any
) -> None:
    """On the openai SDK and on the anthropic SDK (`Anthropic()` reads the gateway from ANTHROPIC_BASE_URL)."""
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig

    engine = fresh_tiny_engine
    grpo = GRPO(GRPOConfig(steps=1, prompts_per_step=2, group_size=2, max_tokens=8, val_every=0,
                           skip_uniform_groups=False), local_engine=engine)
    tasks = [{"question": f"What is {a} + {b}?", "answer": a + b} for a, b in [(12, 30), (7, 8), (41, 1), (5, 5)]]
    trainer = ag.Trainer(grpo, store="memory" if strategy == "threads" else None, strategy=strategy,  # type: ignore[arg-type]
                         n_runners=2, runner_concurrency=2)
    result = trainer.fit(agent, tasks)
    (step,) = result.history
    assert step["train/failed_rollouts"] == 0 and step["train/response_length"] > 0
    assert engine.version == 1  # the step trained on the recorded token ids and published new weights


def test_dev_serves_the_local_model_to_an_agent_that_asks_for_an_llm_and_has_none(tiny_default_models: Path) -> None:
    @ag.rollout
    def agent(task: str, llm: ag.LLM) -> float:
        from openai import OpenAI

        reply = OpenAI(base_url=llm.base_url, api_key=llm.api_key).chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task}], max_tokens=4)
        return 1.0 if reply.choices[0].message.content is not None else 0.0

    results = ag.Trainer(store="memory").dev(agent, ["Say hi.", "Say bye."])
    assert results["train"].succeeded == 2
