"""A tool-using agent with the plain `openai` client: the function-calling loop of OpenAI's guide.

No agentgrad here. It builds `OpenAI()` with no arguments, so it calls whatever
`OPENAI_BASE_URL` / `OPENAI_API_KEY` name (agentgrad's `GatewayEnvHook` points them at the
gateway route of the attempt being run).
"""

from __future__ import annotations

import json
from typing import Any

from openai import OpenAI

from examples.frameworks import tasks
from examples.frameworks.tasks import CALCULATE_SCHEMA, INSTRUCTIONS, calculate

TOOLS = [CALCULATE_SCHEMA]
FUNCTIONS = {"calculate": calculate}
MAX_TURNS = 4
EXAMPLE: list[Any] = [  # a worked exchange as earlier turns (few-shot)
    {"role": "user", "content": tasks.EXAMPLE_QUESTION},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_example", "type": "function", "function": {
        "name": "calculate", "arguments": json.dumps({"expression": tasks.EXAMPLE_EXPRESSION})}}]},
    {"role": "tool", "tool_call_id": "call_example", "content": tasks.EXAMPLE_RESULT},
    {"role": "assistant", "content": tasks.EXAMPLE_ANSWER},
]


def solve(question: str, model: str = "gpt-4o-mini", worked_example: bool = True, **settings: Any) -> str:
    """Ask; run every tool call the model makes and send the results back; stop at a plain reply."""
    client = OpenAI()
    example = EXAMPLE if worked_example else []
    messages: list[Any] = [{"role": "system", "content": INSTRUCTIONS}, *example, {"role": "user", "content": question}]
    for _ in range(MAX_TURNS):
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, **settings)
        message = response.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message)
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            result = FUNCTIONS[call.function.name](**arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""
