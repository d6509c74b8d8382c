"""agentgrad: train any AI agent with RL, prompt optimization or SFT, with almost no change to its code.

The names a user needs are here; each is imported on first use, so `import agentgrad` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    # writing an agent
    "rollout": "agentgrad.agent",
    "LitAgent": "agentgrad.agent",
    "LLM": "agentgrad.types",
    "PromptTemplate": "agentgrad.types",
    "Rollout": "agentgrad.types",
    "RolloutConfig": "agentgrad.types",
    "emit_reward": "agentgrad.emit",
    "emit_message": "agentgrad.emit",
    "emit_object": "agentgrad.emit",
    "emit_exception": "agentgrad.emit",
    "emit_annotation": "agentgrad.emit",
    "operation": "agentgrad.emit",
    # running and training it
    "Trainer": "agentgrad.trainer",
    "Runner": "agentgrad.runner",
    "Hook": "agentgrad.runner",
    # routing model calls through the gateway
    "Gateway": "agentgrad.gateway",
    "Backend": "agentgrad.gateway",
    "GatewayEnvHook": "agentgrad.instrument",
    "instrument_openai": "agentgrad.instrument",
    "Algorithm": "agentgrad.algorithms.base",
    "Baseline": "agentgrad.algorithms.baseline",
    "GRPO": "agentgrad.algorithms.grpo",
    "GRPOConfig": "agentgrad.algorithms.grpo",
    "SFT": "agentgrad.algorithms.sft",
    "SFTConfig": "agentgrad.algorithms.sft",
    "APO": "agentgrad.algorithms.apo",
    # stores
    "Store": "agentgrad.store",
    "MemoryStore": "agentgrad.store",
    "SqliteStore": "agentgrad.store",
    "open_store": "agentgrad.store",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentgrad' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from agentgrad.agent import LitAgent, rollout
    from agentgrad.algorithms.apo import APO
    from agentgrad.algorithms.base import Algorithm
    from agentgrad.algorithms.baseline import Baseline
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.algorithms.sft import SFT, SFTConfig
    from agentgrad.emit import emit_annotation, emit_exception, emit_message, emit_object, emit_reward, operation
    from agentgrad.gateway import Backend, Gateway
    from agentgrad.instrument import GatewayEnvHook, instrument_openai
    from agentgrad.runner import Hook, Runner
    from agentgrad.store import MemoryStore, SqliteStore, Store, open_store
    from agentgrad.trainer import Trainer
    from agentgrad.types import LLM, PromptTemplate, Rollout, RolloutConfig
