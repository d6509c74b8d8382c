"""A team with AutoGen AgentChat: a calculator and a reviewer taking turns in a `RoundRobinGroupChat`.

No agentgrad here. The calculator is `autogen_agent.py`'s `AssistantAgent` with its tool; the reviewer
checks its answer and says APPROVE, or what is wrong, in which case the calculator answers again. The
team stops on APPROVE or after `MAX_MESSAGES`. Each agent has its own model client, built by
`base_url_for(name)`: a team whose agents use different endpoints (models, or one model's routes per
agent) is written this way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_ext.models.openai import OpenAIChatCompletionClient

from examples.frameworks import tasks
from examples.frameworks.autogen_agent import MODEL_INFO, example

CALCULATOR, REVIEWER = "calculator", "reviewer"
REVIEWER_PROMPT = ("You review the calculator's answer to the user's arithmetic question. If it is right, reply "
                   "APPROVE. Otherwise say what is wrong.")
MAX_MESSAGES = 5  # the task, then up to two rounds of answer and review


async def solve(question: str, *, model: str, base_url_for: Callable[[str], str], api_key: str,
                **settings: Any) -> dict[str, str]:
    """Run the team on the question; returns each agent's last message."""
    clients = {name: OpenAIChatCompletionClient(model=model, base_url=base_url_for(name), api_key=api_key,
                                                model_info=MODEL_INFO, **settings) for name in (CALCULATOR, REVIEWER)}
    calculator = AssistantAgent(CALCULATOR, model_client=clients[CALCULATOR], tools=[tasks.calculate],
                                system_message=tasks.INSTRUCTIONS, reflect_on_tool_use=True,
                                model_context=UnboundedChatCompletionContext(initial_messages=example()))
    reviewer = AssistantAgent(REVIEWER, model_client=clients[REVIEWER], system_message=REVIEWER_PROMPT)
    team = RoundRobinGroupChat([calculator, reviewer], termination_condition=TextMentionTermination("APPROVE")
                               | MaxMessageTermination(MAX_MESSAGES))
    try:
        result = await team.run(task=question)
    finally:
        for client in clients.values():
            await client.close()
    return {message.source: str(getattr(message, "content", "")) for message in result.messages}
