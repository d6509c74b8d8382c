"""A tool-using agent with AgentScope: its ReAct `Agent` with a `FunctionTool` in a `Toolkit`, on `OpenAIChatModel`.

No agentgrad here. Written as AgentScope 2's documentation writes one: the model is `OpenAIChatModel`
with an `OpenAICredential` naming an OpenAI-compatible `base_url`, the function becomes a tool through
`FunctionTool` (allowed to run without asking the user: AgentScope asks by default), and the agent's state
starts with one worked exchange (question; call, result and answer as the assistant's blocks) before
the question: few-shot prompting with tools. Runtime-state injection
(the clock, the context usage) is off, so the same task sends the same prompt.
"""

from __future__ import annotations

import json
from typing import Any

from agentscope.agent import Agent, InjectionConfig
from agentscope.credential import OpenAICredential
from agentscope.message import Msg, TextBlock, ToolCallBlock, ToolResultBlock
from agentscope.model import OpenAIChatModel
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.state import AgentState
from agentscope.tool import FunctionTool, Toolkit

from examples.frameworks import tasks


def example() -> list[Msg]:
    """A worked exchange as the agent's earlier turns (few-shot)."""
    arguments = json.dumps({"expression": tasks.EXAMPLE_EXPRESSION})
    return [Msg(name="user", role="user", content=[TextBlock(text=tasks.EXAMPLE_QUESTION)]),
            Msg(name="calculator", role="assistant", content=[
                ToolCallBlock(id="call_example", name="calculate", input=arguments, state="allowed"),
                ToolResultBlock(id="call_example", name="calculate", output=tasks.EXAMPLE_RESULT, state="success"),
                TextBlock(text=tasks.EXAMPLE_ANSWER)])]


async def solve(question: str, *, model: str, base_url: str, api_key: str, worked_example: bool = True,
                **settings: Any) -> str:
    chat_model = OpenAIChatModel(credential=OpenAICredential(api_key=api_key, base_url=base_url), model=model,
                                 parameters=OpenAIChatModel.Parameters(**settings))
    allowed = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="arithmetic is safe")
    agent = Agent(name="calculator", system_prompt=tasks.INSTRUCTIONS, model=chat_model,
                  toolkit=Toolkit(tools=[FunctionTool(tasks.calculate, permission=allowed)]),
                  state=AgentState(context=example() if worked_example else []),
                  injection_config=InjectionConfig(inject_runtime_state=False))
    reply = await agent.reply(Msg(name="user", role="user", content=[TextBlock(text=question)]))
    return "".join(block.text for block in reply.content if isinstance(block, TextBlock))
