"""SFT by rejection sampling: keep the rollouts that earned a reward, fine-tune on what the model wrote.

Each step the training loop (loop.py) runs `group_size` rollouts of each of `prompts_per_step` sampled tasks
through runners -> gateway -> engine; this file keeps the attempts whose reward reaches `reward_threshold`
(each distinct token sequence once) and minimizes the negative log-likelihood of their model-written tokens
(the exact ids the engine sampled; tool results and prompts are masked out), `epochs` passes in batches of
`batch_size`. The engine serves the new weights from the next request on. Resume, rollback, asynchronous
rollouts, sharding and the checkpoints are the loop's and the update's, as for GRPO.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

import torch

from agentgrad.adapters import Trajectory, to_trajectories
from agentgrad.algorithms.async_rollouts import StepRollouts
from agentgrad.algorithms.base import Result
from agentgrad.algorithms.config import LoopConfig
from agentgrad.algorithms.loop import Batch, TrainsWeights
from agentgrad.algorithms.nll import Kept, sft_update
from agentgrad.algorithms.updates import ShardedTrain, Train
from agentgrad.distributed.fsdp import ShardedPolicy
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


@dataclass
class KeptBatches:
    """SFT's batch builder: the rewarded rollouts' trajectories, each distinct token sequence once."""

    cfg: SFTConfig

    def wants_more(self, step: StepRollouts, batch: Batch) -> bool:
        return False  # each step keeps what its `prompts_per_step` tasks earned

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
