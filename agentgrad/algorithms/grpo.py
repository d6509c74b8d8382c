"""GRPO: group relative policy optimization of a local model, through the real agent.

Each step: sample tasks, run each `group_size` times through runners → gateway → engine,
turn each rollout's spans into token sequences (the exact ids the engine sampled, with their
logprobs), normalize rewards within each task's group, and take a clipped policy-gradient
step on the response tokens. The engine serves the new weights from the next request on.

Read top to bottom: the config; the math (group advantages, the clipped per-token loss, the
truncated importance-sampling weights, and the update that aggregates them as a token mean over
the step); the update in its local and sharded forms; then the loop (collect, adapt, optimize,
log, validate and checkpoint).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentgrad.adapters import Trajectory, final_answer, to_trajectories
from agentgrad.algorithms.async_rollouts import RolloutPipeline, StaleGroups, check_async_settings
from agentgrad.algorithms.base import (
    Algorithm,
    Evaluation,
    RunContext,
    count_no_reward,
    flag_no_model_calls,
    no_model_calls_error,
    with_overrides,
)
from agentgrad.algorithms.credit import Advantage, Credit, per_turn_pairs, useful_groups
from agentgrad.algorithms.roles import RoleBatch, RoleUpdate, check_roles, role_batches, role_metrics
from agentgrad.algorithms.rollback import RollbackAction, RollbackGuard, after_validation
from agentgrad.distributed.fsdp import ShardedPolicy, clip_grad_norm, idle_trajectory
from agentgrad.distributed.group import TrainingGroup, deliver, follow, open_group
from agentgrad.engine import Engine
from agentgrad.engine.training import ScoredSequence, StepPrefix, sequence_logprobs
from agentgrad.gateway.sampling import SamplingPlan, SamplingSource
from agentgrad.policy.checkpoints import (
    BestCheckpoint,
    complete_checkpoints,
    latest_checkpoint,
    load_sharded_checkpoint,
    prune_checkpoints,
    save_sharded_checkpoint,
)
from agentgrad.policy.config import PolicyConfig, make_policy
from agentgrad.policy.local import LocalPolicy
from agentgrad.semconv import is_llm_call
from agentgrad.types import MissingReward, Rollout, RolloutConfig, RolloutStatus

GroupReward = Callable[[Any, Sequence[str]], Awaitable[Sequence[float]]]
"""Rewards for one group: (the task, each successful rollout's final answer) -> one reward each (`GRPO(group_reward=...)`)."""

IDENTICAL_STEPS = 3
"""Steps in a row whose every group sampled identical rollouts before GRPO says so (once)."""


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


# ----------------------------------------------------------------------------- the math


def group_advantages(
    rewards: Sequence[float], groups: Sequence[Hashable], normalize_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """Each reward minus its group's mean, divided by the group's std (population) when asked.

    `normalize_std=True` is GRPO's advantage; False keeps only the mean-centring (Dr. GRPO), which
    does not up-weight the groups whose rewards barely differ.
    """
    members: dict[Hashable, list[float]] = {}
    for reward, group in zip(rewards, groups):
        members.setdefault(group, []).append(reward)
    stats = {g: (statistics.fmean(v), statistics.pstdev(v)) for g, v in members.items()}
    advantages = []
    for reward, group in zip(rewards, groups):
        mean, std = stats[group]
        advantages.append((reward - mean) / (std + eps) if normalize_std else reward - mean)
    return advantages


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantage: float | torch.Tensor,
    clip_eps: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate loss (PPO), plus `kl_coef` × k3 KL to the reference.

    Returns the per-token loss and per-token diagnostics: whether the clip was active, and
    the k3 estimate of KL(new ‖ old).
    """
    log_ratio = new_logprobs - old_logprobs
    ratio = log_ratio.exp()
    unclipped = ratio * advantage
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantage
    loss = -torch.minimum(unclipped, clipped)
    if ref_logprobs is not None and kl_coef > 0:
        to_ref = ref_logprobs - new_logprobs
        loss = loss + kl_coef * (to_ref.exp() - to_ref - 1)
    with torch.no_grad():
        diagnostics = {
            "clipped": (clipped < unclipped).float(),
            "kl": (-log_ratio).exp() - 1 + log_ratio,
        }
    return loss, diagnostics


def tis_weights(
    trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, cap: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance sampling: per token min(p_trainer / p_sampler, cap), no gradient through it,
    and where the cap bit. With `cap=None`, weights of one (off).

    The sampler (vLLM in bf16, or any engine) and the trainer's forward pass give slightly
    different probabilities; the ratio corrects the gradient for sampling from the sampler.
    """
    if cap is None:
        ones = torch.ones_like(sampler_logprobs)
        return ones, torch.zeros_like(ones)
    ratio = (trainer_logprobs.detach() - sampler_logprobs).exp()
    return ratio.clamp(max=cap), (ratio > cap).float()


def grpo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Sequence[tuple[Trajectory, Advantage]],
    cfg: GRPOConfig,
    pad_token_id: int = 0,
    reference: torch.nn.Module | None = None,
    *,
    total_tokens: int | None = None,
    micro_batches: int = 0,
) -> dict[str, float]:
    """`updates_per_step` AdamW steps over (trajectory, advantage) pairs, in micro-batches.

    Loss aggregation: the token mean over the step, as DAPO aggregates it (every response token of
    the step weighs the same, whatever its sequence's length), not GRPO's mean of per-sequence means.
    Each token's loss is `policy_loss` times its TIS weight (`tis_weights`, off unless `policy.tis_cap`).
    One rank of a sharded update (`agentgrad.distributed`) passes its share of the step as
    `batch`, the whole step's `total_tokens`, and the `micro_batches` every rank must run (a
    pass with nothing left to score runs on an idle sequence with zero weight).
    """

    parameters = [p for p in model.parameters() if p.requires_grad]
    total_tokens = total_tokens or sum(t.response_length for t, _ in batch)
    micros = [batch[start : start + cfg.micro_batch_size] for start in range(0, len(batch), cfg.micro_batch_size)]
    micros += [[(idle_trajectory(pad_token_id), 0.0)]] * (micro_batches - len(micros))
    sums = {"loss": 0.0, "clipped": 0.0, "kl": 0.0, "logprob_diff": 0.0, "tis_truncated": 0.0, "is_weight": 0.0}
    grad_norm = is_weight_max = 0.0
    for _ in range(cfg.updates_per_step):
        optimizer.zero_grad(set_to_none=True)
        prefix = StepPrefix(model, [ScoredSequence(t.token_ids, t.prompt_length) for t, _ in batch])
        for micro in micros:
            sequences = [ScoredSequence(t.token_ids, t.prompt_length) for t, _ in micro]
            temperature = micro[0][0].temperature
            new = sequence_logprobs(model, sequences, temperature, pad_token_id, prefix)
            ref = None
            if cfg.kl_coef > 0:
                with torch.no_grad():
                    ref = _reference_logprobs(model, reference, sequences, temperature, pad_token_id)
            loss = torch.zeros((), device=new[0].device)
            for i, ((trajectory, advantage), new_logprobs) in enumerate(zip(micro, new)):
                mask = torch.tensor(
                    trajectory.loss_mask[trajectory.prompt_length :], dtype=torch.float32, device=loss.device
                )
                old = torch.tensor(trajectory.logprobs[trajectory.prompt_length :], device=loss.device)
                # per-turn credit: one advantage per response token
                scale = (
                    advantage if isinstance(advantage, (int, float)) else torch.tensor(advantage, device=loss.device)
                )
                token_loss, diag = policy_loss(
                    new_logprobs, old, scale, cfg.clip_eps, None if ref is None else ref[i], cfg.kl_coef
                )
                # off-policy correction: `old` is the sampler's (vLLM's) logprob, the behaviour policy
                weight, truncated = tis_weights(new_logprobs, old, cfg.policy.tis_cap)
                # importance weight trainer/recorded (truncated at the cap): what staleness costs, as metrics
                is_weight = weight if cfg.policy.tis_cap is not None else (new_logprobs.detach() - old).exp()
                sums["is_weight"] += float((is_weight * mask).sum())
                is_weight_max = max([is_weight_max, *(is_weight * mask).tolist()])
                loss = loss + (token_loss * weight * mask).sum() / total_tokens
                sums["logprob_diff"] += float(((new_logprobs.detach() - old).abs() * mask).sum())
                sums["tis_truncated"] += float((truncated * mask).sum())
                sums["clipped"] += float((diag["clipped"] * mask).sum())
                sums["kl"] += float((diag["kl"] * mask).sum())
            loss.backward()
            sums["loss"] += float(loss.detach())
        prefix.backward()
        grad_norm = clip_grad_norm(parameters, cfg.max_grad_norm)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    passes = cfg.updates_per_step
    return {
        "loss": sums["loss"] / passes,
        "clip_fraction": sums["clipped"] / (total_tokens * passes),
        "kl": sums["kl"] / (total_tokens * passes),
        "logprob_diff": sums["logprob_diff"] / (total_tokens * passes),  # mean |trainer - sampler| per token
        "tis_truncated": sums["tis_truncated"] / (total_tokens * passes),
        "is_weight_mean": sums["is_weight"] / (total_tokens * passes),
        "is_weight_max": is_weight_max,
        "grad_norm": grad_norm if math.isfinite(grad_norm) else float("nan"),
    }


# ----------------------------------------------------------------------------- the update, local or sharded


def sharded_grpo_step(
    sharded: ShardedPolicy, batch: Sequence[tuple[Trajectory, Advantage]], cfg: GRPOConfig, pad_token_id: int
) -> dict[str, float]:
    """`grpo_update` on one rank's share of the whole step's `batch` (run by `ShardedPolicy.run` on every
    rank); the loss is over the step's global token count, so the ranks' sum is the one-process update."""
    share, most = sharded.share([len(t.token_ids) for t, _ in batch])
    micro_batches = math.ceil(most / cfg.micro_batch_size)  # the same on every rank
    total = sum(t.response_length for t, _ in batch)
    stats = grpo_update(
        sharded.model,
        sharded.optimizer,
        [batch[i] for i in share],
        cfg,
        pad_token_id,
        sharded.reference,
        total_tokens=total,
        micro_batches=micro_batches,
    )
    # loss, clip fraction and KL are sums of per-rank parts (each already divided by the global count)
    names = ["loss", "clip_fraction", "kl", "logprob_diff", "tis_truncated", "is_weight_mean"]
    parts = torch.tensor([stats[name] for name in names], dtype=torch.float64)
    torch.distributed.all_reduce(parts)
    return {**stats, **{name: float(value) for name, value in zip(names, parts)}}


def rollback_guard(cfg: GRPOConfig, checkpoint_dir: Path | None, update: Any) -> RollbackGuard | None:
    """The guard of `rollback_on_drop`, keeping the best beside the run's checkpoints; None when it is off."""
    if cfg.rollback_on_drop is None:
        return None
    if not hasattr(update, "optimizer"):
        raise ValueError("rollback_on_drop needs the update in this process (train_processes=1)")
    return RollbackGuard(cfg.rollback_on_drop, cfg.rollback_action, cfg.rollback_lr_factor, checkpoint_dir)


class LocalUpdate:
    """The update in this process: AdamW over the policy's trainable weights (and a frozen reference
    for the KL term); after each step the engine serves the new weights and the policy syncs them."""

    def __init__(self, policy: LocalPolicy, cfg: GRPOConfig) -> None:
        self.policy, self.cfg = policy, cfg
        if cfg.max_staleness is not None:
            policy.train_beside_serving()  # asynchronous: generation goes on from the published weights
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
        )
        self.reference = _frozen_copy(policy.model) if cfg.kl_coef > 0 and cfg.policy.lora_rank == 0 else None
        if cfg.gradient_checkpointing:  # less memory for ~1/3 more compute; training mode only, sampling is unchanged
            policy.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def step(self, batch: Sequence[tuple[Trajectory, Advantage]]) -> dict[str, float]:
        """One step's update; its statistics, with `sync_seconds` (new weights into the engine and servers)."""
        with self.policy.training() as model:
            pad = self.policy.engine.tokenizer.pad_token_id
            stats = grpo_update(model, self.optimizer, batch, self.cfg, pad, self.reference)
        began = time.perf_counter()
        self.policy.publish()  # between calls: those in flight finish on the version they began with
        self.policy.sync()  # vLLM: the new weights reach the servers before the next rollout
        return {**stats, "sync_seconds": time.perf_counter() - began}

    def save(self, directory: Path, state: dict[str, Any]) -> None:
        self.policy.save(directory, self.optimizer, state)

    def load(self, directory: Path) -> dict[str, Any]:
        return self.policy.load(directory, self.optimizer)

    def close(self) -> None:
        pass


