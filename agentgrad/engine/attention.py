"""The engine's attention: PyTorch's fused kernel on the key/value heads themselves, padding mask or not.

transformers' SDPA path hands grouped-query attention (fewer key/value heads than query heads: SmolLM2 has
9 and 3, Qwen2.5-0.5B 14 and 2) to the kernel natively only without a mask. With one, as in every padded
batch the engine runs, it copies each layer's keys and values once per query head (`repeat_kv`), or, for one
query token, folds the query heads of a group into a query length (`pack_gqa`). On CPU the kernel takes the
mask and the grouped heads together (`enable_gqa=True`): bit-identical to the copy, and 27-30 % less time a
layer than the folded query at 64 rows (measured with caches too large to stay in the processor's cache, as
in a step: `docs/benchmarks.md`, issue 22). Anything else (a GPU, a model without grouped heads, no mask,
autograd) goes to transformers' own function, so training computes exactly what it did.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

ENGINE_ATTENTION = "agentgrad_sdpa"
"""The name the engine's attention is registered under (`config._attn_implementation`)."""


def engine_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention in transformers' calling convention (query `[batch, heads, q, dim]`, keys and values `[batch,
    kv_heads, kv, dim]`, output `[batch, q, heads, dim]`); grouped heads under a mask on CPU without a copy."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    grouped = getattr(module, "num_key_value_groups", 1) > 1
    if (
        not grouped
        or attention_mask is None
        or query.device.type != "cpu"
        or dropout
        or (torch.is_grad_enabled() and query.requires_grad)
        or any(kwargs.get(name) is not None for name in ("softcap", "position_bias", "sinks"))
        or kwargs.get("output_attentions")
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


class _RegisteringName(str):
    """The engine attention's name as a model's config holds it. A config is pickled to build a model in another
    process (a training rank: `distributed.group.FromConfig`); unpickled there, the name registers the attention
    first, so building from that config works without the builder having to know the engine's attention."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return register, ()


@functools.cache
def register() -> str:
    """Register the engine's attention (and SDPA's mask for it) with transformers, once; returns its name (one
    that registers it again wherever a config naming it is unpickled: `_RegisteringName`)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ENGINE_ATTENTION, engine_attention)
    AttentionMaskInterface.register(ENGINE_ATTENTION, sdpa_mask)
    return _RegisteringName(ENGINE_ATTENTION)


def use_engine_attention(model: Any) -> None:
    """Make `model` (a transformers model, or a peft model around one) attend with `engine_attention`, where it
    uses SDPA now; a model on another implementation (eager, flash-attention) keeps it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "_attn_implementation", None) == "sdpa":
        base.set_attn_implementation(register())
