"""Named agents of a multi-agent system: from `ag.agent` (or a route, or a header) through the runner and the
gateway to the stored spans, and from there to the training data of one agent only."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import openai
import pytest

import agentgrad as ag
from agentgrad import semconv
from agentgrad.adapters import llm_calls, to_chats, to_trajectories
from agentgrad.rollout.instrument import instrument_openai, uninstrument_openai
from agentgrad.rollout.naming import current_agent
from agentgrad.rollout.runner import Runner
from agentgrad.semconv import is_llm_call
from tests.conftest import Served


@pytest.fixture(autouse=True)
def uninstrumented() -> object:
    yield
    uninstrument_openai()


def ask(client: openai.OpenAI, model: str, text: str) -> str:
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
    return answer.choices[0].message.content or ""


def writer_and_critic(task: str, llm: ag.LLM) -> float:
    """Two agents in one rollout: the writer named by `ag.agent`, the critic by its own route."""
    with ag.agent("writer"):  # carried by instrument_openai() as the x-agentgrad-agent header
        draft = ask(openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0), llm.model, f"write {task}")
    critic = llm.for_agent("critic")  # …/rollouts/{r}/attempts/{a}/agents/critic/v1
    verdict = ask(openai.OpenAI(base_url=critic.base_url, api_key=critic.api_key, max_retries=0), critic.model,
                  f"judge {draft}")
    with ag.agent("writer"):
        ask(openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0), llm.model, f"revise {verdict}")
    return 1.0


async def test_a_two_agent_rollout_records_each_agents_name_and_trains_only_the_matched_one(served: Served) -> None:
    instrument_openai()
    await served.store.add_resources({"llm": ag.LLM(base_url=served.url + "/v1", model="policy", proxied=True)})
    (rollout,) = await served.store.enqueue_rollouts([{"input": "a haiku"}])

    await Runner(writer_and_critic, served.store, max_rollouts=1).run()  # flushes the gateway before it closes

    assert (await served.store.get_rollout(rollout.rollout_id)).status.value == "succeeded"
    spans = await served.store.query_spans(rollout.rollout_id)
    calls = sorted((s for s in spans if is_llm_call(s)), key=lambda s: s.start_time)
    assert [semconv.agent_name(s) for s in calls] == ["writer", "critic", "writer"]
    (root,) = [s for s in spans if s.name == semconv.ROLLOUT_SPAN]
    assert root.attributes[semconv.AGENT_NAME] == "writer_and_critic"  # the rollout's agent, on the rollout span

    writer = to_trajectories(spans, reward=1.0, agent_match="writer")
    writer_spans = {span_id for t in writer for span_id in t.span_ids}
    assert writer_spans == {calls[0].span_id, calls[2].span_id}
    decoded = [bytes(t.token_ids).decode() for t in writer]  # the fake upstream's token ids are UTF-8 bytes
    assert all("<user>judge" not in text for text in decoded)  # the critic's prompt is nowhere in the writer's data
    assert any("<user>write a haiku" in text for text in decoded) and any("<user>revise" in text for text in decoded)
    (critic,) = llm_calls(spans, agent_match="^critic$")
    assert critic.span.span_id == calls[1].span_id and critic.agent == "critic"
    assert [chat[0]["content"] for chat in to_chats(spans, agent_match="critic")] == ["judge echo: write a haiku"]


async def test_an_agent_in_another_process_names_itself_with_the_header_or_the_route(served: Served) -> None:
    rollout = await served.store.start_rollout("task")
    llm = ag.LLM(base_url=served.url + "/v1", model="policy", proxied=True)
    routed = llm.for_attempt(rollout.rollout_id, rollout.attempt.attempt_id)
    by_header = openai.OpenAI(base_url=routed.base_url, api_key="k", max_retries=0,
                              default_headers={semconv.AGENT_HEADER: "planner"})
    ask(by_header, "policy", "plan")
    by_route = llm.for_attempt(rollout.rollout_id, rollout.attempt.attempt_id, agent="sql writer")
    assert by_route.base_url.endswith("/agents/sql%20writer/v1")
    ask(openai.OpenAI(base_url=by_route.base_url, api_key="k", max_retries=0), "policy", "select")
    # the header wins over the route: it is set per call, the route only when the client was built
    ask(openai.OpenAI(base_url=by_route.base_url, api_key="k", max_retries=0,
                      default_headers={semconv.AGENT_HEADER: "reviewer"}), "policy", "review")
    await served.gateway.flush()
    calls = sorted((s for s in await served.store.query_spans(rollout.rollout_id) if is_llm_call(s)),
                   key=lambda s: s.start_time)
    assert [semconv.agent_name(s) for s in calls] == ["planner", "sql writer", "reviewer"]


async def test_calls_made_under_no_name_carry_none_and_are_matched_by_model_only(served: Served) -> None:
    rollout = await served.store.start_rollout("task")
    route = semconv.gateway_route(served.url + "/v1", rollout.rollout_id, rollout.attempt.attempt_id)
    ask(openai.OpenAI(base_url=route, api_key="k", max_retries=0), "policy", "plain")
    await served.gateway.flush()
    spans = await served.store.query_spans(rollout.rollout_id)
    (call,) = [s for s in spans if is_llm_call(s)]
    assert semconv.AGENT_NAME not in call.attributes
    assert len(llm_calls(spans, agent_match="^policy$")) == 1 and llm_calls(spans, agent_match="writer") == []


def test_agent_names_nest_and_follow_the_context_into_tasks_and_threads() -> None:
    assert current_agent() is None
    with ag.agent("outer"):
        with ag.agent("inner"):
            assert current_agent() == "inner"
        assert current_agent() == "outer"
        seen = contextvars.copy_context().run(current_agent)

        async def in_task() -> str | None:
            return await asyncio.to_thread(current_agent)

        assert asyncio.run(in_task()) == "outer" == seen
    assert current_agent() is None


def test_agent_is_a_decorator_of_sync_and_async_functions() -> None:
    @ag.agent("sync_one")
    def sync_one() -> str | None:
        return current_agent()

    @ag.agent("async_one")
    async def async_one() -> str | None:
        return current_agent()

    assert sync_one() == "sync_one" and asyncio.run(async_one()) == "async_one" and current_agent() is None
    assert sync_one.__name__ == "sync_one"


@pytest.mark.parametrize("bad", ["", "  ", "a/b", 3])
def test_an_agent_name_must_fit_in_a_route(bad: object) -> None:
    with pytest.raises(ValueError, match="agent name"):
        ag.agent(bad)  # type: ignore[arg-type]


async def test_spans_emitted_under_an_agent_name_carry_it(served: Served) -> None:
    await served.store.enqueue_rollouts([{"input": "x"}])

    def agent(task: str) -> None:
        with ag.agent("judge"):
            ag.emit_reward(0.5)
        ag.emit_message("unnamed")

    await Runner(agent, served.store, max_rollouts=1).run()
    (rollout,) = await served.store.query_rollouts()
    spans = {s.name: s for s in await served.store.query_spans(rollout.rollout_id)}
    assert semconv.agent_name(spans[semconv.REWARD_SPAN]) == "judge"
    assert semconv.agent_name(spans[semconv.MESSAGE_SPAN]) is None
    assert semconv.agent_name(spans[semconv.ROLLOUT_SPAN]).endswith("agent")  # the function's qualified name


def test_the_gateway_tells_the_local_engine_which_agent_calls_and_no_other_upstream(
    upstream: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The built-in engine serves each agent by its LoRA adapter (`engine/adapters.py`), so it hears the agent's
    name (percent-encoded: a header is latin-1); a hosted API is not told the names of a system's agents."""
    from agentgrad.gateway import Backend, Gateway
    from agentgrad.serving import ServerThread
    from agentgrad.store import MemoryStore
    from tests.conftest import UPSTREAM_KEY

    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    backends = {
        name: Backend(upstream.url, api_key_env="FAKE_UPSTREAM_KEY", system=system)
        for name, system in (("engine", "agentgrad"), ("hosted", "openai"))
    }
    with ServerThread(Gateway(MemoryStore(), backends, retry_backoff_s=0.001)) as server:
        for model in ("engine", "hosted"):
            route = semconv.gateway_route(server.url + "/v1", agent="réviseur 2")
            ask(openai.OpenAI(base_url=route, api_key="unused", max_retries=0), model, "hello")
    engine_call, hosted_call = upstream.fake.headers[-2:]
    assert engine_call[semconv.AGENT_HEADER] == "r%C3%A9viseur%202"
    assert semconv.AGENT_HEADER not in hosted_call
