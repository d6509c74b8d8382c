"""agentgrad around `openai_agent.py`: the agent builds `OpenAI()` from the environment, so the
runner's `GatewayEnvHook` (`agentgrad runner --gateway URL`) points it at the attempt's route."""

from __future__ import annotations

from typing import Any

import agentgrad as ag
from examples.frameworks import openai_agent
from examples.frameworks.tasks import reward, wants_example


@ag.rollout
def rollout(task: dict[str, Any], llm: ag.LLM) -> float:
    # the model name and sampling settings come from the resource; the endpoint from the environment
    return reward(openai_agent.solve(task["question"], model=llm.model, worked_example=wants_example(task),
                                     **llm.sampling_parameters), task)
