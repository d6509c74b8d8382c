"""The negative log-likelihood step on trajectories: what SFT trains each step (`sft.py`), and what a warm start
trains on demonstrations before the first step (`demonstrations.py`), written once."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentgrad.adapters import Trajectory
from agentgrad.distributed.fsdp import clip_grad_norm, idle_trajectory
from agentgrad.engine.training import ScoredSequence, sequence_logprobs


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
