"""The span of a call whose reply held tool calls names the parser that read them, and says where agentgrad's
parser reads the reply's raw text differently (`agentgrad.gateway.tool_parsers`, `semconv.TOOL_CALLS_PARSER`).

Against fake OpenAI-compatible upstreams that answer the bodies a test gives them (a hosted API parsing its own
way, a vLLM-like server with its parser), and against the engine, which names its own parser.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from agentgrad import semconv as sc
from agentgrad.gateway import Backend, Gateway
from agentgrad.gateway.upstreams import parse_backend
from agentgrad.policy.vllm_server import tool_parser_of
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from agentgrad.types import Span
from tests.fake_upstream import FakeUpstream


@pytest.fixture(scope="module")
def engine(tiny_engine: Any) -> Any:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine

CALCULATE = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
ASK = [{"role": "user", "content": "What is 2 + 2? Use the calculator."}]


@dataclass
class Front:
    """A gateway with two fake upstreams behind it: `hosted` (an OpenAI-like API) and `vllm` (hermes parser)."""

    url: str
    store: MemoryStore
    gateway: Gateway
    hosted: FakeUpstream
    vllm: FakeUpstream


@pytest.fixture
def front() -> Iterator[Front]:
    hosted, vllm = FakeUpstream(), FakeUpstream()
    with ServerThread(hosted.app) as a, ServerThread(vllm.app) as b:
        store = MemoryStore()
        gateway = Gateway(store, {"hosted": Backend(a.url + "/v1"),
                                  "vllm": Backend(b.url + "/v1", system="vllm", tool_parser="hermes")})
        with ServerThread(gateway) as server:
            yield Front(server.url, store, gateway, hosted, vllm)


def call(name: str, expression: str) -> dict[str, Any]:
    return {"id": "call_1", "type": "function",
            "function": {"name": name, "arguments": json.dumps({"expression": expression})}}


def answer(message: dict[str, Any], raw: str | None = None) -> dict[str, Any]:
    """A chat completion holding `message`; `raw`: the text the model wrote, as per-token logprobs (a byte each)."""
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", **message},
                              "finish_reason": "tool_calls" if message.get("tool_calls") else "stop", "logprobs": None}
    if raw is not None:
        choice["logprobs"] = {"content": [{"token": chr(b), "logprob": -0.1, "bytes": [b], "top_logprobs": []}
                                          for b in raw.encode()]}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]}


async def recorded(front: Front, model: str, **body: Any) -> Span:
    """Send one chat call through the gateway; its span."""
    reply = httpx.post(f"{front.url}/v1/chat/completions", timeout=30,
                       json={"model": model, "messages": ASK, "tools": [CALCULATE], **body})
    assert reply.status_code == 200, reply.text
    await front.gateway.flush()
    (span,) = [s for s in await front.store.query_spans(None) if sc.is_llm_call(s)]
    return span


HERMES_2_PLUS_2 = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 2"}}\n</tool_call>'


async def test_a_call_a_hosted_upstream_parsed_its_own_way_is_recorded_as_upstream(front: Front) -> None:
    front.hosted.answers.append(answer({"content": None, "tool_calls": [call("calculate", "2 + 2")]}))
    span = await recorded(front, "hosted")
    assert span.attributes[sc.TOOL_CALLS_PARSER] == sc.UPSTREAM_PARSER
    assert sc.TOOL_CALLS_PARSER_DISAGREES not in span.attributes  # no raw text to read again: it cannot tell


async def test_a_vllm_upstream_names_its_parser_and_agrees_with_ours_on_the_same_text(front: Front) -> None:
    front.vllm.answers.append(answer({"content": None, "tool_calls": [call("calculate", "2 + 2")]}, HERMES_2_PLUS_2))
    span = await recorded(front, "vllm")
    assert span.attributes[sc.TOOL_CALLS_PARSER] == "vllm:hermes"
    assert sc.TOOL_CALLS_PARSER_DISAGREES not in span.attributes and sc.TOOL_CALLS_OTHER_PARSE not in span.attributes


async def test_a_reply_whose_raw_text_our_parser_reads_as_another_call_is_flagged_with_our_reading(
    front: Front,
) -> None:
    written = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
    front.vllm.answers.append(answer({"content": None, "tool_calls": [call("calculate", "2 + 2")]}, written))
    span = await recorded(front, "vllm")
    assert span.attributes[sc.TOOL_CALLS_PARSER] == "vllm:hermes"
    assert span.attributes[sc.TOOL_CALLS_PARSER_DISAGREES] is True
    assert json.loads(span.attributes[sc.TOOL_CALLS_OTHER_PARSE]) == [
        {"choice": 0, "parser": "engine:hermes", "tool_calls": [{"name": "calculate", "arguments": {"expression": "2 + 3"}}],
         "error": None}]


def vllm_logprobs(pieces: list[str]) -> dict[str, Any]:
    """Per-token logprobs as vLLM writes them: each token decoded on its own, its bytes those of that string."""
    return {"content": [{"token": p, "logprob": -0.1, "bytes": list(p.encode()), "top_logprobs": []} for p in pieces]}


@pytest.mark.parametrize("written", ["2 + 2 \U0001f99c", "2 + 2 \ufffd"], ids=["split emoji", "written U+FFFD"])
async def test_a_character_split_across_tokens_is_not_flagged_but_a_replacement_the_model_wrote_is_read(
    front: Front, written: str
) -> None:
    """Qwen's tokenizer splits an emoji over two tokens, which vLLM decodes one by one into two U+FFFD: the raw text
    lost the character, so it is not read again; a U+FFFD the model wrote itself is in the reply decoded whole."""
    head, tail = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 2 ', '"}}\n</tool_call>'
    split = ["\ufffd", "\ufffd"] if written.endswith("\U0001f99c") else ["\ufffd"]
    choice_calls = [call("calculate", "2 + 3 \ufffd" if split == ["\ufffd"] else written)]
    body = answer({"content": None, "tool_calls": choice_calls})
    body["choices"][0]["logprobs"] = vllm_logprobs([head, *split, tail])
    front.vllm.answers.append(body)
    span = await recorded(front, "vllm")
    assert span.attributes[sc.TOOL_CALLS_PARSER] == "vllm:hermes"
    if written.endswith("\U0001f99c"):
        assert sc.TOOL_CALLS_PARSER_DISAGREES not in span.attributes
    else:  # read again: the text says 2 + 2, the upstream's call 2 + 3
        (other,) = json.loads(span.attributes[sc.TOOL_CALLS_OTHER_PARSE])
        assert other["tool_calls"][0]["arguments"] == {"expression": "2 + 2 \ufffd"}


async def test_a_call_our_parser_cannot_read_from_the_raw_text_is_flagged_with_why(front: Front) -> None:
    written = '```json\n{"name": "calculate", "arguments": {"expression": "2 + 2"}}\n```'  # a parser lenient on shape
    front.vllm.answers.append(answer({"content": None, "tool_calls": [call("calculate", "2 + 2")]}, written))
    span = await recorded(front, "vllm")
    assert span.attributes[sc.TOOL_CALLS_PARSER_DISAGREES] is True
    (other,) = json.loads(span.attributes[sc.TOOL_CALLS_OTHER_PARSE])
    assert other["parser"] is None and other["tool_calls"] == [] and "code block" in other["error"]


async def test_a_text_reply_that_our_parser_reads_as_a_call_is_flagged(front: Front) -> None:
    front.hosted.answers.append(answer({"content": '[calculate(expression="2 + 2")]'}))  # SmolLM2's pythonic call, as text
    span = await recorded(front, "hosted")
    assert span.attributes[sc.TOOL_CALLS_PARSER] == sc.UPSTREAM_PARSER
    assert span.attributes[sc.TOOL_CALLS_PARSER_DISAGREES] is True
    (other,) = json.loads(span.attributes[sc.TOOL_CALLS_OTHER_PARSE])
    assert other["parser"] == "engine:pythonic" and other["tool_calls"][0]["arguments"] == {"expression": "2 + 2"}


@pytest.mark.parametrize("content, choice", [("Answer: 4", "auto"), ('[calculate(expression="2 + 2")]', "none")],
                         ids=["plain text", "tools off"])
async def test_a_plain_text_reply_or_one_with_tools_off_gets_no_parser_attributes(
    front: Front, content: str, choice: str
) -> None:
    front.hosted.answers.append(answer({"content": content}))
    span = await recorded(front, "hosted", tool_choice=choice)
    assert not {k for k in span.attributes if k.startswith("agentgrad.tool_calls.")}


# ----------------------------------------------------------------------------- Responses and Messages


RESPONSES_TOOL = {"type": "function", **CALCULATE["function"]}
MESSAGES_TOOL = {"name": "calculate", "description": "Evaluate", "input_schema": CALCULATE["function"]["parameters"]}


def function_call(expression: str) -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "calculate",
            "arguments": json.dumps({"expression": expression}), "status": "completed"}


def text_item(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def response(item: dict[str, Any], raw: str | None = None) -> dict[str, Any]:
    """A Responses answer holding `item`; `raw`: vLLM's raw turn (`enable_response_messages`), one token a byte."""
    body: dict[str, Any] = {"id": "resp_1", "object": "response", "created_at": 0, "status": "completed", "model": "m",
                            "output": [item]}
    if raw is not None:
        body["input_messages"] = [{"message": "<prompt>", "tokens": [1, 2, 3], "type": "raw_message_tokens"}]
        body["output_messages"] = [{"message": raw, "tokens": list(raw.encode()), "type": "raw_message_tokens"}]
    return body


