"""The engine's attention: PyTorch's fused kernel on the key/value heads themselves, padding mask or not.

transformers' SDPA path hands grouped-query attention (fewer key/value heads than query heads: SmolLM2 has
9 and 3, Qwen2.5-0.5B 14 and 2) to the kernel natively only without a mask. With one, as in every padded
batch the engine runs, it copies each layer's keys and values once per query head (`repeat_kv`), or, for one
query token, folds the query heads of a group into a query length (`pack_gqa`). On CPU the kernel takes the
mask and the grouped heads together (`enable_gqa=True`): bit-identical to the copy, and 27-30 % less time a
layer than the folded query at 64 rows in fp32 (measured with caches too large to stay in the processor's cache,
as in a step: `docs/benchmarks.md`, issue 22). In bf16 and fp16 the same kernel call is five times slower for one
query token than the folded query (`decode_attention`; a SmolLM2 step's attention at 64 rows of 301 columns: 338
against 69 ms, AVX-512 BF16, `benchmarks/held_once_attention.py --dtype bfloat16`), so a decode step folds
there. Anything else (a GPU, a model without grouped heads, no mask, autograd) goes to transformers' own function,
so training computes exactly what it did.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

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

    ours = (
        getattr(module, "num_key_value_groups", 1) > 1
        and query.device.type == "cpu"
        and not dropout
        and not (torch.is_grad_enabled() and query.requires_grad)
        and all(kwargs.get(name) is None for name in ("softcap", "position_bias", "sinks"))
        and not kwargs.get("output_attentions")
    )
    if ours and query.shape[2] == 1:  # a decode step, masked or not: as the engine's own step computes it
        return decode_attention(query, key, value, attention_mask, scaling).transpose(1, 2).contiguous(), None
    if not ours or attention_mask is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


def decode_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float | None
) -> torch.Tensor:
    """One query token a row (`[rows, heads, 1, dim]`) over grouped key/value heads (`[rows, kv_heads, cols, dim]`)
    under a padding `mask` (`[rows, 1, 1, cols]`): the kernel's own grouped heads in fp32, the query heads of a group
    folded into the query length in bf16 and fp16, where the CPU kernel's grouped path is five times slower.
    The engine's decode step and transformers' forward through `engine_attention` both call this: the same bits."""
    if query.dtype == torch.float32:
        return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)
    rows, heads, _, dim = query.shape
    grouped = query.reshape(rows, keys.shape[1], heads // keys.shape[1], dim)  # head h reads key/value head h // group
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(rows, heads, 1, dim)


def shared_prefix_attention(
    query: torch.Tensor,
    prefix_keys: torch.Tensor,
    prefix_values: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Cascade attention for one query token a row (`[rows, heads, 1, dim]`): over a prefix every row shares, held
    once (`[1, kv_heads, shared, dim]`), then over each row's own keys and values (`[rows, kv_heads, cols, dim]`,
    additive `mask` `[rows, 1, 1, cols]`). The prefix is read once for all rows instead of once a row; the two
    softmaxes are joined by their log-sum-exps, so this is attention over both parts (to rounding, not bit for bit)."""
    rows, heads, _, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    grouped = query.view(rows, kv_heads, group, dim)  # query head h attends with key/value head h // group
    everyone = grouped.transpose(0, 1).reshape(1, kv_heads, rows * group, dim)
    shared_out, shared_lse = flash(everyone, prefix_keys, prefix_values, scale=scale)[:2]
    shared_out = shared_out.view(kv_heads, rows, group, dim).transpose(0, 1)
    shared_lse = shared_lse.view(kv_heads, rows, group).transpose(0, 1)
    own_out, own_lse = flash(grouped, keys, values, attn_mask=mask, scale=scale)[:2]
    lse = torch.logaddexp(shared_lse, own_lse)
    out = (
        own_out.float() * (own_lse - lse).exp_()[..., None] + shared_out.float() * (shared_lse - lse).exp_()[..., None]
    )
    return out.to(query.dtype).contiguous().view(rows, heads, 1, dim)


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
