"""A tool-using agent with LangChain: `ChatOpenAI(...).bind_tools([calculate])`, called until it stops calling tools.

No agentgrad here: the endpoint comes in as `base_url`, as LangChain's docs pass it for any
OpenAI-compatible server.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from examples.frameworks import tasks

calculate = tool(tasks.calculate)
MAX_TURNS = 4
EXAMPLE: list[BaseMessage] = [  # a worked exchange as earlier turns: LangChain's few-shot prompting with tools
    HumanMessage(tasks.EXAMPLE_QUESTION),
    AIMessage("", tool_calls=[{"name": "calculate", "args": {"expression": tasks.EXAMPLE_EXPRESSION}, "id": "call_example"}]),
    ToolMessage(tasks.EXAMPLE_RESULT, tool_call_id="call_example"),
    AIMessage(tasks.EXAMPLE_ANSWER),
]


def solve(question: str, *, model: str, base_url: str | None = None, api_key: str | None = None,
          worked_example: bool = True, **settings: Any) -> str:
    llm = ChatOpenAI(model=model, base_url=base_url, api_key=api_key, **settings).bind_tools([calculate])
    example = EXAMPLE if worked_example else []
    messages: list[BaseMessage] = [SystemMessage(tasks.INSTRUCTIONS), *example, HumanMessage(question)]
    for _ in range(MAX_TURNS):
        reply = llm.invoke(messages)
        if not reply.tool_calls:
            return str(reply.content)
        messages.append(reply)
        for call in reply.tool_calls:
            messages.append(ToolMessage(str(calculate.invoke(call["args"])), tool_call_id=call["id"]))
    return ""