class ShardedUpdate:
    """The update sharded over a training group (FSDP2): every rank updates its shard, then rank 0's
    full weights go to the engine and the servers (`deliver`)."""

    def __init__(self, group: TrainingGroup, policy: LocalPolicy, cfg: GRPOConfig) -> None:
        self.group, self.policy, self.cfg = group, policy, cfg
        if cfg.max_staleness is not None:  # asynchronous: new weights land in a copy, published between attempts
            policy.train_beside_serving()

    def step(self, batch: Sequence[tuple[Trajectory, Advantage]]) -> dict[str, float]:
        stats = self.group.call("run", sharded_grpo_step, batch, self.cfg, self.policy.engine.tokenizer.pad_token_id)
        began = time.perf_counter()
        deliver(self.policy, self.group.call("full_state_dict"))
        return {**stats, "sync_seconds": time.perf_counter() - began}

    def save(self, directory: Path, state: dict[str, Any]) -> None:
        save_sharded_checkpoint(self.group, self.policy, directory, state)

    def load(self, directory: Path) -> dict[str, Any]:
        return load_sharded_checkpoint(self.group, self.policy, directory)

    def close(self) -> None:
        self.group.close()


def open_update(
    policy: LocalPolicy, cfg: GRPOConfig, launcher: Callable[..., TrainingGroup] | None
) -> LocalUpdate | ShardedUpdate | RoleUpdate:
    """The sharded update when a training group is asked for (`train_processes > 1`, or torchrun), one update per
    role's adapter under `roles`, else the local one."""
    if cfg.roles:
        return RoleUpdate(policy, cfg, grpo_update)
    group = open_group(
        cfg.train_processes,
        policy,
        launcher,
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        kl_reference=cfg.kl_coef > 0,
    )
    return LocalUpdate(policy, cfg) if group is None else ShardedUpdate(group, policy, cfg)


