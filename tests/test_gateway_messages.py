"""`/v1/messages` (Anthropic's Messages API) through the gateway, with the real `anthropic` SDK: relayed to an
Anthropic-compatible upstream with its headers, streamed and not, tool use round trips, errors in Anthropic's
shape, and every call recorded as a chat span (with token ids where the upstream returns them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import pytest

from agentgrad.adapters import to_chats
from agentgrad.gateway import Backend, Gateway
from agentgrad.semconv import is_llm_call
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from agentgrad.types import Span
from tests.fake_anthropic import KEY, LOGPROB, FakeAnthropic, render

ADD = {
    "name": "add",
    "description": "Add two integers",
    "input_schema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


@dataclass
class Served:
    gateway: Gateway
    url: str
    store: MemoryStore
    fake: FakeAnthropic


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", KEY)
    fake = FakeAnthropic()
    store = MemoryStore()
    with ServerThread(fake.app) as upstream:
        backends = {
            "claude": Backend(upstream.url + "/v1", api_key_env="FAKE_ANTHROPIC_KEY", system="anthropic"),
            "claude-ids": Backend(upstream.url + "/v1", api_key_env="FAKE_ANTHROPIC_KEY", system="anthropic",
                                  token_ids=True),
            "claude-keyless": Backend(upstream.url + "/v1", system="anthropic"),
        }
        gateway = Gateway(store, backends, retry_backoff_s=0.001)
        with ServerThread(gateway) as server:
            yield Served(gateway, server.url, store, fake)


def client(base_url: str, **options: object) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="sk-agent", max_retries=0, **options)  # type: ignore[arg-type]


async def llm_spans(served: Served, rollout_id: str | None) -> list[Span]:
    await served.gateway.flush()
    spans = await served.store.query_spans(rollout_id)
    return sorted((s for s in spans if is_llm_call(s)), key=lambda s: s.start_time)


async def test_a_message_is_relayed_with_the_upstreams_key_and_the_agents_version_and_recorded_as_a_chat(
    served: Served,
) -> None:
    rollout = await served.store.start_rollout("task")
    route = f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/agents/helper"
    reply = client(route, default_headers={"anthropic-beta": "tools-2024"}).messages.create(
        model="claude", system="be brief", max_tokens=64, temperature=0.5,
        messages=[{"role": "user", "content": "hi there"}],
    )
    assert reply.content[0].type == "text" and reply.content[0].text == "echo: hi there"
    assert reply.stop_reason == "end_turn" and reply.usage.output_tokens == 14

    sent = served.fake.headers[-1]
    assert sent["x-api-key"] == KEY and "authorization" not in sent  # the gateway's key, never the agent's
    assert sent["anthropic-version"] == "2023-06-01" and sent["anthropic-beta"] == "tools-2024"
    assert "return_token_ids" not in served.fake.requests[-1]  # a hosted API gets the request as it was

    (span,) = await llm_spans(served, rollout.rollout_id)
    a = span.attributes
    assert span.name == "chat claude" and a["agentgrad.llm.api"] == "messages" and a["gen_ai.system"] == "anthropic"
    assert a["agentgrad.agent.name"] == "helper"
    assert json.loads(a["gen_ai.input.messages"]) == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}
    ]
    assert json.loads(a["gen_ai.output.messages"]) == [{"role": "assistant", "content": "echo: hi there"}]
    assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.max_tokens"] == 64
    assert a["gen_ai.response.finish_reasons"] == ["stop"] and a["gen_ai.usage.output_tokens"] == 14
    assert a["gen_ai.response.id"] == reply.id
    assert a["agentgrad.llm.token_ids_absent"] == "not_requested"
    assert KEY not in json.dumps(a)


async def test_stop_sequences_and_max_tokens_reach_the_upstream_and_their_stop_reasons_are_recorded(
    served: Served,
) -> None:
    oai = client(served.url)
    stopped = oai.messages.create(model="claude", max_tokens=64, stop_sequences=["there"],
                                  messages=[{"role": "user", "content": "hi there"}])
    cut = oai.messages.create(model="claude", max_tokens=5, messages=[{"role": "user", "content": "hi there"}])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "there"
    assert cut.stop_reason == "max_tokens" and cut.content[0].text == "echo:"  # type: ignore[union-attr]
    first, second = await llm_spans(served, None)
    assert first.attributes["gen_ai.request.stop_sequences"] == ["there"]
    assert first.attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert second.attributes["gen_ai.response.finish_reasons"] == ["length"]


async def test_a_streamed_message_reaches_the_agent_event_by_event_and_is_recorded_whole(served: Served) -> None:
    with client(served.url).messages.stream(
        model="claude", max_tokens=64, messages=[{"role": "user", "content": "a longer question"}]
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == "echo: a longer question" and len(pieces) > 1
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 23

    (span,) = await llm_spans(served, None)
    a = span.attributes
    assert a["agentgrad.llm.stream"] is True and a["agentgrad.llm.time_to_first_token_ms"] > 0
    assert json.loads(a["gen_ai.output.messages"]) == [{"role": "assistant", "content": "echo: a longer question"}]
    assert a["gen_ai.usage.output_tokens"] == 23 and a["gen_ai.response.finish_reasons"] == ["stop"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_use_round_trip_is_recorded_as_tool_calls_and_a_tool_message(
    served: Served, stream: bool
) -> None:
    rollout = await served.store.start_rollout("task")
    sdk = client(f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}")
    question = {"role": "user", "content": "What is 12 plus 30?"}
    if stream:
        with sdk.messages.stream(model="claude", max_tokens=64, tools=[ADD], messages=[question]) as events:  # type: ignore[list-item]
            first = events.get_final_message()
    else:
        first = sdk.messages.create(model="claude", max_tokens=64, tools=[ADD], messages=[question])  # type: ignore[list-item]
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.name == "add" and use.input == {"a": 12, "b": 30}
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "42"}
    history = [question, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]
    second = sdk.messages.create(model="claude", max_tokens=64, tools=[ADD], messages=history)  # type: ignore[list-item, arg-type]
    assert second.content[0].text == "The answer is 42."  # type: ignore[union-attr]

    call_span, answer_span = await llm_spans(served, rollout.rollout_id)
    call = {"id": use.id, "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": 12, "b": 30})}}
    assert json.loads(call_span.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "content": None, "tool_calls": [call]}
    ]
    assert call_span.attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert json.loads(call_span.attributes["gen_ai.tool.definitions"]) == [
        {"type": "function", "function": {"name": "add", "description": "Add two integers",
                                          "parameters": ADD["input_schema"]}}
    ]
    assert json.loads(answer_span.attributes["gen_ai.input.messages"]) == [
        {"role": "user", "content": "What is 12 plus 30?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": use.id, "content": "42"},
    ]
    (chat,) = to_chats([call_span, answer_span])  # the adapters read Messages calls as they read chat calls
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "assistant"]
    assert chat[-1]["content"] == "The answer is 42."


@pytest.mark.parametrize("stream", [False, True])
async def test_token_ids_from_an_upstream_that_returns_them_are_recorded_and_stripped_from_the_answer(
    served: Served, stream: bool
) -> None:
    sdk = client(served.url)
    asked = {"model": "claude-ids", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        raw = list(sdk.messages.create(**asked, stream=True))  # type: ignore[call-overload]
        delta = next(e for e in raw if e.type == "message_delta")
        assert "token_ids" not in (delta.model_extra or {})
    else:
        reply = sdk.messages.create(**asked)  # type: ignore[call-overload]
        assert "token_ids" not in (reply.model_extra or {}) and "prompt_token_ids" not in (reply.model_extra or {})
    assert served.fake.requests[-1]["return_token_ids"] is True

    (span,) = await llm_spans(served, None)
    a = span.attributes
    assert a["agentgrad.llm.prompt_token_ids"] == list(render({k: v for k, v in asked.items()}).encode())
    assert bytes(a["agentgrad.llm.response_token_ids"]).decode() == "echo: hi"
    assert a["agentgrad.llm.response_logprobs"] == [LOGPROB] * 8
    assert "agentgrad.llm.token_ids_absent" not in a


async def test_errors_reach_the_sdk_in_anthropics_shape_and_are_recorded(served: Served) -> None:
    sdk = client(served.url)
    hello = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.NotFoundError) as unknown:
        sdk.messages.create(model="gpt-9", max_tokens=8, messages=hello)  # type: ignore[arg-type]
    assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "gpt-9" in unknown.value.body["error"]["message"]  # type: ignore[index]

    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk.messages.create(model="claude", max_tokens=8, messages=hello, stop_sequences="END")  # type: ignore[arg-type]
    assert "stop_sequences" in bad.value.body["error"]["message"]  # type: ignore[index]
    assert not any(r.get("stop_sequences") == "END" for r in served.fake.requests)  # refused before the upstream

    with pytest.raises(anthropic.AuthenticationError) as keyless:
        sdk.messages.create(model="claude-keyless", max_tokens=8, messages=hello)  # type: ignore[arg-type]
    assert keyless.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert "rejected the gateway's credentials" in keyless.value.body["error"]["message"]  # type: ignore[index]

    served.fake.overloaded = 10  # past the gateway's retries: the agent hears the upstream's own 529
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        sdk.messages.create(model="claude", max_tokens=8, messages=hello)  # type: ignore[arg-type]
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]

    spans = await llm_spans(served, None)
    assert [s.attributes.get("error.type") for s in spans] == ["model_not_found", "invalid_request", "401", "529"]
    assert [s.attributes.get("http.response.status_code") for s in spans] == [404, 400, 401, 529]
    assert all(s.status.code == "ERROR" for s in spans)


async def test_a_529_is_retried_by_the_gateway_and_the_agent_gets_the_answer(served: Served) -> None:
    served.fake.overloaded = 2
    reply = client(served.url).messages.create(model="claude", max_tokens=8,
                                               messages=[{"role": "user", "content": "hi"}])
    assert reply.content[0].text == "echo: hi"  # type: ignore[union-attr]
    assert len(served.fake.requests) == 3


async def test_a_gateway_token_is_accepted_as_the_anthropic_sdks_x_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", KEY)
    fake = FakeAnthropic()
    with ServerThread(fake.app) as upstream:
        backend = Backend(upstream.url + "/v1", api_key_env="FAKE_ANTHROPIC_KEY", system="anthropic")
        gateway = Gateway(MemoryStore(), {"claude": backend}, token="gw-token-0123456789abcdef")
        with ServerThread(gateway) as server:
            hello = [{"role": "user", "content": "hi"}]
            ok = anthropic.Anthropic(base_url=server.url, api_key="gw-token-0123456789abcdef", max_retries=0)
            assert ok.messages.create(model="claude", max_tokens=8, messages=hello).content  # type: ignore[arg-type]
            with pytest.raises(anthropic.AuthenticationError):
                client(server.url).messages.create(model="claude", max_tokens=8, messages=hello)  # type: ignore[arg-type]
