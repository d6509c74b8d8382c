"""agentgrad around `crewai_crew_agent.py` (runs in `.venv-crewai`): each agent calls its own gateway route
(`llm.for_agent(role)`), so `GRPOConfig(roles=run.roles_of(...))` trains one adapter per agent; each is paid for its own
task's answer (the calculator's first: the rollout's reward)."""

from __future__ import annotations

from typing import Any

import agentgrad as ag
from examples.frameworks import crewai_crew_agent
from examples.frameworks.crewai_crew_agent import CALCULATOR, REVIEWER
from examples.frameworks.tasks import reward


@ag.rollout
def rollout(task: dict[str, Any], llm: ag.LLM) -> dict[str, float]:
    outputs = crewai_crew_agent.solve(task["question"], model=llm.model, api_key=llm.api_key,
                                      base_url_for=lambda role: llm.for_agent(role).base_url,
                                      **llm.sampling_parameters)
    return {CALCULATOR: reward(outputs[CALCULATOR], task), REVIEWER: reward(outputs[REVIEWER], task)}
