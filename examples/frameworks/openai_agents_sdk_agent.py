"""A tool-using agent with the OpenAI Agents SDK: an `Agent` with a `function_tool`, run by `Runner`.

No agentgrad here. The SDK's defaults are kept: the Responses API, and the client it builds
from `OPENAI_BASE_URL` / `OPENAI_API_KEY` unless one is given with `set_default_openai_client`.
"""

from __future__ import annotations

import json
from typing import Any

from agents import Agent, ModelSettings, Runner, function_tool

from examples.frameworks import tasks

calculate = function_tool(tasks.calculate)
EXAMPLE: list[Any] = [  # a worked exchange as earlier input items (few-shot)
    {"role": "user", "content": tasks.EXAMPLE_QUESTION},
    {"type": "function_call", "call_id": "call_example", "name": "calculate",
     "arguments": json.dumps({"expression": tasks.EXAMPLE_EXPRESSION})},
    {"type": "function_call_output", "call_id": "call_example", "output": tasks.EXAMPLE_RESULT},
    {"role": "assistant", "content": tasks.EXAMPLE_ANSWER},
]


def build_agent(model: str, settings: ModelSettings | None = None) -> Agent:
    return Agent(name="calculator", instructions=tasks.INSTRUCTIONS, tools=[calculate], model=model,
                 model_settings=settings or ModelSettings())


async def solve(question: str, model: str = "gpt-4o-mini", settings: ModelSettings | None = None,
                worked_example: bool = True) -> str:
    example = EXAMPLE if worked_example else []
    result = await Runner.run(build_agent(model, settings), [*example, {"role": "user", "content": question}], max_turns=4)
    return str(result.final_output)
