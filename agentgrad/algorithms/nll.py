"""The negative log-likelihood step on trajectories: what SFT trains each step (`sft.py`), and what a warm start
trains on demonstrations before the first step (`demonstrations.py`), written once."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentgrad.adapters import Trajectory
from agentgrad.distributed.fsdp import clip_grad_norm, idle_trajectory
from agentgrad.engine.training import ScoredSequence, frozen_context_logprobs, sequence_logprobs


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
    frozen_context: bool = False,
) -> float:
    """One AdamW step on the NLL of the model-written tokens of `batch`, the mean over those tokens.

    One rank of a sharded update passes its share as `batch` and the whole batch's `total_tokens`
    (an empty share runs an idle sequence with zero weight, to join the collectives). `frozen_context`: each
    trajectory's context runs under no_grad, one trajectory at a time (`frozen_context_logprobs`).
    """

    items = list(batch) or [idle_trajectory(pad_token_id)]
    tokens = total_tokens or sum(sum(t.loss_mask[t.prompt_length :]) for t in items)
    optimizer.zero_grad(set_to_none=True)
    loss = 0.0
    for group in [[t] for t in items] if frozen_context else [items]:
        scored = [ScoredSequence(t.token_ids, t.prompt_length) for t in group]
        if frozen_context:
            logprobs = frozen_context_logprobs(model, scored, 1.0, pad_token_id)
        else:
            logprobs = sequence_logprobs(model, scored, 1.0, pad_token_id)
        nll = (
            -sum(
                (lp * torch.tensor(t.loss_mask[t.prompt_length :], dtype=torch.float32, device=lp.device)).sum()
                for t, lp in zip(group, logprobs)
            )
            / tokens
        )
        nll.backward()  # type: ignore[union-attr]
        loss += float(nll.detach())  # type: ignore[union-attr]
    clip_grad_norm([p for p in model.parameters() if p.requires_grad], max_grad_norm)
    optimizer.step()
    return loss
