"""agentgrad around `autogen_agent.py` (runs in `.venv-autogen`: `make env-autogen`).

Each attempt makes two model calls when the model uses the tool: the call (with `tools`) and
AutoGen's reflection (without them). The second prompt does not continue the first token for
token (the tool schemas left the system turn), so the adapter makes two trajectories of one
attempt; both carry the attempt's reward.
"""

from __future__ import annotations

from typing import Any

import agentgrad as ag
from examples.frameworks import autogen_agent
from examples.frameworks.tasks import reward, wants_example


@ag.rollout
async def rollout(task: dict[str, Any], llm: ag.LLM) -> float:
    answer = await autogen_agent.solve(task["question"], model=llm.model, base_url=llm.base_url, api_key=llm.api_key,
                                       worked_example=wants_example(task), **llm.sampling_parameters)
    return reward(answer, task)
