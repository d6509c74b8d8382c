"""Log-probabilities of token sequences under the model, for the training losses (GRPO, SFT).

The sequences of one step usually share a long prefix (system prompt, few-shot examples).
It is run once, as a batch of one, and its keys and values are broadcast to every sequence:
the result and the gradients are the same as running each sequence in full (the prefix's
gradient is the sum over the sequences), at a fraction of the cost. Logits are computed only
where a token is scored, never over the whole vocabulary at every position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentgrad.engine.kv_cache import MIN_SHARED_PREFIX, common_prefix_length


@dataclass
class ScoredSequence:
    """Tokens of one sequence and where scoring starts: `token_ids[first_scored:]` are scored."""

    token_ids: list[int]
    first_scored: int

    def __post_init__(self) -> None:
        if not 1 <= self.first_scored < len(self.token_ids):
            raise ValueError(
                f"first_scored must be in [1, {len(self.token_ids)}) for a sequence of {len(self.token_ids)} tokens, "
                f"got {self.first_scored}"
            )


def sequence_logprobs(
    model: torch.nn.Module, sequences: Sequence[ScoredSequence], temperature: float = 1.0, pad_token_id: int = 0
) -> list[torch.Tensor]:
    """Per sequence, the logprob of each scored token given the ones before it (differentiable).

    `temperature` divides the logits first, to match the distribution the tokens were sampled from.
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    shared = min(common_prefix_length([s.token_ids for s in sequences]), min(s.first_scored for s in sequences) - 1)
    cache = DynamicCache()
    if shared >= MIN_SHARED_PREFIX and not _sharded(model):
        model(input_ids=torch.tensor([sequences[0].token_ids[:shared]], device=device), cache=cache, use_cache=True,
              logits_to_keep=1)
        expanded = DynamicCache()
        for index, layer in enumerate(cache.layers):
            expanded.update(layer.keys.expand(len(sequences), -1, -1, -1), layer.values.expand(len(sequences), -1, -1, -1), index)
        cache = expanded
    else:
        shared = 0
    suffixes = [s.token_ids[shared:] for s in sequences]
    width = max(len(s) for s in suffixes)
    ids = torch.tensor([[pad_token_id] * (width - len(s)) + s for s in suffixes], device=device)
    suffix_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in suffixes], device=device)
    mask = torch.cat([suffix_mask.new_ones(len(sequences), shared), suffix_mask], dim=1)
    positions = shared + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
    # every sequence ends at the last column: keep the logits of the last `kept` positions only
    scored = [len(s.token_ids) - s.first_scored for s in sequences]
    kept = max(scored) + 1
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                   logits_to_keep=kept).logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    # targets right-aligned like the logits; one gather for the batch (per-row indexing of the
    # logits would make backward fill a batch-sized gradient once per row)
    targets = torch.tensor([[0] * (kept - 1 - n) + s.token_ids[s.first_scored :] for s, n in zip(sequences, scored)],
                           device=device)
    token_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, :, None]).squeeze(-1)
    return [token_logprobs[row, kept - 1 - n :] for row, n in enumerate(scored)]


def _sharded(model: torch.nn.Module) -> bool:
    """Under FSDP2 the prefix is not run apart: its gradient would reach each layer's weights through the
    cache, outside the hooks that gather them for backward and reduce their gradients once."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)
