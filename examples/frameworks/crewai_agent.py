"""A tool-using agent with CrewAI: an `Agent` with a tool, run directly with `Agent.kickoff(messages)`.

No agentgrad here. The LLM is CrewAI's `LLM` for an OpenAI-compatible server (`base_url`).
`kickoff` takes the conversation as messages, so one worked exchange (question, tool call,
result, answer) goes before the question as earlier turns: few-shot prompting with tools.
"""

from __future__ import annotations

import json
from typing import Any

from crewai import LLM, Agent
from crewai.tools import tool

from examples.frameworks import tasks


@tool("calculate")
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as '123 + 456' and return the result."""
    return tasks.calculate(expression)


EXAMPLE: list[Any] = [  # a worked exchange as earlier turns (few-shot), the request written as kickoff writes one
    {"role": "user", "content": f"\nCurrent Task: {tasks.EXAMPLE_QUESTION}"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_example", "type": "function", "function": {
        "name": "calculate", "arguments": json.dumps({"expression": tasks.EXAMPLE_EXPRESSION})}}]},
    {"role": "tool", "tool_call_id": "call_example", "content": tasks.EXAMPLE_RESULT},
    {"role": "assistant", "content": tasks.EXAMPLE_ANSWER},
]


def solve(question: str, *, model: str, base_url: str, api_key: str, worked_example: bool = True,
          **settings: Any) -> str:
    llm = LLM(model=f"openai/{model}", base_url=base_url, api_key=api_key, **settings)
    calculator = Agent(role="Calculator", goal="Answer arithmetic questions exactly, using the calculate tool.",
                       backstory=tasks.INSTRUCTIONS, tools=[calculate], llm=llm, max_iter=3, verbose=False)
    return str(calculator.kickoff([*(EXAMPLE if worked_example else []), {"role": "user", "content": question}]).raw)
