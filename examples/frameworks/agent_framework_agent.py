"""A tool-using agent with Microsoft Agent Framework: an `Agent` with a function tool on `OpenAIChatCompletionClient`.

No agentgrad here. Written as Agent Framework's documentation writes one: a plain Python function is
the tool (its signature and docstring become the schema), the agent runs the function-calling loop,
and `run` takes the conversation as `Message`s, so one worked exchange (question, call, result,
answer) goes before the question as earlier turns: few-shot prompting with tools.
"""

from __future__ import annotations

import json
from typing import Any

from agent_framework import Agent, Content, Message
from agent_framework.openai import OpenAIChatCompletionClient

from examples.frameworks import tasks


def example() -> list[Message]:
    """A worked exchange as the agent's earlier turns (few-shot)."""
    arguments = json.dumps({"expression": tasks.EXAMPLE_EXPRESSION})
    return [Message("user", [tasks.EXAMPLE_QUESTION]),
            Message("assistant", [Content.from_function_call("call_example", name="calculate", arguments=arguments)]),
            Message("tool", [Content.from_function_result("call_example", result=tasks.EXAMPLE_RESULT)]),
            Message("assistant", [tasks.EXAMPLE_ANSWER])]


async def solve(question: str, *, model: str, base_url: str, api_key: str, worked_example: bool = True,
                **settings: Any) -> str:
    client = OpenAIChatCompletionClient(model=model, base_url=base_url, api_key=api_key)
    agent = Agent(client=client, name="calculator", instructions=tasks.INSTRUCTIONS, tools=[tasks.calculate],
                  default_options=settings)
    response = await agent.run([*(example() if worked_example else []), Message("user", [question])])
    return response.text