# ----------------------------------------------------------------------------- the loop


@dataclass
class GRPOResult:
    steps: int
    initial: Evaluation | None
    final: Evaluation | None
    checkpoint: str | None
    history: list[dict[str, float]] = field(default_factory=list)
    best_checkpoint: BestCheckpoint | None = None  # the kept checkpoint that validated best
    checkpoints: list[str] = field(default_factory=list)  # every checkpoint kept, oldest first


@dataclass
class StepBatch:
    """One step's rollouts turned into training data."""

    scored: list[tuple[Trajectory, Advantage]]  # (trajectory, advantage) of the groups kept, what the update trains on
    rewards: list[float]  # of every rollout that succeeded
    groups_kept: int  # groups whose rewards differ (all of them when skip_uniform_groups is off)
    sampled: list[Trajectory]  # every trajectory of a successful rollout, kept or not
    rewarded: int = 0  # successful rollouts
    model_calls: int = 0  # LLM-call spans of the successful rollouts
    groups_compared: int = 0  # groups with at least two successful rollouts
    groups_identical: int = 0  # ... whose rollouts all sampled the same tokens
    roles: dict[str, RoleBatch] = field(default_factory=dict)  # under `roles`: each role's batch (`scored` joins them)


class GRPO(Algorithm["GRPOResult"]):
    """`GRPO(GRPOConfig(...), local_engine=..., name=value, ...)`; without an engine, loads `model` (default SmolLM2).

    Keyword overrides copy the config (`dataclasses.replace`), never change it; a `PolicyConfig`
    field name (`engine="vllm"`, `lora_rank=8`, `tis_cap=2.0`, ...) sets `config.policy`'s.
    `local_engine` is a built-in `Engine` already loaded in this process, whose weights are trained.
    `group_reward` (`agentgrad.judge.GroupJudge`, or any async `(task, final answers) -> rewards`) replaces the
    agents' rewards of each group's successful rollouts with ones scored side by side (a judge, for tasks
    with no checker).
    """

    serves_gateway = True

    def __init__(
        self,
        config: GRPOConfig | None = None,
        *,
        local_engine: Engine | None = None,
        model: str | None = None,
        group_reward: GroupReward | None = None,
        **overrides: Any,
    ) -> None:
        self.config = with_overrides(config or GRPOConfig(), overrides, "GRPO", {"policy": PolicyConfig})
        self.local_engine = local_engine
        self.model_name = model
        self.group_reward = group_reward

    async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> GRPOResult:
        self.bind(ctx)
        cfg = self.config
        if not train_data:
            raise ValueError("GRPO needs training tasks")
        with make_policy(
            cfg.policy,
            ctx.store,
            self.local_engine,
            self.model_name,
            gateway_port=ctx.gateway_port,
            roles=cfg.roles,
            default_role=cfg.default_role,
        ) as policy:
            # ---- the update sharded over several processes (agentgrad.distributed), when asked
            update = open_update(policy, cfg, ctx.launcher)
            try:
                return await self._train(policy, update, list(train_data), list(val_data or [])[: cfg.val_size])
            finally:
                update.close()

    def follow(self) -> None:
        """A rank past 0 under torchrun: build this rank's shard and join each update rank 0 runs."""
        from agentgrad.engine.model import load_model

        follow(lambda: self.local_engine.model if self.local_engine is not None else load_model(self.model_name)[0])

    async def _train(
        self,
        policy: LocalPolicy,
        update: LocalUpdate | ShardedUpdate | RoleUpdate,
        train_data: list[Any],
        val_data: list[Any],
    ) -> GRPOResult:
        cfg = self.config
        engine = policy.engine
        # ---- resources: the agent's other resources, plus the policy behind the gateway
        train_id = await self.publish_with(
            cfg.resource_name,
            policy.llm(temperature=cfg.temperature, max_tokens=cfg.max_tokens),
            {"algorithm": "grpo", "purpose": "train"},
        )
        val_id = await self.publish_with(
            cfg.resource_name,
            policy.llm(temperature=0.0, max_tokens=cfg.max_tokens),
            {"algorithm": "grpo", "purpose": "val"},
        )
        # ---- the trainer's sampling, applied by the gateway to each call whatever the agent asks
        policy.set_sampling(SamplingPlan.for_training(cfg.temperature, cfg.top_p, cfg.max_tokens, cfg.sampling))
        rollout_config = RolloutConfig(timeout_seconds=cfg.rollout_timeout, missing_reward=cfg.missing_reward)

        # ---- resume from the newest checkpoint, if any
        checkpoint_dir = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        start, history, state = 0, [], {}
        if (found := latest_checkpoint(checkpoint_dir)) is not None:
            state = update.load(found)
            start, history = state["step"], state.get("history", [])
            self.console.print(f"resumed from {found} (step {start})")
        best = BestCheckpoint.restored(state.get("best_checkpoint"))  # kept from pruning; serve it
        pipeline = RolloutPipeline.of(self, cfg, train_data, start, train_id, rollout_config, state.get("queued"))

        async def validate(step: int) -> Evaluation | None:
            if not val_data:
                return None
            rollouts = await self.run_rollouts(
                val_data,
                mode="val",
                resources_id=val_id,
                config=rollout_config,
                metadata=[{"step": step}] * len(val_data),
            )
            result = Evaluation.of(rollouts, cfg.success_threshold)
            await self.log_metrics(
                step,
                {
                    "val/accuracy": result.success_rate,
                    "val/reward_mean": result.reward_mean,
                    "val/no_reward": result.no_reward,
                },
            )
            return result

        initial = await validate(start)
        guard = rollback_guard(cfg, checkpoint_dir, update)
        if guard is not None and initial is not None:
            await after_validation(self, guard, start, initial.success_rate, update)
        if initial is not None:
            self.console.print(
                f"validation before step {start}: accuracy {initial.success_rate:.3f} "
                f"reward {initial.reward_mean:.3f} ({initial.n} tasks)"
            )
        final = initial
        failed_steps = identical_steps = 0
        stop = False
        progress = Progress(
            TextColumn("GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            transient=False,
        )
        with progress:
            bar = progress.add_task("", total=cfg.steps, completed=start)
            for step in range(start + 1, cfg.steps + 1):
                began = time.perf_counter()
                # ---- collect: group_size rollouts of each sampled task (async: queued ahead, running meanwhile)
                collected = await pipeline.collect(step, engine.version)
                rollouts = collected.rollouts
                rollout_seconds = time.perf_counter() - began
                failed_steps = failed_steps + 1 if all(r.status is not RolloutStatus.SUCCEEDED for r in rollouts) else 0
                if cfg.max_failed_steps and failed_steps >= cfg.max_failed_steps:
                    failures = self.last_failures.describe("train", self.store) if self.last_failures else ""
                    raise RuntimeError(
                        f"GRPO stopped at step {step}: every rollout failed in {failed_steps} step(s) in a "
                        f"row (max_failed_steps={cfg.max_failed_steps})\n{failures}"
                    )

                # ---- adapt: spans → trajectories; advantages within each task's group (async: the fresh groups)
                batch = await self._batch(*collected.trained)
                if batch.rewarded and not batch.model_calls:
                    raise no_model_calls_error("GRPO", batch.rewarded)
                identical_steps = identical_steps + 1 if batch.groups_compared == batch.groups_identical > 0 else 0
                if identical_steps == IDENTICAL_STEPS:
                    self.console.print(
                        f"for {IDENTICAL_STEPS} steps in a row every group's rollouts sampled the same tokens, so GRPO "
                        "has nothing to compare: the calls run greedily (an agent pinning temperature=0 under "
                        "sampling='agent', or a backend ignoring the temperature)",
                        highlight=False,
                        markup=False,
                    )
                generated = sum(t.response_length for t in batch.sampled)  # every rollout's, kept or not

                # ---- optimize: clipped policy gradient over the response tokens
                update_began = time.perf_counter()
                work: Any = batch.scored
                if isinstance(update, RoleUpdate):  # each role's adapter on its own batch
                    work = {role: b.scored for role, b in batch.roles.items()}
                stats = await asyncio.to_thread(update.step, work) if batch.scored else {}
                update_seconds = time.perf_counter() - update_began
                await pipeline.published(step)  # async: the runners go on through validation and checkpointing
                sync_seconds = stats.pop("sync_seconds", 0.0)  # of update_seconds: new weights into the engine

                # ---- log
                rewards = batch.rewards
                finished = [r for r in rollouts if r.status is RolloutStatus.SUCCEEDED]
                metrics = {
                    "train/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
                    "train/reward_std": statistics.pstdev(rewards) if rewards else 0.0,
                    "train/accuracy": sum(r >= cfg.success_threshold for r in rewards) / max(len(rewards), 1),
                    "train/groups_used": batch.groups_kept,
                    "train/failed_rollouts": len(rollouts) - len(finished),
                    "train/no_reward": count_no_reward(rollouts),
                    "train/response_length": generated / max(len(batch.sampled), 1),
                    **{f"train/{k}": v for k, v in stats.items()},
                    "perf/rollout_seconds": rollout_seconds,
                    "perf/update_seconds": update_seconds,
                    "perf/sync_seconds": sync_seconds,
                    "perf/step_seconds": time.perf_counter() - began,
                    "perf/tokens_per_s": generated / max(rollout_seconds, 1e-9),
                    "train/model_version": engine.version,
                    **collected.metrics(),  # async: staleness distribution, dropped groups
                    **role_metrics(batch.roles, cfg.success_threshold),  # train/<role>/...: roles only
                }
                await self.log_metrics(step, metrics)
                history.append({"step": step, **metrics})
                description = (
                    f"reward {metrics['train/reward_mean']:.2f} acc {metrics['train/accuracy']:.2f} "
                    f"loss {stats.get('loss', 0.0):+.3f} groups {batch.groups_kept}/{cfg.prompts_per_step} "
                    f"{metrics['perf/step_seconds']:.1f}s"
                )

                # ---- validate and checkpoint
                score = None  # this step's validation accuracy, the score of a checkpoint saved at it
                if (cfg.val_every and step % cfg.val_every == 0) or step == cfg.steps:
                    final = await validate(step)
                    if final is not None:
                        description += f" | val acc {final.success_rate:.3f}"
                        score = final.success_rate
                    if guard is not None and final is not None:
                        stop = await after_validation(self, guard, step, final.success_rate, update)
                progress.update(bar, advance=1, description=description)
                progress.console.print(f"step {step}/{cfg.steps}: {description}", highlight=False)
                if checkpoint_dir and (
                    (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == cfg.steps
                ):
                    saved = checkpoint_dir / f"step-{step}"
                    improved = best.consider(saved, step, score)
                    update.save(
                        saved,
                        {
                            "step": step,
                            "history": history,
                            "config": asdict(cfg),
                            "queued": pipeline.state(),
                            "best_checkpoint": best.state(),
                        },
                    )
                    prune_checkpoints(checkpoint_dir, cfg.keep_checkpoints, spare=best.path)
                    if improved:
                        await self.note_best_checkpoint(best)
                if stop:
                    break
        if guard is not None and guard.best_path is not None and guard.best_step is not None:
            best.consider(guard.best_path, guard.best_step, guard.best)  # rollback's copy of the best weights
        last = latest_checkpoint(checkpoint_dir)
        return GRPOResult(
            steps=cfg.steps,
            initial=initial,
            final=final,
            checkpoint=str(last) if last else None,
            history=history,
            best_checkpoint=best if best.path else None,
            checkpoints=[str(p) for p in complete_checkpoints(checkpoint_dir)],
        )

    async def _batch(self, rollouts: list[Rollout], groups: list[int]) -> StepBatch:
        """The step's trajectories with their advantages; groups whose rewards are all equal are dropped."""
        cfg = self.config
        scored: list[tuple[Rollout, int, list[Trajectory]]] = []
        calls: list[int] = []
        succeeded = [(r, g) for r, g in zip(rollouts, groups) if r.status is RolloutStatus.SUCCEEDED]
        spans_of = [await self.store.query_spans(r.rollout_id) for r, _ in succeeded]  # failed: no reward to learn
        if self.group_reward is not None:
            succeeded = await self._judged(succeeded, spans_of)
        for (rollout, group), spans in zip(succeeded, spans_of):
            calls.append(sum(is_llm_call(s) for s in spans))
            # tokens a grammar forced are no choice of the policy's: out of the loss (docs/constrained-decoding.md)
            trajectories = to_trajectories(
                spans, reward=rollout.reward or 0.0, agent_match=cfg.agent_match, skip_forced=True
            )
            scored.append((rollout, group, trajectories))
        flagged = await flag_no_model_calls(self.store, [r for r, _, _ in scored], calls)
        if flagged and sum(calls):
            self.console.print(
                f"{flagged} of {len(scored)} rewarded rollouts made no model call through the gateway "
                f"(marked in their metadata): some agent calls bypass it",
                highlight=False,
                markup=False,
            )
        samples: dict[int, set[tuple[tuple[int, ...], ...]]] = {}
        sizes: dict[int, int] = {}
        for _, group, trajectories in scored:
            samples.setdefault(group, set()).add(tuple(tuple(t.token_ids) for t in trajectories))
            sizes[group] = sizes.get(group, 0) + 1
        compared = [g for g, size in sizes.items() if size > 1]
        rewards = [r.reward or 0.0 for r, _, _ in scored]
        advantages = group_advantages(rewards, [g for _, g, _ in scored], cfg.normalize_std)
        useful = useful_groups(rewards, [g for _, g, _ in scored], cfg.skip_uniform_groups)
        roles: dict[str, RoleBatch] = {}
        pairs: list[tuple[Trajectory, Advantage]]
        if cfg.roles:  # one batch per role, with the role's own rewards and advantages (algorithms/roles.py)
            with_spans = [(r, g, spans) for (r, g, _), spans in zip(scored, spans_of)]
            roles = role_batches(with_spans, cfg.roles, cfg, group_advantages)
            pairs = [pair for role_batch in roles.values() for pair in role_batch.scored]
        elif cfg.credit == "per_turn":  # each call its own return-to-go's advantage (algorithms/credit.py)
            members = [(spans, r.reward or 0.0, t, g) for (r, g, t), spans in zip(scored, spans_of)]
            pairs = [
                p
                for g in useful
                for p in per_turn_pairs([m[:3] for m in members if m[3] == g], cfg.gamma, cfg.agent_match)
            ]
        else:
            pairs = [
                (trajectory, advantage)
                for advantage, (_, group, trajectories) in zip(advantages, scored)
                if group in useful
                for trajectory in trajectories
            ]
        return StepBatch(
            pairs,
            rewards,
            len(useful),
            [t for _, _, trajectories in scored for t in trajectories],
            rewarded=len(scored),
            model_calls=sum(calls),
            groups_compared=len(compared),
            groups_identical=sum(len(samples[g]) == 1 for g in compared),
            roles=roles,
        )

    async def _judged(
        self, succeeded: list[tuple[Rollout, int]], spans_of: list[list[Any]]
    ) -> list[tuple[Rollout, int]]:
        """The rollouts with the rewards `group_reward` gives each group's final answers, side by side."""
        members: dict[int, list[int]] = {}
        for i, (_, group) in enumerate(succeeded):
            members.setdefault(group, []).append(i)
        judged = list(succeeded)
        for indices in members.values():
            answers = [final_answer(spans_of[i], self.config.agent_match) for i in indices]
            rewards = list(await self.group_reward(succeeded[indices[0]][0].input, answers))  # type: ignore[misc]
            if len(rewards) != len(indices):
                raise ValueError(f"group_reward returned {len(rewards)} rewards for a group of {len(indices)}")
            for i, reward in zip(indices, rewards):
                judged[i] = (succeeded[i][0].model_copy(update={"reward": float(reward)}), succeeded[i][1])
        return judged


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    reference = copy.deepcopy(model)
    reference.requires_grad_(False)
    reference.eval()
    return reference


def _reference_logprobs(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    sequences: list[ScoredSequence],
    temperature: float,
    pad: int,
) -> list[torch.Tensor]:
    if reference is not None:
        return sequence_logprobs(reference, sequences, temperature, pad)
    with model.disable_adapter():  # type: ignore[operator]  # LoRA: the base weights are the reference
        return sequence_logprobs(model, sequences, temperature, pad)
