"""Qwen2.5-Coder-0.5B-Instruct's own tool-call format through `/v1/chat/completions` (`make qwen` fetches the model).

Qwen writes `<tool_call>` and `</tool_call>` as single tokens (151657, 151658) and its chat
template renders the tools and the history; forced calls are constrained in that very format.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.constraints import lark_grammar
from agentgrad.engine.tools import calls_text, format_for

pytestmark = pytest.mark.qwen

OPEN_ID, CLOSE_ID, IM_END = 151657, 151658, 151645
RUN_SQL = {"type": "function", "function": {
    "name": "run_sql", "description": "Run one SQLite query and return its rows",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"],
                   "additionalProperties": False}}}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
ASK = [{"role": "system", "content": "You answer questions about a SQLite database with tables authors(id, name, country)."},
       {"role": "user", "content": "How many authors are there? Run a query to find out."}]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    engine = Engine("qwen2.5-coder-0.5b", sampling_dtype="float32", device="cpu", name="qwen")
    yield engine
    engine.close()


def extra(obj: Any) -> dict[str, Any]:
    return obj.model_extra or {}


def written(engine: Engine, choice: Any) -> tuple[list[int], str]:
    """The reply's token ids, and those ids decoded as the template would render them."""
    ids = extra(choice)["token_ids"]
    return ids, engine.tokenizer.decode(ids, skip_special_tokens=True)


def test_qwen_gets_the_hermes_format_with_its_own_tool_call_tokens(engine: Engine) -> None:
    fmt = format_for(engine.tokenizer)
    assert fmt.name == "hermes" and fmt.tokens == (OPEN_ID, CLOSE_ID)


def test_a_required_call_is_written_with_qwens_tool_call_tokens_and_parsed(engine: Engine, api: openai.OpenAI) -> None:
    reply = api.chat.completions.create(model=engine.name, messages=ASK, tools=[WEATHER, RUN_SQL], tool_choice="required",
                                        temperature=0, max_tokens=60, extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    (call,) = choice.message.tool_calls
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, RUN_SQL)}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    ids, text = written(engine, choice)
    assert ids[0] == OPEN_ID and ids[-2:] == [CLOSE_ID, IM_END]
    assert text == calls_text([(call.function.name, call.function.arguments)])  # <tool_call>\n{...}\n</tool_call>
    assert extra(choice)["tool_call_parser"] == "engine:hermes"  # the gateway records it (semconv.TOOL_CALLS_PARSER)


def test_a_named_tool_streamed_and_not_gives_the_same_call_and_the_same_token_ids(engine: Engine, api: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(model=engine.name, messages=ASK, tools=[RUN_SQL, WEATHER], temperature=0, max_tokens=60,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                  extra_body={"return_token_ids": True})
    plain = api.chat.completions.create(**kwargs)
    (call,) = plain.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    chunks = list(api.chat.completions.create(**kwargs, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas if d.function] == [
        (0, "get_weather", call.function.arguments)]
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)  # no tag leaks as text
    streamed = [t for c in chunks if c.choices for t in extra(c.choices[0]).get("token_ids", [])]
    ids, text = written(engine, plain.choices[0])
    assert streamed == ids and ids[0] == OPEN_ID and ids[-2:] == [CLOSE_ID, IM_END]
    assert text == calls_text([("get_weather", call.function.arguments)])
    parsers = [extra(c.choices[0]).get("tool_call_parser") for c in chunks if c.choices]
    assert [p for p in parsers if p] == ["engine:hermes"] == [extra(plain.choices[0])["tool_call_parser"]]


def test_a_call_history_re_renders_to_the_text_the_model_wrote_and_auto_keeps_a_json_call_as_text(
    engine: Engine, api: openai.OpenAI
) -> None:
    """Unforced, this model writes its call as JSON (bare, or in a code block), never in `<tool_call>`:
    that stays text, with a `tool_call_parse_error` that says so."""
    first = api.chat.completions.create(model=engine.name, messages=ASK, tools=[RUN_SQL], tool_choice="required",
                                        temperature=0, max_tokens=60, extra_body={"return_token_ids": True})
    calls = first.choices[0].message.tool_calls or []
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
                     {"role": "tool", "tool_call_id": calls[0].id, "content": "14"},
                     {"role": "assistant", "content": "There are 14 authors."},
                     {"role": "user", "content": "And how many of them are from Japan? Run a query."}]
    second = api.chat.completions.create(model=engine.name, messages=history, tools=[RUN_SQL], temperature=0,
                                         max_tokens=80, extra_body={"return_token_ids": True})
    # the call re-renders to the very text the model wrote (not always the same tokens: Qwen's BPE merges
    # `"}}\n` into one token where the model, under the grammar, wrote `"}}` and `\n`)
    prompt = engine.tokenizer.decode(extra(second)["prompt_token_ids"])
    assert engine.tokenizer.decode(extra(first)["prompt_token_ids"] + extra(first.choices[0])["token_ids"]) in prompt
    choice = second.choices[0]
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    assert "run_sql" in (choice.message.content or "") and "as a JSON object" in extra(choice)["tool_call_parse_error"]
    assert "tool_call_parser" not in extra(choice)  # no call was parsed


def test_a_grammar_the_tokens_cannot_follow_fails_its_request_alone(engine: Engine, api: openai.OpenAI) -> None:
    """`<tool_call>` spelled as characters: llguidance's mask offers the single token, then refuses it."""
    prompt = engine.chat_prompt_ids(ASK)
    refused = engine.submit(prompt, SamplingParams(max_tokens=8, temperature=0, grammar=lark_grammar('start: "<tool_call>" "x"')))
    fine = engine.submit(prompt, SamplingParams(max_tokens=4, temperature=0))
    with pytest.raises(RuntimeError, match=f"refused token {OPEN_ID}"):
        refused.result(timeout=600)
    assert fine.result(timeout=600).completions[0].token_ids
    after = api.chat.completions.create(model=engine.name, messages=ASK, max_tokens=3, temperature=0)
    assert after.choices[0].message.content  # the engine thread is still serving
