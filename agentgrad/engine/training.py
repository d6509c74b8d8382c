"""Log-probabilities of token sequences under the model, for the training losses (GRPO, SFT).

The sequences of one step usually share a long prefix (system prompt, few-shot examples).
It is run once, as a batch of one, and its keys and values are broadcast to every sequence:
the result and the gradients are the same as running each sequence in full (the prefix's
gradient is the sum over the sequences), at a fraction of the cost. `StepPrefix` runs it once
for all the micro-batches of an update rather than once per micro-batch. Not under FSDP2, nor with
gradient checkpointing (see `_apart`): there each sequence runs in full. Logits are computed
only where a token is scored, never over the whole vocabulary at every position, and past `LOGIT_CHUNK` scored
positions a chunk at a time, recomputed in backward.

On a GPU, fp32 weights are trained under bf16 autocast (`training_precision`): the products in bf16, the weights,
their gradients and AdamW's state in fp32, the log-softmax over the logits in fp32. That is full-weight training's
default there (`docs/gpu.md`); LoRA adapters train in fp32 over a base held once in bf16 (`Engine.freeze_base`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from agentgrad.engine.kv_cache import MIN_SHARED_PREFIX, common_prefix_length

LOGIT_CHUNK = 256
"""Scored positions whose logits are alive at once in training. Over Qwen's 151,936 tokens, two multi-turn episodes
of ~1,500 scored positions (tool answers included) held ~1.8 GB of fp32 logits, their log-softmax and gradients
as much again; a chunk of 256 holds ~0.3 GB."""


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


class StepPrefix:
    """The prefix all of an update's sequences share, run once with gradients for all its micro-batches.

    Each micro-batch reads the prefix's keys and values as leaf tensors (`sequence_logprobs(...,
    prefix=)`), so its backward stops there and leaves them their gradient; `backward()` then sends
    the sum through the prefix in one pass, after the micro-batches' and before the optimizer step.
    The gradients are those of running the prefix in every micro-batch; its activations (one
    sequence's) are held until then. Not under FSDP2 (see `_sharded`).
    """

    def __init__(self, model: torch.nn.Module, sequences: Sequence[ScoredSequence]) -> None:
        from transformers import DynamicCache

        self.token_ids: list[int] = []
        self._outputs: list[torch.Tensor] = []
        self.leaves: list[torch.Tensor] = []  # keys and values, layer by layer
        if not sequences or _apart(model) or (length := shared_length(sequences)) < MIN_SHARED_PREFIX:
            return
        self.token_ids = sequences[0].token_ids[:length]
        cache = DynamicCache()
        with training_precision(model):
            model(
                input_ids=torch.tensor([self.token_ids], device=next(model.parameters()).device),
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        self._outputs = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        self.leaves = [t.detach().requires_grad_(t.requires_grad) for t in self._outputs]

    def starts(self, sequences: Sequence[ScoredSequence]) -> bool:
        """Whether every one of these sequences begins with the prefix, before its first scored token."""
        n = len(self.token_ids)
        return n > 0 and all(s.first_scored > n and s.token_ids[:n] == self.token_ids for s in sequences)

    def backward(self) -> None:
        """Send the gradient the micro-batches left on the keys and values through the prefix; frees it."""
        pairs = [(out, leaf.grad) for out, leaf in zip(self._outputs, self.leaves) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        self._outputs, self.leaves, self.token_ids = [], [], []


def shared_length(sequences: Sequence[ScoredSequence]) -> int:
    """How many leading tokens all the sequences share before the first scored one of any."""
    return min(common_prefix_length([s.token_ids for s in sequences]), min(s.first_scored for s in sequences) - 1)


def sequence_logprobs(
    model: torch.nn.Module,
    sequences: Sequence[ScoredSequence],
    temperature: float = 1.0,
    pad_token_id: int = 0,
    prefix: StepPrefix | None = None,
) -> list[torch.Tensor]:
    """Per sequence, the logprob of each scored token given the ones before it (differentiable).

    `temperature` divides the logits first, to match the distribution the tokens were sampled from.
    With a `prefix` these sequences start with, its keys and values are used instead of running one.
    """
    from transformers import DynamicCache

    device = next(model.parameters()).device
    cache = DynamicCache()
    if prefix is not None and prefix.starts(sequences):
        shared = len(prefix.token_ids)
        layers = [prefix.leaves[i : i + 2] for i in range(0, len(prefix.leaves), 2)]
    elif (shared := shared_length(sequences)) >= MIN_SHARED_PREFIX and not _apart(model):
        own = DynamicCache()
        with training_precision(model):
            model(
                input_ids=torch.tensor([sequences[0].token_ids[:shared]], device=device),
                cache=own,
                use_cache=True,
                logits_to_keep=1,
            )
        layers = [[layer.keys, layer.values] for layer in own.layers]
    else:
        shared, layers = 0, []
    for index, (keys, values) in enumerate(layers):
        cache.update(keys.expand(len(sequences), -1, -1, -1), values.expand(len(sequences), -1, -1, -1), index)
    suffixes = [s.token_ids[shared:] for s in sequences]
    width = max(len(s) for s in suffixes)
    ids = torch.tensor([[pad_token_id] * (width - len(s)) + s for s in suffixes], device=device)
    suffix_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in suffixes], device=device)
    mask = torch.cat([suffix_mask.new_ones(len(sequences), shared), suffix_mask], dim=1)
    positions = shared + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
    # every sequence ends at the last column: keep the logits of the last `kept` positions only
    scored = [len(s.token_ids) - s.first_scored for s in sequences]
    kept = max(scored) + 1
    reuse = {"cache": cache, "use_cache": True} if layers else {"use_cache": False}  # nothing to reuse, none to keep
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **reuse}
    # targets right-aligned like the logits; one gather for the batch (per-row indexing of the
    # logits would make backward fill a batch-sized gradient once per row)
    targets = torch.tensor(
        [[0] * (kept - 1 - n) + s.token_ids[s.first_scored :] for s, n in zip(sequences, scored)], device=device
    )
    with training_precision(model):
        if kept - 1 > LOGIT_CHUNK and _head_apart(model):
            causal_lm: Any = model  # a transformers model (or peft's around one), which mypy reads untyped
            hidden = causal_lm.get_decoder()(**inputs).last_hidden_state[:, -kept:-1]
            token_logprobs = _chunked_logprobs(causal_lm.get_output_embeddings(), hidden, targets, temperature)
        else:
            logits = model(**inputs, logits_to_keep=kept).logits
            token_logprobs = _logprobs(logits[:, :-1], targets, temperature)
    return [token_logprobs[row, kept - 1 - n :] for row, n in enumerate(scored)]


def frozen_context_logprobs(
    model: torch.nn.Module, sequences: Sequence[ScoredSequence], temperature: float = 1.0, pad_token_id: int = 0
) -> list[torch.Tensor]:
    """`sequence_logprobs` of each sequence alone, its context (the tokens before the first scored one) run under
    no_grad into a KV cache: the gradient reaches the weights through the scored tokens only, not through the
    context's keys and values. On a short answer after a long prompt (a demonstration's fix after a schema) that
    costs about the context's forward alone, without its backward or activations; gradient checkpointing is off
    meanwhile (its layers drop a cache in training), having only the scored part's activations to save."""
    layers: list[Any] = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)]
    for layer in layers:
        layer.gradient_checkpointing = False
    try:
        logprobs = []
        for sequence in sequences:
            with torch.no_grad():
                context = StepPrefix(model, [sequence])  # its keys and values, leaves without gradient
            logprobs += sequence_logprobs(model, [sequence], temperature, pad_token_id, prefix=context)
        return logprobs
    finally:
        for layer in layers:
            layer.gradient_checkpointing = True


def _logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """The log-probability of each target under the logits at its position, softmax in fp32."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, :, None]).squeeze(-1)


def _chunked_logprobs(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """`_logprobs` of `head(hidden)`, `LOGIT_CHUNK` positions at a time, each chunk's logits recomputed in backward
    rather than kept: the same values and gradients, with one chunk's logits alive at a time."""

    def chunk(start: int) -> torch.Tensor:
        h, t = hidden[:, start : start + LOGIT_CHUNK], targets[:, start : start + LOGIT_CHUNK]
        if not (torch.is_grad_enabled() and h.requires_grad):
            return _logprobs(head(h), t, temperature)
        return checkpoint(lambda h, t: _logprobs(head(h), t, temperature), h, t, use_reentrant=False)

    return torch.cat([chunk(start) for start in range(0, hidden.shape[1], LOGIT_CHUNK)], dim=1)


def _head_apart(model: torch.nn.Module) -> bool:
    """Whether the logits can be computed from the decoder's hidden states apart from the model's forward: a causal
    LM whose logits are its output layer's, and not under FSDP2 (whose root hooks gather the head's weights)."""
    config = getattr(model, "config", None)
    return (
        hasattr(model, "get_decoder")
        and hasattr(model, "get_output_embeddings")
        and getattr(config, "final_logit_softcapping", None) is None
        and not _sharded(model)
    )


def training_precision(model: torch.nn.Module) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast where fp32 weights train on a GPU that has bf16 (products in bf16, everything kept in fp32);
    elsewhere, nothing: a CPU trains in fp32 as it always did."""
    weight = next(model.parameters())
    if weight.device.type == "cuda" and weight.dtype == torch.float32 and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Recompute each layer's activations in backward instead of keeping them: less memory for ~1/3 more
    compute, in training mode only (sampling is unchanged)."""
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]


def _apart(model: torch.nn.Module) -> bool:
    """Whether the shared prefix must not be run apart: under FSDP2 (`_sharded`), or with gradient checkpointing,
    whose layers drop the cache in training (transformers: a layer that writes the cache would write it twice)."""
    return _sharded(model) or any(getattr(module, "gradient_checkpointing", False) for module in model.modules())


def _sharded(model: torch.nn.Module) -> bool:
    """Under FSDP2 the prefix is not run apart: its gradient would reach each layer's weights through the
    cache, outside the hooks that gather them for backward and reduce their gradients once."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)
