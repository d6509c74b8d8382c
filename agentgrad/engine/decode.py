"""A decode step written out for Llama-family models (Llama, Qwen2): transformers' operators, bit for bit.

transformers' forward is general: per layer it dispatches through modules, hooks, the attention interface, the
cache's bookkeeping and the rotary helper, and it multiplies the query, key and value projections (and the MLP's
gate and up projections) as separate products. `LeanDecoder` runs the same arithmetic in one function per step:
the query, key and value weights fused into one packed product and gate and up into another (each output column
is the same dot product, so the results are identical), rotary embeddings, RMSNorm, attention and the residuals
written as transformers writes them. A SmolLM2 decode step went from 28.8 to 23.5 ms at 1 row, 37.9 to 33.1 at 8
and 112.5 to 107.0 at 64 (`benchmarks/engine_profile.py --warm 64`, 2 threads). The logits are bit-identical to
transformers' forward on the same cache (`tests/engine/test_decode.py`). It serves only what it covers exactly:
the bf16 sampling copy on CPU, its weights packed where oneDNN packs bf16 (`prepack.py`; plain on AVX2 alone),
without LoRA adapters; anything else decodes through transformers' forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agentgrad.engine.prepack import pack_weight, packed_linear, packing_available

ARCHITECTURES = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM"})
"""Model classes whose decoder layer is exactly what `LeanDecoder.__call__` computes."""


def _fused(linears: list[torch.nn.Linear], packed: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) computing these layers' outputs side by side, packed like the layers are."""
    weight = torch.cat([linear.weight for linear in linears])
    bias = None
    if any(linear.bias is not None for linear in linears):
        zeros = [linear.weight.new_zeros(linear.out_features) for linear in linears]
        bias = torch.cat([zero if linear.bias is None else linear.bias for linear, zero in zip(linears, zeros)])
    return (pack_weight(weight) if packed else weight), bias


def _rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """transformers' Llama/Qwen2 RMSNorm: normalized in fp32, rounded to the input's dtype, then scaled."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


@dataclass
class _Layer:
    attention: Any
    mlp: Any
    input_norm: torch.nn.Module
    post_attention_norm: torch.nn.Module
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None


class LeanDecoder:
    """The next token's logits for every row of a batch, one token a row, over the engine's KV cache."""

    def __init__(self, model: Any) -> None:
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.intermediate = config.intermediate_size
        packed = packing_available()
        self.linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor] = (
            packed_linear if packed else F.linear
        )
        with torch.no_grad():
            self.layers = [
                _Layer(
                    layer.self_attn,
                    layer.mlp,
                    layer.input_layernorm,
                    layer.post_attention_layernorm,
                    *_fused([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], packed),
                    *_fused([layer.mlp.gate_proj, layer.mlp.up_proj], packed),
                )
                for layer in model.model.layers
            ]

    @classmethod
    def build(cls, model: Any) -> LeanDecoder | None:
        """A decoder over `model`'s current weights (build again after they change), or None where it would not
        compute exactly what transformers does: another architecture or configuration, weights not bf16 on CPU, or
        not packed where this machine packs them."""
        if type(model).__name__ not in ARCHITECTURES:
            return None
        config = model.config
        packed = packing_available()
        if (
            config.hidden_act != "silu"
            or getattr(config, "pretraining_tp", 1) not in (None, 1)
            or getattr(config, "use_sliding_window", False)
            or any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or [])
        ):
            return None
        for layer in model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            linears = [attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj]
            linears += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
            if any(
                type(linear) is not torch.nn.Linear
                or hasattr(linear, "packed_weight") != packed
                or linear.weight.dtype != torch.bfloat16
                or linear.weight.device.type != "cpu"
                for linear in linears
            ):
                return None
        return cls(model)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: Any) -> torch.Tensor:
        """Logits `[rows, vocab]` for `tokens` `[rows]` at `positions` `[rows]`; `mask` `[rows, cached + 1]` is 1 where
        a token is real (the new one included); the keys and values of `tokens` are appended to `cache`."""
        rows, heads, kv_heads, dim = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        base = self.model.model
        x = base.embed_tokens(tokens)
        cos, sin = base.rotary_emb(x[:, None], positions[:, None])  # [rows, 1, dim]
        half = dim // 2
        # rotate_half(q) * sin, where rotate_half(q) = [-q2, q1], is roll(q) * [-sin1, sin2]: the same products
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        attend = mask[:, None, None, :].bool()
        for index, layer in enumerate(self.layers):
            attention = layer.attention
            h = _rms_norm(x, layer.input_norm)
            qkv = self.linear(h, layer.qkv, layer.qkv_bias)
            qk = qkv[:, : (heads + kv_heads) * dim].view(rows, heads + kv_heads, dim)
            qk = qk * cos + torch.roll(qk, half, -1) * sin
            values = qkv[:, (heads + kv_heads) * dim :].view(rows, kv_heads, 1, dim)
            keys, values = cache.layers[index].update(qk[:, heads:, None], values)
            out = F.scaled_dot_product_attention(
                qk[:, :heads, None], keys, values, attn_mask=attend, scale=attention.scaling, enable_gqa=True
            )
            x = x + attention.o_proj(out.view(rows, heads * dim))
            h = _rms_norm(x, layer.post_attention_norm)
            gate_up = self.linear(h, layer.gate_up, layer.gate_up_bias)
            x = x + layer.mlp.down_proj(F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :])
        return self.model.lm_head(_rms_norm(x, base.norm))
