"""What SmolLM2 itself does with a request's structure: it closes the JSON object that `json_object` mode opens
(a grammar allows one that never ends), and it answers in text after the tool call the OpenAI Agents SDK forced, so
the agent's run ends. A random tiny model does neither within a budget, so these run on the real model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

from agentgrad.engine import Engine

pytestmark = pytest.mark.model

ASK = "What is the weather in Paris?"


def test_json_object_mode_returns_a_json_object(engine: Engine, api: openai.OpenAI) -> None:
    reply = api.chat.completions.create(model=engine.name, messages=[{"role": "user", "content": "List two colors."}],
                                        response_format={"type": "json_object"}, temperature=0, max_tokens=60)
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


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
        await client.close()  # in its own loop: left to the garbage collector, it would close in a later test's
        return plain, streamed

    plain, streamed = asyncio.run(run())
    assert len(called) >= 2 and isinstance(plain.final_output, str) and isinstance(streamed.final_output, str)
