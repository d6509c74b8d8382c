"""A tool-using agent with AutoGen AgentChat: an `AssistantAgent` with a tool, on `OpenAIChatCompletionClient`.

No agentgrad here. `reflect_on_tool_use=True`, as AutoGen's tutorial writes it: after the tool
runs, the agent asks the model once more (without tools) to phrase the answer. `model_info`
describes a model that is not one of OpenAI's, as AutoGen requires for any other server.
"""

from __future__ import annotations

import json
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_core import FunctionCall
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import AssistantMessage, FunctionExecutionResult, FunctionExecutionResultMessage, UserMessage
from autogen_ext.models.openai import OpenAIChatCompletionClient

from examples.frameworks import tasks

MODEL_INFO = {"vision": False, "function_calling": True, "json_output": True, "family": "unknown",
              "structured_output": True, "multiple_system_messages": True}


def example() -> list[Any]:
    """A worked exchange as the agent's earlier context (few-shot)."""
    call = FunctionCall(id="call_example", name="calculate", arguments=json.dumps({"expression": tasks.EXAMPLE_EXPRESSION}))
    return [UserMessage(content=tasks.EXAMPLE_QUESTION, source="user"),
            AssistantMessage(content=[call], source="calculator"),
            FunctionExecutionResultMessage(content=[FunctionExecutionResult(content=tasks.EXAMPLE_RESULT, name="calculate",
                                                                            call_id="call_example", is_error=False)]),
            AssistantMessage(content=tasks.EXAMPLE_ANSWER, source="calculator")]


async def solve(question: str, *, model: str, base_url: str, api_key: str, worked_example: bool = True,
                **settings: Any) -> str:
    client = OpenAIChatCompletionClient(model=model, base_url=base_url, api_key=api_key, model_info=MODEL_INFO,
                                        **settings)
    agent = AssistantAgent("calculator", model_client=client, tools=[tasks.calculate],
                           system_message=tasks.INSTRUCTIONS, reflect_on_tool_use=True,
                           model_context=UnboundedChatCompletionContext(initial_messages=example() if worked_example else []))
    try:
        result = await agent.run(task=question)
    finally:
        await client.close()
    return str(result.messages[-1].content)
