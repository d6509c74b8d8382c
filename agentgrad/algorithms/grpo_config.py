"""`GRPOConfig`: every hyper-parameter of a GRPO run, checked when it is built (`algorithms/grpo.py` runs it).

The run, sampling, validation, checkpoint, rollback, asynchronous, optimizer and policy settings are the training
loop's (`LoopConfig`, config.py); the fields below are GRPO's own: advantages, the loss, roles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agentgrad.algorithms.config import LoopConfig
from agentgrad.algorithms.credit import Credit
from agentgrad.algorithms.roles import check_roles


@dataclass
class GRPOConfig(LoopConfig):
    """Every hyper-parameter of a GRPO run; `GRPO(config, name=value)` overrides copy it, never change it."""

    # ---- advantages (algorithms/credit.py)
    normalize_std: bool = True  # divide advantages by the group's reward std (GRPO); False: mean-centred (Dr. GRPO)
    skip_uniform_groups: bool = True  # a group whose rewards are all equal carries no signal
    dynamic_sampling: int = 0  # DAPO: up to this many more draws of prompts_per_step tasks while fewer groups differ
    credit: Credit = "final"  # "final": the final reward's advantage for every call; "per_turn": docs/algorithms.md
    gamma: float = 1.0  # per_turn: discount of later turns' rewards in each call's return-to-go
    # ---- the loss: clipped surrogate, token mean over the step (DAPO's token-level aggregation)
    clip_eps: float = 0.2  # PPO clip range of the ratio new/old probability
    kl_coef: float = 0.0  # > 0: k3 KL penalty to the starting weights (a frozen copy; the base weights under LoRA)
    updates_per_step: int = 1  # optimizer passes over each step's batch (> 1 reuses samples, off-policy)
    micro_batch_size: int = 32  # sequences per forward/backward; gradients accumulate over the step
    # ---- roles (algorithms/roles.py): one LoRA adapter per agent role, trained together
    roles: Mapping[str, str] | None = None  # role -> agent pattern (a regex on the ag.agent name)
    default_role: str | None = None  # the role whose adapter serves the agents no role matches (None: the base)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError(f"group_size must be at least 2 to compare rollouts of a task, got {self.group_size}")
        for name in ("updates_per_step", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.dynamic_sampling < 0:
            raise ValueError(
                f"dynamic_sampling is a number of extra draws a step may make (>= 0), got {self.dynamic_sampling}"
            )
        if self.dynamic_sampling and self.max_staleness is not None:
            raise ValueError(
                "dynamic_sampling draws a step's extra groups on the weights that step trains: synchronous training "
                f"only (max_staleness None), got max_staleness={self.max_staleness}"
            )
        if self.credit not in ("final", "per_turn") or not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"credit is 'final' or 'per_turn' and 0 <= gamma <= 1, got {self.credit!r}, {self.gamma}")
        if self.roles:
            self.roles = dict(self.roles)  # a copy: the caller's mapping stays theirs
            check_roles(self.roles, self)
        elif self.default_role is not None:
            raise ValueError(f"default_role={self.default_role!r} names one of the roles: give roles= too")
