"""How every algorithm is configured: one dataclass each, built from the sections they share.

- `RunConfig`: what every run has (seed, trackers, validation size and threshold, how each rollout runs).
- `LoopConfig(RunConfig)`: the training loop of the algorithms that train weights (GRPO, SFT: steps, sampling,
  validation schedule, checkpoints, rollback, asynchronous rollouts, the optimizer, `PolicyConfig`).
- Each algorithm's own config adds its fields: `GRPOConfig`, `SFTConfig`, `APOConfig`, `BaselineConfig`.

`Algorithm(config, name=value)` copies the config with the overrides (`with_overrides`), never changes it; a
`PolicyConfig` field name sets `config.policy`'s; an unknown name is a TypeError listing the valid ones.
`rollout_timeout` means one thing everywhere: the seconds one attempt may take.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

from agentgrad.gateway.sampling import SamplingPlan, SamplingSource
from agentgrad.policy.config import PolicyConfig
from agentgrad.types import MissingReward, RolloutConfig

StaleGroups = Literal["drop", "keep"]
"""What a step does with a group sampled more than `max_staleness` updates ago."""
RollbackAction = Literal["lower_lr", "stop"]
"""What a run does after returning to its best weights: go on at a lower learning rate, or stop."""

ALIASES = {
    "rounds": "steps",
    "tasks_per_round": "prompts_per_step",
    "samples_per_task": "group_size",
    "train_batch_size": "prompts_per_step",
    "val_batch_size": "val_size",
}
"""Older spellings overrides still take: SFT's and APO's "rounds" are the steps every algorithm counts, and so on."""


@dataclass
class RunConfig:
    """What every algorithm's run shares: its seed and trackers, how it validates, how each rollout runs."""

    seed: int = 0  # task order, sampling seeds, shuffles: a rerun with the same seed runs the same tasks
    report_to: Sequence[str] = ()  # trackers that get the run's metrics too: "mlflow", "tensorboard", "wandb"
    # ---- each rollout
    rollout_timeout: float | None = 600.0  # seconds one attempt may take (None: no limit)
    max_attempts: int = 1  # attempts of a rollout whose agent fails (a lost runner's rollout runs again anyway)
    missing_reward: MissingReward = "fail"  # a rollout whose agent reports no reward fails ("zero": counts as 0)
    # ---- validation
    val_size: int | None = None  # validation tasks used (default: all)
    success_threshold: float = 1.0  # a rollout with at least this reward counts as a success (accuracy)

    def __post_init__(self) -> None:
        if isinstance(self.report_to, str):
            self.report_to = (self.report_to,)
        self.rollout_config()  # checks the rollout settings
        if self.val_size is not None and self.val_size < 1:
            raise ValueError(f"val_size must be at least 1 (or None for all), got {self.val_size}")

    def rollout_config(self) -> RolloutConfig:
        """The retry policy every rollout of the run is queued with."""
        return RolloutConfig(
            timeout_seconds=self.rollout_timeout, max_attempts=self.max_attempts, missing_reward=self.missing_reward
        )


