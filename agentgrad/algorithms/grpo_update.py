"""The GRPO update: the math of one step, and where it runs.

The math: group advantages, the clipped per-token loss, the truncated importance-sampling weights,
and `grpo_update`, which aggregates them as a token mean over the step. Where it runs: `LocalUpdate`
in this process, `ShardedUpdate` over a training group's FSDP2 ranks, `RoleUpdate` (roles.py) one
adapter per role; `open_update` picks. `algorithms/grpo.py` is the loop that feeds it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import torch

from agentgrad.adapters import Trajectory
from agentgrad.algorithms.credit import Advantage
from agentgrad.algorithms.grpo_config import GRPOConfig
from agentgrad.algorithms.roles import RoleUpdate
from agentgrad.distributed.fsdp import ShardedPolicy, clip_grad_norm, idle_trajectory
from agentgrad.distributed.group import TrainingGroup, deliver, open_group
from agentgrad.engine.training import ScoredSequence, StepPrefix, checkpoint_activations, sequence_logprobs
from agentgrad.policy.checkpoints import load_sharded_checkpoint, save_sharded_checkpoint
from agentgrad.policy.local import LocalPolicy

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
            checkpoint_activations(policy.model)

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
