"""Tool calls and structured output through `/v1/chat/completions`, with the real openai client."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import jsonschema
import openai
import pydantic
import pytest
import torch

from agentgrad.engine import Engine
from agentgrad.engine.constraints import json_schema_grammar
from agentgrad.engine.tools import calls_text, format_for


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CALC = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 16}}, "required": ["expression"],
                   "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def extra(obj: Any) -> dict[str, Any]:
    return obj.model_extra or {}


def test_tool_choice_required_returns_a_tool_call_whose_arguments_validate(engine: Engine, api: openai.OpenAI) -> None:
    reply = api.chat.completions.create(model=engine.name, messages=ASK, tools=[WEATHER, CALC], tool_choice="required",
                                        temperature=1.0, seed=4, max_tokens=80, extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CALC)}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    assert call.id.startswith("call_") and call.type == "function"
    assert engine.tokenizer.decode(extra(choice)["token_ids"], skip_special_tokens=True).startswith(format_for(engine.tokenizer).open)


def test_a_named_tool_choice_calls_that_tool(engine: Engine, api: openai.OpenAI) -> None:
    for tool in (CALC, WEATHER):  # the same prompt either way: a free pick cannot be both
        name = tool["function"]["name"]
        reply = api.chat.completions.create(model=engine.name, messages=ASK, tools=[CALC, WEATHER], temperature=0,
                                            max_tokens=40, tool_choice={"type": "function", "function": {"name": name}})
        calls = reply.choices[0].message.tool_calls or []
        assert [c.function.name for c in calls] == [name]
        jsonschema.validate(json.loads(calls[0].function.arguments), tool["function"]["parameters"])


def test_streamed_tool_calls_arrive_as_deltas_equal_to_the_plain_reply(engine: Engine, api: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(model=engine.name, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0,
                                  max_tokens=60, extra_body={"return_token_ids": True})
    plain = api.chat.completions.create(**kwargs)
    chunks = list(api.chat.completions.create(**kwargs, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    expected = plain.choices[0].message.tool_calls or []
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas if d.function] == [
        (i, c.function.name, c.function.arguments) for i, c in enumerate(expected)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    streamed_ids = [t for c in chunks if c.choices for t in extra(c.choices[0]).get("token_ids", [])]
    assert streamed_ids == extra(plain.choices[0])["token_ids"]
    text = engine.tokenizer.decode(streamed_ids, skip_special_tokens=True)
    assert text == calls_text([(expected[0].function.name, expected[0].function.arguments)], format_for(engine.tokenizer))


def test_a_tool_call_history_round_trips_through_the_template(engine: Engine, api: openai.OpenAI) -> None:
    """The next prompt starts with exactly the tokens of the last prompt and the call the model wrote."""
    first = api.chat.completions.create(model=engine.name, messages=ASK, tools=[WEATHER], tool_choice="required",
                                        temperature=0, max_tokens=60, extra_body={"return_token_ids": True})
    calls = first.choices[0].message.tool_calls or []
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
                     {"role": "tool", "tool_call_id": calls[0].id, "content": "18 C, sunny"}]
    second = api.chat.completions.create(model=engine.name, messages=history, tools=[WEATHER], temperature=0, max_tokens=30,
                                         extra_body={"return_token_ids": True})
    written = extra(first)["prompt_token_ids"] + extra(first.choices[0])["token_ids"]
    assert extra(second)["prompt_token_ids"][: len(written)] == written
    result = ("<|im_start|>tool\n18 C, sunny<|im_end|>" if format_for(engine.tokenizer).result_role == "tool"
              else "<tool_response>\n18 C, sunny\n</tool_response>")
    assert result in engine.tokenizer.decode(extra(second)["prompt_token_ids"])


def test_tool_choice_none_hides_the_tools_and_auto_may_answer_in_text(engine: Engine, api: openai.OpenAI) -> None:
    with_none = api.chat.completions.create(model=engine.name, messages=ASK, tools=[WEATHER], tool_choice="none",
                                            temperature=0, max_tokens=5, extra_body={"return_token_ids": True})
    without = api.chat.completions.create(model=engine.name, messages=ASK, temperature=0, max_tokens=5,
                                          extra_body={"return_token_ids": True})
    assert extra(with_none)["prompt_token_ids"] == extra(without)["prompt_token_ids"]
    auto = api.chat.completions.create(model=engine.name, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=5,
                                       extra_body={"return_token_ids": True})
    assert len(extra(auto)["prompt_token_ids"]) > len(extra(without)["prompt_token_ids"])  # the tools are in the prompt


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["name", "age", "tags"], "additionalProperties": False}


def test_a_json_schema_response_validates_20_times_in_a_row_at_temperature_1(engine: Engine, api: openai.OpenAI) -> None:
    def ask(seed: int) -> Any:
        return api.chat.completions.create(
            model=engine.name, messages=[{"role": "user", "content": "Describe a person as JSON."}], temperature=1.0, seed=seed,
            max_tokens=60, response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        replies = list(pool.map(ask, range(20)))
    for reply in replies:
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content or ""), PERSON)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)


def test_parse_returns_the_pydantic_model(engine: Engine, api: openai.OpenAI) -> None:
    parsed = api.chat.completions.parse(model=engine.name, messages=[{"role": "user", "content": "Invent a person."}],
                                        response_format=Person, temperature=0, max_tokens=60)
    assert isinstance(parsed.choices[0].message.parsed, Person)


def test_constrained_logprobs_are_the_models_before_the_grammar_mask_with_the_allowed_counts(engine: Engine, api: openai.OpenAI) -> None:
    """RL's behaviour policy under a grammar: each logprob is log softmax(logits / T) over the whole vocabulary (what a
    trainer recomputes), and `allowed_tokens` counts the tokens the grammar allowed there (1: forced)."""
    temperature = 0.7
    reply = api.chat.completions.create(
        model=engine.name, messages=[{"role": "user", "content": "A person?"}], temperature=temperature, seed=5, max_tokens=40,
        logprobs=True, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
        extra_body={"return_token_ids": True})
    prompt, response = extra(reply)["prompt_token_ids"], extra(reply.choices[0])["token_ids"]
    allowed = extra(reply.choices[0])["allowed_tokens"]
    returned = [t.logprob for t in reply.choices[0].logprobs.content or []]  # type: ignore[union-attr]
    constrainer = engine.constrainer()
    matcher = constrainer.matcher(json_schema_grammar(PERSON))
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + response])).logits[0].float()
    assert len(allowed) == len(response) == len(returned)
    for i, token in enumerate(response):
        mask = constrainer.allowed(matcher)
        assert bool(mask[token]) and int(mask.sum()) == allowed[i]
        step = logits[len(prompt) - 1 + i] / temperature
        assert abs(torch.log_softmax(step, -1)[token].item() - returned[i]) < 1e-3
        assert matcher.consume_token(token)
    assert 1 in allowed and any(count > 1 for count in allowed)  # `{"name": "` is forced, the name is not
    assert all(lp < 0 for lp in returned)  # forced tokens are not certain under the model


def test_constrained_and_free_requests_batch_together_without_changing_each_other(engine: Engine, api: openai.OpenAI) -> None:
    free = {"model": engine.name, "messages": [{"role": "user", "content": "Count to five."}], "temperature": 0, "max_tokens": 24}
    alone = api.chat.completions.create(**free).choices[0].message.content
    constrained = dict(free, response_format={"type": "json_object"})
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(api.chat.completions.create, **(constrained if i % 2 else free)) for i in range(6)]
        replies = [f.result() for f in futures]
    assert [r.choices[0].message.content for r in replies[::2]] == [alone] * 3
    assert all((r.choices[0].message.content or "").startswith("{") for r in replies[1::2])


def test_a_forced_tool_call_cut_at_max_tokens_is_a_length_finish_never_text(engine: Engine, api: openai.OpenAI) -> None:
    for choice in ("required", {"type": "function", "function": {"name": "calculate"}}):
        reply = api.chat.completions.create(model=engine.name, messages=ASK, tools=[WEATHER, CALC], tool_choice=choice,  # type: ignore[arg-type]
                                            temperature=0, max_tokens=3)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "length"
        assert message.content is None and not message.tool_calls
        assert "max_tokens" in extra(reply.choices[0])["tool_call_parse_error"]
    chunks = list(api.chat.completions.create(model=engine.name, messages=ASK, tools=[CALC], tool_choice="required",
                                              temperature=0, max_tokens=3, stream=True))
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
