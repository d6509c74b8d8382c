"""agentgrad around `agent_framework_agent.py` (Microsoft Agent Framework)."""

from __future__ import annotations

from typing import Any

import agentgrad as ag
from examples.frameworks import agent_framework_agent
from examples.frameworks.tasks import reward, wants_example


@ag.rollout
async def rollout(task: dict[str, Any], llm: ag.LLM) -> float:
    answer = await agent_framework_agent.solve(task["question"], model=llm.model, base_url=llm.base_url,
                                               api_key=llm.api_key, worked_example=wants_example(task),
                                               **llm.sampling_parameters)
    return reward(answer, task)
