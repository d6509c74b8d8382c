"""`GRPOConfig`: every hyper-parameter of a GRPO run, checked when it is built (`algorithms/grpo.py` runs it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agentgrad.algorithms.async_rollouts import StaleGroups, check_async_settings
from agentgrad.algorithms.credit import Credit
from agentgrad.algorithms.roles import check_roles
from agentgrad.algorithms.rollback import RollbackAction, RollbackGuard
from agentgrad.gateway.sampling import SamplingPlan, SamplingSource
from agentgrad.policy.config import PolicyConfig
from agentgrad.types import MissingReward, RolloutConfig


@dataclass
class GRPOConfig:
    """Every hyper-parameter of a GRPO run; `GRPO(config, name=value)` overrides copy it, never change it."""

    # ---- the run
    steps: int = 20  # policy updates
    prompts_per_step: int = 8  # tasks sampled per step
    group_size: int = 8  # rollouts per task; advantages are normalized within each task's group
    seed: int = 0  # task order and each training call's sampling seed (reproducible; a resumed run continues it)
    max_failed_steps: int = 1  # stop after this many steps in a row in which every rollout failed (0: never)
    report_to: Sequence[str] = ()  # trackers that get the run's metrics too: "mlflow", "tensorboard", "wandb"
    # ---- sampling the rollouts
    temperature: float = 1.0  # sampling temperature of training rollouts; validation is greedy
    top_p: float = 1.0  # nucleus sampling of training rollouts
    max_tokens: int = 48  # per model call
    sampling: SamplingSource = (
        "trainer"  # the gateway applies the above to every call ("agent": only where the agent set none)
    )
    missing_reward: MissingReward = "fail"  # a rollout whose agent reports no reward fails ("zero": counts as reward 0)
    rollout_timeout: float = 600.0  # seconds an attempt may take
    resource_name: str = "llm"  # name of the LLM resource the agent asks for
    agent_match: str | None = (
        None  # train only the calls of this agent (regex on its ag.agent name; unnamed calls: model)
    )
    roles: Mapping[str, str] | None = (
        None  # role -> agent pattern: one LoRA adapter per role, trained together (roles.py)
    )
    default_role: str | None = (
        None  # roles: the role whose adapter serves and trains the agents no role matches (None: the base serves them)
    )
    # ---- advantages
    normalize_std: bool = (
        True  # divide advantages by the group's reward std (GRPO); False: mean-centred only (Dr. GRPO)
    )
    skip_uniform_groups: bool = True  # a group whose rewards are all equal carries no signal
    credit: Credit = "final"  # "final": the final reward's advantage for every call; "per_turn": docs/algorithms.md
    gamma: float = 1.0  # per_turn: discount of later turns' rewards in each call's return-to-go
    # ---- the loss: clipped surrogate, token mean over the step (DAPO's token-level aggregation)
    clip_eps: float = 0.2  # PPO clip range of the ratio new/old probability
    kl_coef: float = 0.0  # > 0: k3 KL penalty to the starting weights (a frozen copy; the base weights under LoRA)
    # ---- the optimizer
    learning_rate: float = 1e-5  # AdamW
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # gradient clipping (global norm)
    micro_batch_size: int = 32  # sequences per forward/backward; gradients accumulate over the step
    gradient_checkpointing: bool = False  # recompute each layer's activations in backward instead of keeping them
    updates_per_step: int = 1  # optimizer passes over each step's batch (> 1 reuses samples, off-policy)
    # ---- asynchronous training (docs/async-training.md): the next steps' rollouts run while a step trains
    max_staleness: int | None = None  # None: synchronous; k: k steps queued ahead, groups > k updates old dropped
    stale_groups: StaleGroups = "drop"  # a group over max_staleness: "drop" (counted) or "keep" (tis_cap corrects)
    train_processes: int = 1  # > 1: the update sharded with FSDP2 over this many processes (Ray actors under strategy="ray"); under torchrun, every launched rank
    # ---- the policy: serving engine, LoRA, truncated importance sampling (`GRPO(engine="vllm")` sets policy.engine)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # ---- validation
    val_every: int = 5  # validate every k steps (and always before the first and after the last)
    val_size: int | None = None  # validation tasks used (default: all)
    success_threshold: float = 1.0  # a rollout with at least this reward counts as a success (accuracy)
    # ---- checkpoints
    checkpoint_dir: str | None = None  # where step-N checkpoints go; a run resumes from the newest
    checkpoint_every: int = 0  # save every k steps (0: only at the end, when checkpoint_dir is set)
    keep_checkpoints: int = (
        2  # the newest k step-N folders stay, older ones are deleted (0: keep all); each holds weights and optimizer
    )
    # ---- rollback on regression (agentgrad/algorithms/rollback.py)
    rollback_on_drop: float | None = None  # validation accuracy this far below its best: back to the best weights
    rollback_action: RollbackAction = "lower_lr"  # after a rollback: go on at a lower learning rate, or "stop"
    rollback_lr_factor: float = 0.5  # "lower_lr": the learning rate is multiplied by this at each rollback

    def __post_init__(self) -> None:
        if not isinstance(self.policy, PolicyConfig):
            raise TypeError(f"GRPOConfig.policy is a PolicyConfig, got {type(self.policy).__name__}")
        SamplingPlan(source=self.sampling)  # checks it
        RolloutConfig(missing_reward=self.missing_reward)
        check_async_settings(self.max_staleness, self.stale_groups)
        if self.max_failed_steps < 0:
            raise ValueError(f"max_failed_steps must be >= 0 (0: never stop), got {self.max_failed_steps}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be at least 2 to compare rollouts of a task, got {self.group_size}")
        if self.rollback_on_drop is not None:
            RollbackGuard(self.rollback_on_drop, self.rollback_action, self.rollback_lr_factor)  # checks them
            if self.max_staleness:
                raise ValueError(
                    "rollback_on_drop needs synchronous training (max_staleness None or 0): rollouts queued ahead "
                    "were sampled by the weights a rollback discards"
                )
        if self.credit not in ("final", "per_turn") or not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"credit is 'final' or 'per_turn' and 0 <= gamma <= 1, got {self.credit!r}, {self.gamma}")
        if self.roles:
            self.roles = dict(self.roles)  # a copy: the caller's mapping stays theirs
            check_roles(self.roles, self)
        elif self.default_role is not None:
            raise ValueError(f"default_role={self.default_role!r} names one of the roles: give roles= too, or drop it")
        if self.keep_checkpoints < 0:
            raise ValueError(f"keep_checkpoints must be >= 0 (0 keeps all), got {self.keep_checkpoints}")
        for name in ("steps", "prompts_per_step", "micro_batch_size", "updates_per_step", "train_processes"):
            if getattr(self, name) < (0 if name == "steps" else 1):
                raise ValueError(f"{name} must be at least {0 if name == 'steps' else 1}, got {getattr(self, name)}")