def anthropic_message(*blocks: dict[str, Any]) -> dict[str, Any]:
    reason = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": list(blocks),
            "stop_reason": reason, "usage": {"input_tokens": 3, "output_tokens": 5}}


async def recorded_on(front: Front, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], Span]:
    """Send one call through the gateway; what the agent got, and the call's span."""
    reply = httpx.post(front.url + path, timeout=30, json=body)
    assert reply.status_code == 200, reply.text
    await front.gateway.flush()
    (span,) = [s for s in await front.store.query_spans(None) if sc.is_llm_call(s)]
    return reply.json(), span


def ask_responses(model: str, **body: Any) -> dict[str, Any]:
    return {"model": model, "input": ASK[0]["content"], "tools": [RESPONSES_TOOL], **body}


def ask_messages(model: str, **body: Any) -> dict[str, Any]:
    return {"model": model, "messages": ASK, "tools": [MESSAGES_TOOL], "max_tokens": 40, **body}


async def test_a_responses_call_to_vllm_asks_for_its_raw_turn_and_records_its_token_ids_without_relaying_them(
    front: Front,
) -> None:
    front.vllm.answers.append(response(function_call("2 + 2"), HERMES_2_PLUS_2))
    answer, span = await recorded_on(front, "/v1/responses", ask_responses("vllm"))
    assert front.vllm.requests[-1]["enable_response_messages"] is True
    assert "output_messages" not in answer and "input_messages" not in answer and answer["output"][0]["name"]
    assert span.attributes[sc.RESPONSE_TOKEN_IDS] == list(HERMES_2_PLUS_2.encode())
    assert span.attributes[sc.PROMPT_TOKEN_IDS] == [1, 2, 3]
    assert span.attributes[sc.TOOL_CALLS_PARSER] == "vllm:hermes"
    assert sc.TOOL_CALLS_PARSER_DISAGREES not in span.attributes
    front.hosted.answers.append(response(function_call("2 + 2")))
    assert httpx.post(front.url + "/v1/responses", json=ask_responses("hosted"), timeout=30).status_code == 200
    assert "enable_response_messages" not in front.hosted.requests[-1]  # a hosted API gets the agent's request


