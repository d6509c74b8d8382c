"""agentgrad around `openai_agents_sdk_agent.py`: one `AsyncOpenAI` client for the SDK, shared by every
rollout of the process, and `ag.instrument_openai()` to route each call by the attempt it runs in. The SDK's
tracing never reaches OpenAI's servers: the runner replaces its exporter with a local processor that records
its tool runs in the attempt (`agentgrad.rollout.frameworks`), or, where that is not set up, `instrument_openai`
turns the SDK's tracing off.

The SDK keeps its default API, the Responses API (`/v1/responses`, routed and recorded by the
gateway like chat completions); `RESPONSES_API = False` switches it to chat completions instead.
"""

from __future__ import annotations

from typing import Any

from agents import ModelSettings, set_default_openai_api, set_default_openai_client
from openai import AsyncOpenAI

import agentgrad as ag
from examples.frameworks import openai_agents_sdk_agent
from examples.frameworks.tasks import reward, wants_example

RESPONSES_API = True
_clients: dict[str, AsyncOpenAI] = {}


def configure(llm: ag.LLM) -> None:
    """Point the SDK at the gateway once per process (the un-routed URL: headers pick the attempt)."""
    root = llm.base_url.split("/rollouts/")[0].rstrip("/").removesuffix("/v1") + "/v1"
    if root not in _clients:
        ag.instrument_openai()
        _clients[root] = AsyncOpenAI(base_url=root, api_key=llm.api_key)
        set_default_openai_client(_clients[root], use_for_tracing=False)
        if not RESPONSES_API:
            set_default_openai_api("chat_completions")


@ag.rollout
async def rollout(task: dict[str, Any], llm: ag.LLM) -> float:
    configure(llm)
    settings = ModelSettings(**{k: v for k, v in llm.sampling_parameters.items() if k in ("temperature", "max_tokens")})
    answer = await openai_agents_sdk_agent.solve(task["question"], model=llm.model, settings=settings,
                                                 worked_example=wants_example(task))
    return reward(answer, task)
