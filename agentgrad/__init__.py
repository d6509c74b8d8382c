"""agentgrad: train any AI agent with RL, prompt optimization or SFT, with almost no change to its code.

The names a user needs are here; each is imported on first use, so `import agentgrad` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    # writing an agent
    "LitAgent": "agentgrad.rollout.agent",
    "agent": "agentgrad.rollout.naming",
    "LLM": "agentgrad.types",
    "PromptTemplate": "agentgrad.types",
    "Rollout": "agentgrad.types",
    "RolloutConfig": "agentgrad.types",
    "emit_reward": "agentgrad.rollout.emit",
    "emit_message": "agentgrad.rollout.emit",
    "emit_object": "agentgrad.rollout.emit",
    "emit_exception": "agentgrad.rollout.emit",
    "emit_annotation": "agentgrad.rollout.emit",
    "operation": "agentgrad.rollout.emit",
    "emit_span": "agentgrad.rollout.emit",
    # judge rewards (tasks with no checker)
    "judge": "agentgrad.rollout.judging",
    "ajudge": "agentgrad.rollout.judging",
    "group_judge": "agentgrad.rollout.judging",
    "agroup_judge": "agentgrad.rollout.judging",
    "Judge": "agentgrad.rollout.judging",
    "GroupJudge": "agentgrad.rollout.judging",
    "Judgement": "agentgrad.rollout.judging",
    # running and training it
    "Trainer": "agentgrad.train.trainer",
    "Runner": "agentgrad.rollout.runner",
    "Hook": "agentgrad.rollout.runner",
    # routing model calls through the gateway
    "Gateway": "agentgrad.gateway",
    "Backend": "agentgrad.gateway",
    "GatewayEnvHook": "agentgrad.rollout.gateway_env",
    "instrument_openai": "agentgrad.rollout.instrument",
    "instrument_frameworks": "agentgrad.rollout.frameworks",
    "Algorithm": "agentgrad.algorithms.base",
    "Baseline": "agentgrad.algorithms.baseline",
    "RunContext": "agentgrad.algorithms.base",
    "Evaluation": "agentgrad.algorithms.base",
    "Result": "agentgrad.algorithms.base",
    "RunConfig": "agentgrad.algorithms.config",
    "BaselineConfig": "agentgrad.algorithms.baseline",
    "GRPO": "agentgrad.algorithms.grpo",
    "GRPOConfig": "agentgrad.algorithms.grpo",
    "GRPOResult": "agentgrad.algorithms.grpo",
    "SFT": "agentgrad.algorithms.sft",
    "SFTConfig": "agentgrad.algorithms.sft",
    "SFTResult": "agentgrad.algorithms.sft",
    "PolicyConfig": "agentgrad.policy.config",
    "APO": "agentgrad.algorithms.apo",
    "APOConfig": "agentgrad.algorithms.apo_config",
    "APOResult": "agentgrad.algorithms.apo",
    "Joint": "agentgrad.algorithms.joint",
    # stores
    "Store": "agentgrad.store",
    "MemoryStore": "agentgrad.store",
    "SqliteStore": "agentgrad.store",
    "open_store": "agentgrad.store",
    # what can go wrong
    "AgentError": "agentgrad.rollout.agent",
    "StoreError": "agentgrad.store",
    "NotFoundError": "agentgrad.store",
    "InvalidTransitionError": "agentgrad.store",
}

_TRAIN_EXTRA = {"GRPO", "GRPOConfig", "GRPOResult", "SFT", "SFTConfig", "SFTResult", "Joint"}
"""Names that need the `train` extra (torch, transformers, ...)."""
_TRAIN_MODULES = {"torch", "transformers", "gguf", "accelerate", "peft", "safetensors"}

# `agentgrad.rollout` is also the agent-side package, and the first import of a package binds its
# name in the parent: importing the decorator here, after the package, keeps `ag.rollout` the decorator.
from agentgrad.rollout.agent import rollout  # noqa: E402

__all__ = sorted([*_EXPORTS, "rollout"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentgrad' has no attribute {name!r}")
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if name in _TRAIN_EXTRA and (exc.name or "").split(".")[0] in _TRAIN_MODULES:
            raise ImportError(
                f"agentgrad.{name} trains a local model and needs the `train` extra, which is not installed "
                f"(no module {exc.name!r}): pip install 'agentgrad[train]'"
            ) from exc
        raise
    value = getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from agentgrad.algorithms.apo import APO, APOResult
    from agentgrad.algorithms.apo_config import APOConfig
    from agentgrad.algorithms.base import Algorithm, Evaluation, Result, RunContext
    from agentgrad.algorithms.baseline import Baseline, BaselineConfig
    from agentgrad.algorithms.config import RunConfig
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig, GRPOResult
    from agentgrad.algorithms.joint import Joint
    from agentgrad.algorithms.sft import SFT, SFTConfig, SFTResult
    from agentgrad.gateway import Backend, Gateway
    from agentgrad.policy.config import PolicyConfig
    from agentgrad.rollout.agent import AgentError, LitAgent
    from agentgrad.rollout.emit import (
        emit_annotation,
        emit_exception,
        emit_message,
        emit_object,
        emit_reward,
        emit_span,
        operation,
    )
    from agentgrad.rollout.frameworks import instrument_frameworks
    from agentgrad.rollout.gateway_env import GatewayEnvHook
    from agentgrad.rollout.instrument import instrument_openai
    from agentgrad.rollout.judging import GroupJudge, Judge, Judgement, agroup_judge, ajudge, group_judge, judge
    from agentgrad.rollout.naming import agent
    from agentgrad.rollout.runner import Hook, Runner
    from agentgrad.store import (
        InvalidTransitionError,
        MemoryStore,
        NotFoundError,
        SqliteStore,
        Store,
        StoreError,
        open_store,
    )
    from agentgrad.train.trainer import Trainer
    from agentgrad.types import LLM, PromptTemplate, Rollout, RolloutConfig
