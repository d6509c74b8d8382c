"""Which policy engine serves an algorithm's rollouts: the built-in engine, or vLLM servers.

GRPO and SFT take it from their config (`engine="local" | "vllm"`); both policies have the surface
the algorithms use (start/stop, `llm()`, the trainable model, `sync()`, checkpoints).
"""

from __future__ import annotations

from typing import Any

from agentgrad.policy.local import LocalPolicy
from agentgrad.policy.vllm import VLLMPolicy
from agentgrad.engine import Engine
from agentgrad.store import Store


def check_engine_config(cfg: Any) -> None:
    """Raise ValueError naming a bad engine or correction field (shared by GRPO and SFT configs)."""
    if cfg.engine not in ("local", "vllm"):
        raise ValueError(f"engine must be 'local' or 'vllm', got {cfg.engine!r}")
    if cfg.engine == "vllm" and cfg.vllm_replicas < 1 and not cfg.vllm_urls:
        raise ValueError(f"vllm_replicas must be at least 1 (or give vllm_urls), got {cfg.vllm_replicas}")
    if cfg.vllm_transport not in ("auto", "file", "lora", "nccl"):
        raise ValueError(f"vllm_transport must be auto, file, lora or nccl, got {cfg.vllm_transport!r}")
    cap = getattr(cfg, "tis_cap", None)
    if cap is not None and not cap >= 1.0:
        raise ValueError(f"tis_cap must be at least 1 (it caps p_trainer/p_sampler; typical: 2), or None, got {cap}")


def make_policy(cfg: Any, store: Store, engine: Engine | None, model: str | None, *, gateway_port: int = 0) -> LocalPolicy:
    """The policy `cfg.engine` names: the built-in engine, or vLLM servers synced after each update."""
    if cfg.engine == "vllm":
        return VLLMPolicy(store, engine, model, replicas=cfg.vllm_replicas, urls=cfg.vllm_urls,
                          transport=cfg.vllm_transport, lora_rank=cfg.lora_rank, lora_alpha=getattr(cfg, "lora_alpha", 16),
                          gateway_port=gateway_port)
    return LocalPolicy(store, engine, model, lora_rank=cfg.lora_rank, lora_alpha=getattr(cfg, "lora_alpha", 16),
                       gateway_port=gateway_port)
