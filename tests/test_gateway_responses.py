"""`/v1/responses` through the gateway: relayed as the upstream sent it, recorded like a chat completion with
its token ids, and turned into trajectories; to the fake upstream and to the real engine (marked `model`)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from agentgrad.adapters import to_chats, to_trajectories
from agentgrad.gateway import Gateway
from agentgrad.semconv import is_llm_call
from agentgrad.store import MemoryStore
from agentgrad.types import Span
from tests.conftest import Served
from tests.fake_upstream import VERSION, logprob, render


@pytest.fixture(scope="module")
def engine(tiny_engine: Any) -> Any:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine

ADD = {"type": "function", "name": "add", "description": "Add two integers",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"]}}


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="sk-agent", max_retries=0)


async def llm_spans(store: MemoryStore, gateway: Gateway, rollout_id: str | None) -> list[Span]:
    await gateway.flush()
    return sorted((s for s in await store.query_spans(rollout_id) if is_llm_call(s)), key=lambda s: s.start_time)


async def test_a_responses_call_is_relayed_as_sent_and_recorded_with_its_token_ids(served: Served) -> None:
    rollout = await served.store.start_rollout("task")
    route = f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"
    reply = client(route).responses.create(model="policy", instructions="be brief", input="hi there",
                                           temperature=0.5, max_output_tokens=20)
    assert reply.output_text == "echo: hi there"
    assert "token_ids" not in (reply.model_extra or {})  # what the gateway asked for is not passed on

    (span,) = await llm_spans(served.store, served.gateway, rollout.rollout_id)
    a = span.attributes
    assert span.name == "chat policy" and a["gen_ai.operation.name"] == "chat" and a["agentgrad.llm.api"] == "responses"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    assert json.loads(a["gen_ai.input.messages"]) == messages
    assert json.loads(a["gen_ai.output.messages"]) == [{"role": "assistant", "content": "echo: hi there"}]
    assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.max_tokens"] == 20
    assert a["agentgrad.llm.prompt_token_ids"] == list(render(messages).encode())
    assert bytes(a["agentgrad.llm.response_token_ids"]).decode() == "echo: hi there"
    assert a["agentgrad.llm.response_logprobs"] == [logprob(b) for b in b"echo: hi there"]
    assert a["gen_ai.response.finish_reasons"] == ["stop"] and a["agentgrad.llm.weights_version"] == VERSION
    assert a["gen_ai.usage.input_tokens"] == len(render(messages)) and a["gen_ai.usage.output_tokens"] == 14
    assert "agentgrad.llm.token_ids_absent" not in a


async def test_a_streamed_responses_call_reaches_the_client_event_by_event_and_is_recorded_whole(served: Served) -> None:
    events = list(client(served.url + "/v1").responses.create(model="policy", input="a longer question", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert deltas == "echo: a longer question" and kinds.count("response.output_text.delta") > 1
    assert "token_ids" not in (events[-1].response.model_extra or {})  # type: ignore[union-attr]

    (span,) = await llm_spans(served.store, served.gateway, None)
    a = span.attributes
    assert a["agentgrad.llm.stream"] is True and a["agentgrad.llm.time_to_first_token_ms"] > 0
    assert bytes(a["agentgrad.llm.response_token_ids"]).decode() == "echo: a longer question"
    assert json.loads(a["gen_ai.output.messages"])[0]["content"] == "echo: a longer question"


async def test_function_calls_and_their_outputs_are_recorded_as_tool_calls_and_train_as_one_trajectory(
    served: Served,
) -> None:
    rollout = await served.store.start_rollout("task")
    oai = client(f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1")
    first = oai.responses.create(model="policy", input="What is 12 plus 30?", tools=[ADD])  # type: ignore[list-item]
    (call,) = [item for item in first.output if item.type == "function_call"]
    history: list[Any] = [{"role": "user", "content": "What is 12 plus 30?"}, call.model_dump(exclude_none=True),
                          {"type": "function_call_output", "call_id": call.call_id, "output": "42"}]
    streamed = list(oai.responses.create(model="policy", input=history, tools=[ADD], stream=True))  # type: ignore[list-item]
    assert streamed[-1].response.output_text == "Answer: 42"  # type: ignore[union-attr]

    asked, answered = await llm_spans(served.store, served.gateway, rollout.rollout_id)
    assert asked.attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]
    (message,) = json.loads(asked.attributes["gen_ai.output.messages"])
    assert message["tool_calls"] == [{"id": "call_1", "type": "function",
                                      "function": {"name": "add", "arguments": '{"a": 12, "b": 30}'}}]
    assert json.loads(answered.attributes["gen_ai.input.messages"])[1:] == [
        {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]
    spans = await served.store.query_spans(rollout.rollout_id)
    trajectories = to_trajectories(spans, reward=1.0)
    assert len(trajectories) == 2  # the fake renders a call's arguments, not its JSON: no token prefix to merge on
    assert [bytes(t.token_ids[t.prompt_length :]).decode() for t in trajectories] == ['{"a": 12, "b": 30}', "Answer: 42"]
    (chat,) = to_chats(spans)
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "assistant"]
    assert chat[1]["tool_calls"][0]["function"]["name"] == "add" and chat[-1]["content"] == "Answer: 42"


# ----------------------------------------------------------------------------- the engine (the tiny model)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_responses_through_the_gateway_to_the_engine_record_the_sampled_token_ids(
    engine: Any, engine_gateway: tuple[str, MemoryStore, Gateway], stream: bool
) -> None:
    url, store, gateway = engine_gateway
    rollout = await store.start_rollout("task")
    oai = client(f"{url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1")
    kwargs: dict[str, Any] = dict(model="policy", instructions="Answer in one word.", input="Capital of France?",
                                  temperature=0, max_output_tokens=12)
    if stream:
        events = list(oai.responses.create(**kwargs, stream=True))
        text = events[-1].response.output_text  # type: ignore[union-attr]
        assert "token_ids" not in (events[-1].response.model_extra or {})  # type: ignore[union-attr]
    else:
        reply = oai.responses.create(**kwargs)
        text = reply.output_text
        assert "token_ids" not in (reply.model_extra or {})
    (span,) = await llm_spans(store, gateway, rollout.rollout_id)
    a = span.attributes
    assert a["agentgrad.llm.api"] == "responses" and a["agentgrad.llm.weights_version"] == engine.version
    ids = a["agentgrad.llm.response_token_ids"]
    assert engine.tokenizer.decode(ids, skip_special_tokens=True) == text
    assert len(a["agentgrad.llm.response_logprobs"]) == len(ids)
    assert a["agentgrad.llm.prompt_token_ids"] == engine.chat_prompt_ids(
        [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"}])
    (trajectory,) = to_trajectories(await store.query_spans(rollout.rollout_id), reward=1.0)
    assert trajectory.token_ids[trajectory.prompt_length :] == ids and trajectory.response_length == len(ids)


async def test_the_openai_agents_sdk_on_its_defaults_runs_a_tool_agent_through_the_gateway_recorded(
    served: Served,
) -> None:
    import agents

    agents.set_tracing_disabled(True)
    rollout = await served.store.start_rollout("task")
    route = f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    # closed here: a client left to the garbage collector schedules its close on whatever loop then runs (a later test's)
    async with openai.AsyncOpenAI(base_url=route, api_key="sk-agent", max_retries=0) as client:
        agent = agents.Agent(name="adder", instructions="Use the tool.", tools=[add],
                             model=agents.OpenAIResponsesModel("policy", client))
        result = await agents.Runner.run(agent, "What is 12 plus 30?", max_turns=3)
    assert result.final_output == "Answer: 42"

    asked, answered = await llm_spans(served.store, served.gateway, rollout.rollout_id)
    assert asked.attributes["agentgrad.llm.api"] == answered.attributes["agentgrad.llm.api"] == "responses"
    assert json.loads(asked.attributes["gen_ai.output.messages"])[0]["tool_calls"][0]["function"]["name"] == "add"
    assert json.loads(answered.attributes["gen_ai.input.messages"])[-1] == {
        "role": "tool", "tool_call_id": "call_1", "content": "42"}
    assert all(s.attributes["agentgrad.llm.response_token_ids"] for s in (asked, answered))