async def test_a_streamed_responses_call_to_vllm_records_its_raw_turn_and_the_agent_never_sees_it(front: Front) -> None:
    front.vllm.drop_token_ids = True  # vLLM's Responses route ignores `return_token_ids`: the raw turn holds them
    reply = httpx.post(front.url + "/v1/responses", json=ask_responses("vllm", stream=True), timeout=30)
    assert reply.status_code == 200 and "response.completed" in reply.text
    assert "output_messages" not in reply.text and "input_messages" not in reply.text
    await front.gateway.flush()
    (span,) = [s for s in await front.store.query_spans(None) if sc.is_llm_call(s)]
    arguments = json.dumps({"expression": "2 + 2"})  # what the fake "wrote": the call's arguments
    assert span.attributes[sc.RESPONSE_TOKEN_IDS] == list(arguments.encode())
    assert span.attributes[sc.TOOL_CALLS_PARSER] == "vllm:hermes"


async def test_a_responses_call_whose_raw_turn_our_parser_reads_as_another_call_is_flagged(front: Front) -> None:
    written = HERMES_2_PLUS_2.replace("2 + 2", "2 + 3")
    front.vllm.answers.append(response(function_call("2 + 2"), written))
    _, span = await recorded_on(front, "/v1/responses", ask_responses("vllm"))
    assert span.attributes[sc.TOOL_CALLS_PARSER] == "vllm:hermes"
    assert span.attributes[sc.TOOL_CALLS_PARSER_DISAGREES] is True
    assert json.loads(span.attributes[sc.TOOL_CALLS_OTHER_PARSE]) == [
        {"choice": 0, "parser": "engine:hermes", "tool_calls": [{"name": "calculate", "arguments": {"expression": "2 + 3"}}],
         "error": None}]


