"""Which policy engine serves an algorithm's rollouts: the built-in engine, or vLLM servers.

`PolicyConfig` is the one place these settings live; GRPO and SFT embed it (`config.policy`), and
`make_policy` builds what it names: a `LocalPolicy` or a `VLLMPolicy`, siblings behind the `Policy` surface the
algorithms use (base.py: start/stop, `llm()`, the trainable model, `publish()` and `sync()`, checkpoints).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentgrad.gateway.replicas import ATTEMPT_WAIT_SECONDS

if TYPE_CHECKING:
    from agentgrad.engine import Engine
    from agentgrad.policy.base import Policy, PolicyOptions
    from agentgrad.serving import Listen
    from agentgrad.store import Store

ENGINES = ("local", "vllm")
TRANSPORTS = ("auto", "file", "lora", "nccl")


@dataclass(frozen=True)
class PolicyConfig:
    """What samples the rollouts, how its weights are kept in step, and what of them is trained."""

    # ---- the serving engine
    engine: str = (
        "local"  # "local" (the built-in engine, trained in place) or "vllm" (servers, synced after each update)
    )
    vllm_replicas: int = 1  # engine="vllm": servers started on loopback (one core each on a CPU)
    vllm_urls: Sequence[str] = ()  # engine="vllm": attach to these servers instead of starting any
    vllm_transport: str = (
        "auto"  # engine="vllm": weight sync by "file", "lora", "nccl", or "auto" (see policy.transports)
    )
    # ---- asynchronous training: a publish waits up to attempt_wait_s for the attempts begun on the old weights to
    # end (new attempts' first calls held meanwhile); those still running then are dropped from training, counted
    attempt_wait_s: float = ATTEMPT_WAIT_SECONDS
    # ---- what is trained
    lora_rank: int = 0  # > 0: train low-rank adapters instead of all weights
    lora_alpha: int = 16  # LoRA scaling numerator (the adapters' update is scaled by alpha / rank)
    # ---- the sampler/trainer mismatch
    tis_cap: float | None = (
        None  # truncated importance sampling: weigh each token by min(p_trainer/p_sampler, cap); None: off
    )

    def __post_init__(self) -> None:
        if not isinstance(self.engine, str):
            raise TypeError(
                f"engine is the kind of policy engine, 'local' or 'vllm', got {self.engine!r}: a loaded "
                "Engine object goes in local_engine=, e.g. GRPO(local_engine=engine)"
            )
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be 'local' or 'vllm', got {self.engine!r}")
        if isinstance(self.vllm_urls, str):
            raise TypeError(
                f"vllm_urls is a list of server URLs, got the string {self.vllm_urls!r}: pass [{self.vllm_urls!r}]"
            )
        object.__setattr__(self, "vllm_urls", tuple(self.vllm_urls))  # a list given is copied (a tuple), never shared
        if self.engine == "vllm" and self.vllm_replicas < 1 and not self.vllm_urls:
            raise ValueError(f"vllm_replicas must be at least 1 (or give vllm_urls), got {self.vllm_replicas}")
        if self.vllm_transport not in TRANSPORTS:
            raise ValueError(f"vllm_transport must be auto, file, lora or nccl, got {self.vllm_transport!r}")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0 (0 trains all weights), got {self.lora_rank}")
        if not self.attempt_wait_s >= 0:
            raise ValueError(
                f"attempt_wait_s must be >= 0 seconds (0: swap the weights between calls only), got {self.attempt_wait_s}"
            )
        if self.tis_cap is not None and not self.tis_cap >= 1.0:
            raise ValueError(
                f"tis_cap must be at least 1 (it caps p_trainer/p_sampler; typical: 2), or None, got {self.tis_cap}"
            )


def make_policy(
    policy: PolicyConfig,
    store: Store,
    local_engine: Engine | None,
    model: str | None,
    *,
    gateway_port: int = 0,
    listen: Listen | None = None,
    roles: Mapping[str, str] | None = None,
    default_role: str | None = None,
) -> Policy:
    """The policy `policy.engine` names: the built-in engine, or vLLM servers synced after each update.
    `roles` (role -> agent pattern): one LoRA adapter per role, served together by either; `default_role`'s
    adapter serves the agents no role matches (None: the base model does)."""
    options: PolicyOptions = {
        "lora_rank": policy.lora_rank,
        "lora_alpha": policy.lora_alpha,
        "gateway_port": gateway_port,
        "listen": listen,
        "adapters": roles,
        "default_adapter": default_role,
        "attempt_wait_s": policy.attempt_wait_s,
    }
    if policy.engine == "vllm":
        from agentgrad.policy.vllm import VLLMPolicy

        return VLLMPolicy(
            store,
            local_engine,
            model,
            replicas=policy.vllm_replicas,
            urls=policy.vllm_urls,
            transport=policy.vllm_transport,
            **options,
        )
    from agentgrad.policy.local import LocalPolicy

    return LocalPolicy(store, local_engine, model, **options)
