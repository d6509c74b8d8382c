"""agentgrad around `agentscope_agent.py` (AgentScope)."""

from __future__ import annotations

from typing import Any

import agentgrad as ag
from examples.frameworks import agentscope_agent
from examples.frameworks.tasks import reward, wants_example


@ag.rollout
async def rollout(task: dict[str, Any], llm: ag.LLM) -> float:
    answer = await agentscope_agent.solve(task["question"], model=llm.model, base_url=llm.base_url,
                                               api_key=llm.api_key, worked_example=wants_example(task),
                                               **llm.sampling_parameters)
    return reward(answer, task)
