"""The GRPO update's math: the clipped per-token loss, the truncated importance-sampling weights, and
`grpo_update`, which aggregates them as a token mean over the step (`sharded_grpo_step`: one rank's share).
Where it runs (this process, FSDP2 ranks, one adapter per role) is `algorithms/updates.py`; the advantages
are `algorithms/credit.py`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from agentgrad.adapters import Trajectory
from agentgrad.algorithms.credit import Advantage
from agentgrad.algorithms.grpo_config import GRPOConfig
from agentgrad.distributed.fsdp import ShardedPolicy, clip_grad_norm, idle_trajectory
from agentgrad.engine.training import ScoredSequence, StepPrefix, sequence_logprobs

# ----------------------------------------------------------------------------- the math


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


# ----------------------------------------------------------------------------- one rank's share


def sharded_grpo_step(
    sharded: ShardedPolicy, batch: Sequence[tuple[Trajectory, Advantage]], pad_token_id: int, cfg: GRPOConfig
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
