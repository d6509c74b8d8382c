"""`/v1/responses` with the real openai client (the OpenAI Agents SDK on it: tests/engine/test_smollm2_finishes.py)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from agentgrad.engine import Engine


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine

WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["c", "f"]}},
                          "required": ["city", "unit"], "additionalProperties": False}}
ASK = "What is the weather in Paris?"


def test_text_output_with_instructions_and_token_ids(engine: Engine, api: openai.OpenAI) -> None:
    reply = api.responses.create(model=engine.name, instructions="Answer in one word.", input="Capital of France?",
                                 max_output_tokens=12, temperature=0, extra_body={"return_token_ids": True})
    extra: dict[str, Any] = reply.model_extra or {}
    assert reply.status in ("completed", "incomplete") and reply.output[0].type == "message"
    assert engine.tokenizer.decode(extra["token_ids"], skip_special_tokens=True) == reply.output_text
    assert len(extra["token_logprobs"]) == len(extra["token_ids"]) == reply.usage.output_tokens  # type: ignore[union-attr]
    assert extra["prompt_token_ids"] == engine.chat_prompt_ids(
        [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"}])


def test_function_calls_and_their_outputs_round_trip(engine: Engine, api: openai.OpenAI) -> None:
    first = api.responses.create(model=engine.name, input=ASK, tools=[WEATHER], tool_choice="required", temperature=0,
                                 max_output_tokens=40, extra_body={"return_token_ids": True})
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    history: list[Any] = [{"role": "user", "content": ASK}, *[c.model_dump(exclude_none=True) for c in calls],
                          {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C"}]
    second = api.responses.create(model=engine.name, input=history, tools=[WEATHER], temperature=0, max_output_tokens=20,
                                  extra_body={"return_token_ids": True})
    written = (first.model_extra or {})["prompt_token_ids"] + (first.model_extra or {})["token_ids"]
    assert (second.model_extra or {})["prompt_token_ids"][: len(written)] == written


def test_streaming_sends_the_events_and_the_same_output(engine: Engine, api: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(model=engine.name, input=ASK, tools=[WEATHER], tool_choice="required", temperature=0,
                                  max_output_tokens=40)
    plain = api.responses.create(**kwargs)
    events = list(api.responses.create(**kwargs, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds and "response.output_item.done" in kinds
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")  # type: ignore[union-attr]
    assert arguments == plain.output[0].arguments  # type: ignore[union-attr]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text_events = list(api.responses.create(model=engine.name, input="Say hello.", temperature=0, max_output_tokens=8, stream=True))
    deltas = "".join(e.delta for e in text_events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    final = text_events[-1].response  # type: ignore[union-attr]
    assert deltas == final.output_text and final.output_text


def test_unsupported_responses_features_are_refused_by_name(engine: Engine, api: openai.OpenAI) -> None:
    for extra in ({"previous_response_id": "resp_1"}, {"store": True}, {"tools": [{"type": "web_search"}]}):
        with pytest.raises(openai.BadRequestError) as caught:
            api.responses.create(model=engine.name, input="hi", max_output_tokens=2, extra_body=extra)
        assert next(iter(extra)) in caught.value.message
