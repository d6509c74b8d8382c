"""A tool-using agent with LangGraph's prebuilt ReAct agent: `create_react_agent(ChatOpenAI(...), [calculate])`.

No agentgrad here: the endpoint comes in as `base_url`.
"""

from __future__ import annotations

from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

from examples.frameworks import tasks
from examples.frameworks.langchain_agent import EXAMPLE  # the worked exchange as LangChain messages (few-shot)

calculate = tool(tasks.calculate)


def solve(question: str, *, model: str, base_url: str | None = None, api_key: str | None = None,
          worked_example: bool = True, **settings: Any) -> str:
    agent = create_react_agent(ChatOpenAI(model=model, base_url=base_url, api_key=api_key, **settings), [calculate],
                               prompt=tasks.INSTRUCTIONS)
    example = EXAMPLE if worked_example else []
    state = agent.invoke({"messages": [*example, {"role": "user", "content": question}]}, {"recursion_limit": 8})
    return str(state["messages"][-1].content)
