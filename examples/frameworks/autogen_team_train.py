"""agentgrad around `autogen_team_agent.py` (runs in `.venv-autogen`): each agent calls its own gateway route
(`llm.for_agent(name)`), so `GRPOConfig(roles=run.roles_of(...))` trains one adapter per agent.

The calculator is paid for a right final answer, the reviewer for a right verdict (APPROVE exactly when the
calculator's answer is right): one reward with a dimension per role, the calculator's first (the rollout's).
"""

from __future__ import annotations

from typing import Any

import agentgrad as ag
from examples.frameworks import autogen_team_agent
from examples.frameworks.autogen_team_agent import CALCULATOR, REVIEWER
from examples.frameworks.tasks import reward


def grade(last: dict[str, str], task: dict[str, Any]) -> dict[str, float]:
    """The calculator's and the reviewer's rewards from each one's last message."""
    right = reward(last.get(CALCULATOR), task)
    approved = "APPROVE" in last.get(REVIEWER, "")
    return {CALCULATOR: right, REVIEWER: float(approved == bool(right))}


@ag.rollout
async def rollout(task: dict[str, Any], llm: ag.LLM) -> dict[str, float]:
    last = await autogen_team_agent.solve(task["question"], model=llm.model, api_key=llm.api_key,
                                          base_url_for=lambda name: llm.for_agent(name).base_url,
                                          **llm.sampling_parameters)
    return grade(last, task)
