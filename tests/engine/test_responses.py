"""`/v1/responses` with the real openai client, and the OpenAI Agents SDK on its defaults (tracing off)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import openai
import pytest

from agentgrad.engine import Engine

pytestmark = pytest.mark.model

WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
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


def test_the_openai_agents_sdk_runs_a_tool_agent_on_its_defaults(engine: Engine, engine_url: str) -> None:
    import agents

    agents.set_tracing_disabled(True)
    called: list[str] = []

    @agents.function_tool
    def get_weather(city: str, unit: str) -> str:
        """The current weather in a city; unit is c or f."""
        called.append(city)
        return "18 degrees"

    client = openai.AsyncOpenAI(base_url=engine_url + "/v1", api_key="unused", max_retries=0, timeout=900)
    agents.set_default_openai_client(client, use_for_tracing=False)
    agent = agents.Agent(name="weather", instructions="Use the tool, then answer.", tools=[get_weather], model=engine.name,
                         model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=60))

    async def run() -> tuple[Any, Any]:  # one event loop: the client's connections belong to it
        plain = await agents.Runner.run(agent, ASK, max_turns=3)
        streamed = agents.Runner.run_streamed(agent, ASK, max_turns=3)
        async for _ in streamed.stream_events():
            pass
        return plain, streamed

    plain, streamed = asyncio.run(run())
    assert len(called) >= 2 and isinstance(plain.final_output, str) and isinstance(streamed.final_output, str)
