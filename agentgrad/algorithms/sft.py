"""SFT by rejection sampling: keep the rollouts that earned a reward, fine-tune on what the model wrote.

Each step the training loop (loop.py) runs `group_size` rollouts of each of `prompts_per_step` sampled tasks
through runners -> gateway -> engine; this file keeps the attempts whose reward reaches `reward_threshold`
(each distinct token sequence once) and minimizes the negative log-likelihood of their model-written tokens
(the exact ids the engine sampled; tool results and prompts are masked out), `epochs` passes in batches of
`batch_size`. The engine serves the new weights from the next request on. Resume, rollback, asynchronous
rollouts, sharding and the checkpoints are the loop's and the update's, as for GRPO.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from agentgrad.adapters import Trajectory, to_trajectories
from agentgrad.algorithms.async_rollouts import StepRollouts
from agentgrad.algorithms.base import Result
from agentgrad.algorithms.config import LoopConfig
from agentgrad.algorithms.loop import Batch, TrainsWeights
from agentgrad.algorithms.updates import ShardedTrain, Train
from agentgrad.distributed.fsdp import ShardedPolicy, clip_grad_norm, idle_trajectory
from agentgrad.engine.training import ScoredSequence, sequence_logprobs
from agentgrad.types import RolloutStatus, Span

SFTResult = Result
"""What `SFT.run` (and `Trainer.fit`) returns: the shape every algorithm's run returns."""


@dataclass
class SFTConfig(LoopConfig):
    """Every hyper-parameter of an SFT run; `SFT(config, name=value)` overrides copy it, never change it.

    The loop's settings (LoopConfig) with SFT's defaults: few steps of many tasks, each validated.
    """

    steps: int = 3  # collect -> keep the rewarded -> fine-tune -> validate
    prompts_per_step: int = 64  # training tasks sampled per step
    group_size: int = 4  # rollouts of each task per step, at `temperature`
    val_every: int = 1
    # ---- what is kept
    reward_threshold: float = 1.0  # rollouts with at least this reward are kept
    # ---- the optimizer: NLL of the kept model-written tokens, token mean over each batch
    epochs: int = 2  # passes over each step's kept data
    batch_size: int = 16  # sequences per optimizer step
    weight_decay: float = 0.01  # AdamW's default, as SFT has always trained

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


class SFT(TrainsWeights):
    """`SFT(SFTConfig(...), local_engine=..., name=value, ...)`; without an engine, loads `model` (default SmolLM2).
    Overrides and engines as every algorithm that trains weights takes them (`TrainsWeights`)."""

    config: SFTConfig
    config_type = SFTConfig

    def batches(self) -> KeptBatches:
        return KeptBatches(self.config)

    def losses(self) -> tuple[Train, ShardedTrain]:
        return partial(fine_tune, cfg=self.config), partial(sharded_fine_tune, cfg=self.config)


@dataclass(frozen=True)
class Kept:
    """One step's SFT data: the kept trajectories, and the seed their batches are shuffled with."""

    trajectories: list[Trajectory]
    shuffle_seed: str

    def batches(self, epochs: int, batch_size: int) -> list[list[Trajectory]]:
        """`epochs` passes over the trajectories in a fresh order each, in batches of `batch_size`."""
        shuffle, order, batches = random.Random(self.shuffle_seed), list(range(len(self.trajectories))), []
        for _ in range(epochs):
            shuffle.shuffle(order)
            batches += [
                [self.trajectories[i] for i in order[k : k + batch_size]] for k in range(0, len(order), batch_size)
            ]
        return batches


@dataclass
class KeptBatches:
    """SFT's batch builder: the rewarded rollouts' trajectories, each distinct token sequence once."""

    cfg: SFTConfig

    async def build(self, step: StepRollouts, spans: Mapping[str, list[Span]]) -> Batch:
        cfg = self.cfg
        succeeded = [r for r in step.trained[0] if r.status is RolloutStatus.SUCCEEDED]
        kept: dict[tuple[int, ...], Trajectory] = {}
        generated = sequences = 0
        for rollout in succeeded:
            trajectories = to_trajectories(
                spans[rollout.rollout_id], reward=rollout.reward, agent_match=cfg.agent_match
            )
            generated += sum(t.response_length for t in trajectories)
            sequences += len(trajectories)
            if (rollout.reward or 0.0) >= cfg.reward_threshold:
                for trajectory in trajectories:
                    kept.setdefault(tuple(trajectory.token_ids), trajectory)
        data = Kept(list(kept.values()), f"{cfg.seed}/{step.step}")  # a resumed run shuffles step N as the first did
        return Batch(
            data=data,
            size=len(data.trajectories),
            rewards=[r.reward or 0.0 for r in succeeded],
            generated_tokens=generated,
            sequences=sequences,
            metrics={"train/kept": len(data.trajectories)},
            summary=f"kept {len(data.trajectories)}/{len(step.rollouts)}",
        )


def fine_tune(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Kept,
    *,
    pad_token_id: int,
    reference: torch.nn.Module | None,
    cfg: SFTConfig,
) -> dict[str, float]:
    """`epochs` passes of `sft_update` over the kept trajectories; the mean loss."""
    losses = [
        sft_update(model, optimizer, batch, cfg.max_grad_norm, pad_token_id)
        for batch in data.batches(cfg.epochs, cfg.batch_size)
    ]
    return {"loss": statistics.fmean(losses) if losses else float("nan")}


def sharded_fine_tune(sharded: ShardedPolicy, data: Kept, pad_token_id: int, cfg: SFTConfig) -> dict[str, float]:
    """`fine_tune` on one rank of a training group: each batch split by tokens, the loss over the batch's global
    token count (so the ranks' sum is the one-process step); every rank runs every batch (collectives)."""
    losses = []
    for batch in data.batches(cfg.epochs, cfg.batch_size):
        share, _ = sharded.share([len(t.token_ids) for t in batch])
        total = sum(sum(t.loss_mask[t.prompt_length :]) for t in batch)
        part = sft_update(
            sharded.model,
            sharded.optimizer,
            [batch[i] for i in share],
            cfg.max_grad_norm,
            pad_token_id,
            total_tokens=total,
        )
        summed = torch.tensor([part], dtype=torch.float64)
        torch.distributed.all_reduce(summed)
        losses.append(float(summed))
    return {"loss": statistics.fmean(losses) if losses else float("nan")}


def sft_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Sequence[Trajectory],
    max_grad_norm: float,
    pad_token_id: int = 0,
    *,
    total_tokens: int | None = None,
) -> float:
    """One AdamW step on the NLL of the model-written tokens of `batch`, the mean over those tokens.

    One rank of a sharded update passes its share as `batch` and the whole batch's `total_tokens`
    (an empty share runs an idle sequence with zero weight, to join the collectives).
    """

    items = list(batch) or [idle_trajectory(pad_token_id)]
    logprobs = sequence_logprobs(
        model, [ScoredSequence(t.token_ids, t.prompt_length) for t in items], 1.0, pad_token_id
    )
    masks = [
        torch.tensor(t.loss_mask[t.prompt_length :], dtype=torch.float32, device=lp.device)
        for t, lp in zip(items, logprobs)
    ]
    tokens = total_tokens or sum(float(m.sum()) for m in masks)
    loss = -sum((lp * m).sum() for lp, m in zip(logprobs, masks)) / tokens
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[union-attr]
    clip_grad_norm([p for p in model.parameters() if p.requires_grad], max_grad_norm)
    optimizer.step()
    return float(loss.detach())  # type: ignore[union-attr]