@dataclass
class LoopConfig(RunConfig):
    """The training loop's settings (`algorithms/loop.py`), shared by every algorithm that trains weights."""

    # ---- the run
    steps: int = 20  # policy updates
    prompts_per_step: int = 8  # tasks sampled per step
    group_size: int = 8  # rollouts of each task per step
    max_failed_steps: int = 1  # stop after this many steps in a row in which every rollout failed (0: never)
    time_budget_s: float | None = None  # stop after the step that ends past this many seconds of this process's run
    # ---- sampling the rollouts
    temperature: float = 1.0  # sampling temperature of training rollouts; validation is greedy
    top_p: float = 1.0  # nucleus sampling of training rollouts
    max_tokens: int = 48  # per model call
    sampling: SamplingSource = "trainer"  # the gateway applies the above to every call ("agent": where it set none)
    resource_name: str = "llm"  # name of the LLM resource the agent asks for
    agent_match: str | None = None  # train only the calls of this agent (regex on its ag.agent name; unnamed: model)
    # ---- validation
    val_every: int = 5  # validate every k steps (and always before the first and after the last; 0: only those)
    # ---- checkpoints
    checkpoint_dir: str | None = None  # where step-N checkpoints go; a run resumes from the newest
    checkpoint_every: int = 0  # save every k steps (0: only at the end, when checkpoint_dir is set)
    keep_checkpoints: int = 2  # the newest k step-N folders stay, and the best-validated one (0: keep all)
    # ---- rollback on regression (algorithms/rollback.py)
    rollback_on_drop: float | None = None  # validation accuracy this far below its best: back to the best weights
    rollback_action: RollbackAction = "lower_lr"  # after a rollback: go on at a lower learning rate, or "stop"
    rollback_lr_factor: float = 0.5  # "lower_lr": the learning rate is multiplied by this at each rollback
    # ---- asynchronous training (docs/async-training.md): the next steps' rollouts run while a step trains
    max_staleness: int | None = None  # None: synchronous; k: k steps queued ahead, groups > k updates old dropped
    stale_groups: StaleGroups = "drop"  # a group over max_staleness: "drop" (counted) or "keep" (tis_cap corrects)
    # ---- the optimizer (AdamW)
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # gradient clipping (global norm)
    gradient_checkpointing: bool = False  # recompute each layer's activations in backward instead of keeping them
    train_processes: int = 1  # > 1: the update sharded with FSDP2 over this many processes (Ray actors under "ray")
    # ---- a warm start: SFT on demonstrations (`Algorithm(demonstrations=...)`) before the first step
    warm_start_epochs: int = 1  # passes over the demonstrations
    warm_start_learning_rate: float = 2e-4  # an AdamW of its own: SFT's rate, not the RL step's
    warm_start_batch_size: int = 8  # demonstrations per optimizer step
    warm_start_frozen_context: bool = False  # each one's context under no_grad: its answer trained, ~2.4x faster
    # ---- the policy: serving engine, LoRA, truncated importance sampling (`GRPO(engine="vllm")` sets policy.engine)
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.policy, PolicyConfig):
            raise TypeError(f"{type(self).__name__}.policy is a PolicyConfig, got {type(self.policy).__name__}")
        SamplingPlan(source=self.sampling)  # checks it
        if self.max_staleness is not None and (isinstance(self.max_staleness, bool) or self.max_staleness < 0):
            raise ValueError(
                f"max_staleness must be None (synchronous) or an int >= 0 (updates a trained group may lag), "
                f"got {self.max_staleness!r}"
            )
        if self.stale_groups not in ("drop", "keep"):
            raise ValueError(f"stale_groups must be 'drop' or 'keep', got {self.stale_groups!r}")
        if self.rollback_on_drop is not None:
            if not self.rollback_on_drop > 0:
                raise ValueError(
                    f"rollback_on_drop is a drop of the validation accuracy (> 0, like 0.1), got {self.rollback_on_drop}"
                )
            if self.rollback_action not in ("lower_lr", "stop"):
                raise ValueError(f"rollback_action is 'lower_lr' or 'stop', not {self.rollback_action!r}")
            if not 0 < self.rollback_lr_factor < 1:
                raise ValueError(
                    "rollback_lr_factor multiplies the learning rate after a rollback: in (0, 1), "
                    f"got {self.rollback_lr_factor}"
                )
            if self.max_staleness:
                raise ValueError(
                    "rollback_on_drop needs synchronous training (max_staleness None or 0): rollouts queued ahead "
                    "were sampled by the weights a rollback discards"
                )
        for name, least in (
            ("steps", 0), ("prompts_per_step", 1), ("group_size", 1), ("warm_start_epochs", 1),
            ("warm_start_batch_size", 1),
        ):  # fmt: skip
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be at least {least}, got {getattr(self, name)}")
        for name, zero in (("max_failed_steps", "never stop"), ("checkpoint_every", "only at the end")):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: {zero}), got {getattr(self, name)}")
        if self.keep_checkpoints < 0:
            raise ValueError(f"keep_checkpoints must be >= 0 (0 keeps all), got {self.keep_checkpoints}")
        if self.val_every < 0:
            raise ValueError("val_every must be >= 0 (0: before the first step and after the last only)")
        check_time_budget(self.time_budget_s)
        for name in ("learning_rate", "warm_start_learning_rate"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.train_processes < 1:
            raise ValueError(f"train_processes must be at least 1, got {self.train_processes}")
        if self.train_processes > 1 and self.policy.lora_rank > 0:
            raise ValueError(
                "train_processes > 1 shards full weights; LoRA (lora_rank > 0) trains in one process: "
                "set train_processes=1 or lora_rank=0"
            )


def check_time_budget(seconds: float | None) -> None:
    """A run's `time_budget_s`: None (no limit) or a positive number of seconds."""
    if seconds is not None and (isinstance(seconds, bool) or not seconds > 0):
        raise ValueError(f"time_budget_s is a number of seconds (> 0), or None for no limit; got {seconds!r}")


C = TypeVar("C")


def with_overrides(config: C, overrides: Mapping[str, Any], algorithm: str) -> C:
    """A copy of `config` (a dataclass) with keyword overrides applied; `config` itself is unchanged.

    A name of a field of a nested config (`policy`, a `PolicyConfig`) goes to that field's copy, so
    `GRPO(engine="vllm")` sets `config.policy.engine`; an older spelling (`ALIASES`: `rounds`) is taken for the
    name it stands for. An unknown name is a TypeError listing the valid ones; values are checked by the configs'
    own `__post_init__`.
    """
    fields = {f.name: f for f in dataclasses.fields(config) if f.init}  # type: ignore[arg-type]
    nested = {
        name: type(value)
        for name, value in ((n, getattr(config, n)) for n in fields)
        if dataclasses.is_dataclass(value) and not isinstance(value, type)
    }
    inner: dict[str, dict[str, Any]] = {name: {} for name in nested}
    top: dict[str, Any] = {}
    for given, value in overrides.items():
        key = ALIASES.get(given, given) if given not in fields else given
        if key in fields:
            top[key] = value
            continue
        owner = next((name for name, kind in nested.items() if key in {f.name for f in dataclasses.fields(kind)}), None)
        if owner is None:
            valid = sorted(set(fields) | {f.name for kind in nested.values() for f in dataclasses.fields(kind)})
            raise TypeError(
                f"{algorithm} has no setting {given!r}; the settings of {type(config).__name__} are: {', '.join(valid)}"
            )
        inner[owner][key] = value
    for name, values in inner.items():  # nested first: the whole config is checked once, with all its overrides
        if values:
            top[name] = dataclasses.replace(top.get(name, getattr(config, name)), **values)
    copied: Any = dataclasses.replace(config, **top)  # type: ignore[type-var]  # C is a dataclass, as fields() checked
    return cast(C, copied)


def configured(config: C | None, default: type[C], overrides: Mapping[str, Any], algorithm: str) -> C:
    """An algorithm's config: `config` (or `default()`) copied with `overrides`; a config of another algorithm is a
    TypeError naming the one it takes."""
    if config is not None and not isinstance(config, default):
        raise TypeError(
            f"{algorithm} takes a {default.__name__} (or keyword settings), got a {type(config).__name__}: "
            f"{algorithm}({default.__name__}(...), name=value)"
        )
    return with_overrides(config if config is not None else default(), overrides, algorithm)