async def test_a_responses_text_reply_that_our_parser_reads_as_a_call_is_flagged(front: Front) -> None:
    front.hosted.answers.append(response(text_item('[calculate(expression="2 + 2")]')))
    _, span = await recorded_on(front, "/v1/responses", ask_responses("hosted"))
    assert span.attributes[sc.TOOL_CALLS_PARSER] == sc.UPSTREAM_PARSER
    assert span.attributes[sc.TOOL_CALLS_PARSER_DISAGREES] is True
    (other,) = json.loads(span.attributes[sc.TOOL_CALLS_OTHER_PARSE])
    assert other["parser"] == "engine:pythonic" and other["tool_calls"][0]["arguments"] == {"expression": "2 + 2"}


async def test_a_messages_text_reply_that_our_parser_reads_as_a_call_is_flagged(front: Front) -> None:
    front.vllm.answers.append(anthropic_message({"type": "text", "text": HERMES_2_PLUS_2}))
    _, span = await recorded_on(front, "/v1/messages", ask_messages("vllm"))
    assert span.attributes[sc.TOOL_CALLS_PARSER] == "vllm:hermes"
    assert span.attributes[sc.TOOL_CALLS_PARSER_DISAGREES] is True
    (other,) = json.loads(span.attributes[sc.TOOL_CALLS_OTHER_PARSE])
    assert other == {"choice": 0, "parser": "engine:hermes", "error": None,
                     "tool_calls": [{"name": "calculate", "arguments": {"expression": "2 + 2"}}]}


