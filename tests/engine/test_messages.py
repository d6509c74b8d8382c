"""`/v1/messages` on the engine with the real `anthropic` SDK: text and tool_use blocks, streamed and not, token
ids that are exactly what was sampled, and refusals in Anthropic's shape naming the field."""

from __future__ import annotations

from typing import Any

import anthropic
import jsonschema
import pytest

from agentgrad.engine import Engine


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine

WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                             "unit": {"type": "string", "enum": ["c", "f"]}},
                            "required": ["city", "unit"], "additionalProperties": False}}
ASK = {"role": "user", "content": "What is the weather in Paris?"}
IDS = {"return_token_ids": True}


@pytest.fixture(scope="module")
def sdk(engine_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=engine_url, api_key="unused", max_retries=0, timeout=900)


def test_a_text_reply_carries_the_token_ids_it_was_sampled_as(engine: Engine, sdk: anthropic.Anthropic) -> None:
    reply = sdk.messages.create(model=engine.name, system="Answer in one word.", max_tokens=12, temperature=0,
                                messages=[{"role": "user", "content": "Capital of France?"}], extra_body=IDS)
    extra: dict[str, Any] = reply.model_extra or {}
    assert reply.content[0].type == "text" and reply.stop_reason in ("end_turn", "max_tokens")
    assert engine.tokenizer.decode(extra["token_ids"], skip_special_tokens=True) == reply.content[0].text
    assert len(extra["token_logprobs"]) == len(extra["token_ids"]) == reply.usage.output_tokens
    assert extra["prompt_token_ids"] == engine.chat_prompt_ids(
        [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"}])
    assert reply.usage.input_tokens == len(extra["prompt_token_ids"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_call_is_a_tool_use_block_whose_input_fits_the_schema(
    engine: Engine, sdk: anthropic.Anthropic, stream: bool
) -> None:
    asked: dict[str, Any] = dict(model=engine.name, max_tokens=60, temperature=0, tools=[WEATHER],
                                 tool_choice={"type": "any"}, messages=[ASK], extra_body=IDS)
    if stream:
        with sdk.messages.stream(**asked) as events:
            kinds = [e.type for e in events]
            reply = events.get_final_message()
        assert kinds[0] == "message_start" and "content_block_start" in kinds and kinds[-1] == "message_stop"
    else:
        reply = sdk.messages.create(**asked)
    (use,) = [b for b in reply.content if b.type == "tool_use"]
    assert reply.stop_reason == "tool_use" and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER["input_schema"])
    plain = sdk.messages.create(**asked) if stream else reply
    assert use.input == next(b for b in plain.content if b.type == "tool_use").input  # greedy: the same call

    result = {"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}
    second = sdk.messages.create(model=engine.name, max_tokens=16, temperature=0, tools=[WEATHER],
                                 messages=[ASK, {"role": "assistant", "content": reply.content},  # type: ignore[list-item]
                                           {"role": "user", "content": [result]}], extra_body=IDS)
    history = engine.tokenizer.decode((second.model_extra or {})["prompt_token_ids"])
    assert "18 C" in history and "get_weather" in history


def test_a_streamed_text_reply_is_the_plain_one_with_its_token_ids_on_message_delta(
    engine: Engine, sdk: anthropic.Anthropic
) -> None:
    asked: dict[str, Any] = dict(model=engine.name, max_tokens=10, temperature=0,
                                 messages=[{"role": "user", "content": "Say hello."}], extra_body=IDS)
    plain = sdk.messages.create(**asked)
    events = list(sdk.messages.create(**asked, stream=True))
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")  # type: ignore[union-attr]
    assert text == plain.content[0].text  # type: ignore[union-attr]
    delta = next(e for e in events if e.type == "message_delta")
    assert (delta.model_extra or {})["token_ids"] == (plain.model_extra or {})["token_ids"]
    assert delta.usage.output_tokens == plain.usage.output_tokens


def test_a_stop_sequence_ends_the_text_and_is_named(engine: Engine, sdk: anthropic.Anthropic) -> None:
    asked: dict[str, Any] = dict(model=engine.name, max_tokens=24, temperature=0,
                                 messages=[{"role": "user", "content": "Count from 1 to 9."}])
    full = sdk.messages.create(**asked).content[0].text  # type: ignore[union-attr]
    word = next(w for w in full.split()[1:] if w.strip())
    cut = sdk.messages.create(**asked, stop_sequences=[word])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word
    assert cut.content[0].text == full[: full.index(word)]  # type: ignore[union-attr]


@pytest.mark.parametrize(("extra", "named"), [
    ({"top_k": 5}, "top_k"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"temperature": 1.5}, "temperature"),
])
def test_what_the_engine_cannot_honour_is_refused_in_anthropics_shape_naming_it(
    engine: Engine, sdk: anthropic.Anthropic, extra: dict[str, Any], named: str
) -> None:
    body: dict[str, Any] = {"model": engine.name, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                            **extra}
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk.post("/v1/messages", body=body, cast_to=object)
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error" and named in error["message"]


def test_a_model_not_served_is_a_not_found_error(sdk: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        sdk.messages.create(model="claude-opus", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert "claude-opus" in missing.value.body["error"]["message"]  # type: ignore[index]