async def test_a_messages_tool_use_is_named_by_its_parser_and_unflagged_without_raw_text(front: Front) -> None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "calculate", "input": {"expression": "2 + 2"}}
    front.vllm.answers.append(anthropic_message(block))
    _, span = await recorded_on(front, "/v1/messages", ask_messages("vllm"))
    assert span.attributes[sc.TOOL_CALLS_PARSER] == "vllm:hermes"
    assert sc.TOOL_CALLS_PARSER_DISAGREES not in span.attributes


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
async def test_a_responses_or_messages_reply_with_tools_off_gets_no_parser_attributes(front: Front, path: str) -> None:
    if path == "/v1/responses":
        front.hosted.answers.append(response(text_item('[calculate(expression="2 + 2")]')))
        body = ask_responses("hosted", tool_choice="none")
    else:
        front.hosted.answers.append(anthropic_message({"type": "text", "text": '[calculate(expression="2 + 2")]'}))
        body = ask_messages("hosted", tool_choice={"type": "none"})
    _, span = await recorded_on(front, path, body)
    assert not {k for k in span.attributes if k.startswith("agentgrad.tool_calls.")}


def test_the_vllm_parser_is_the_users_own_flag_else_the_one_agentgrad_chooses_for_the_model(tmp_path: Any) -> None:
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    (qwen / "chat_template.jinja").write_text("{% if tools %}<tool_call>{% endif %}")
    assert tool_parser_of(str(qwen)) == "hermes"
    assert tool_parser_of(str(qwen), ["--tool-call-parser", "qwen3_xml"]) == "qwen3_xml"
    assert tool_parser_of(str(qwen), ["--tool-call-parser=llama3_json"]) == "llama3_json"
    assert tool_parser_of(str(qwen), ["--chat-template", "mine.jinja"]) is None  # the user's set-up, parser unsaid
    assert tool_parser_of(str(tmp_path / "absent")) is None
    assert parse_backend("v=http://h/v1,system=vllm,tool_parser=pythonic")[1].tool_parser == "pythonic"


# ----------------------------------------------------------------------------- the engine (the tiny model)


BOUNDED = {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 16}}, "required": ["expression"]}
"""`calculate`'s parameters with the string bounded: the tiny model's strings never end by themselves."""
FORCED = {  # api -> (path, a forced call of `calculate` in that API's shape)
    "chat": ("/v1/chat/completions", {"messages": ASK, "tool_choice": "required", "max_tokens": 40, "tools": [
        {"type": "function", "function": {**CALCULATE["function"], "parameters": BOUNDED}}]}),
    "responses": ("/v1/responses", {"input": ASK[0]["content"], "tool_choice": "required", "max_output_tokens": 40,
                                    "tools": [{"type": "function", **CALCULATE["function"], "parameters": BOUNDED}]}),
    "messages": ("/v1/messages", {"messages": ASK, "tool_choice": {"type": "any"}, "max_tokens": 40, "tools": [
        {"name": "calculate", "description": "Evaluate", "input_schema": BOUNDED}]}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("api", list(FORCED))
async def test_the_engines_calls_name_its_own_parser_in_the_answer_and_on_the_span(
    engine_gateway: tuple[str, MemoryStore, Gateway], api: str, stream: bool
) -> None:
    url, store, gateway = engine_gateway
    rollout = await store.start_rollout("task")
    route = f"{url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}"
    path, body = FORCED[api]
    reply = httpx.post(route + path, timeout=300, json={"model": "policy", "temperature": 0, "stream": stream, **body})
    assert reply.status_code == 200, reply.text
    if not stream:
        said = reply.json()["choices"][0] if api == "chat" else reply.json()
        assert said[sc.TOOL_CALL_PARSER_FIELD] == "engine:pythonic"  # SmolLM2 calls in the pythonic format
    else:
        assert re.search(r'"tool_call_parser":\s*"engine:pythonic"', reply.text), reply.text
    await gateway.flush()
    (span,) = [s for s in await store.query_spans(rollout.rollout_id) if sc.is_llm_call(s)]
    outputs = json.loads(span.attributes[sc.GEN_AI_OUTPUT_MESSAGES])
    assert outputs[0]["tool_calls"][0]["function"]["name"] == "calculate"
    assert span.attributes[sc.TOOL_CALLS_PARSER] == "engine:pythonic"
    assert sc.TOOL_CALLS_PARSER_DISAGREES not in span.attributes
