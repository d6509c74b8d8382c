"""A decode step written out for Llama-family models (Llama, Qwen2): transformers' operators, bit for bit.

transformers' forward is general: per layer it dispatches through modules, hooks, the attention interface, the
cache's bookkeeping and the rotary helper, and it multiplies the query, key and value projections (and the MLP's
gate and up projections) as separate products. `LeanDecoder` runs the same arithmetic in one function per step:
in bf16 the query, key and value weights fused into one packed product and gate and up into another (each output
column is the same dot product, and oneDNN's bf16 results are identical; its packed fp32 ones are not, so fp32
keeps the separate products), rotary embeddings, RMSNorm, attention and the residuals written as transformers
writes them. A SmolLM2 decode step went from 28.8 to 23.5 ms at 1 row, 37.9 to 33.1 at 8 and 112.5 to 107.0 at
64 (bf16, `benchmarks/engine_profile.py --warm 64`, 2 threads). The logits are bit-identical to transformers'
forward with the engine's attention on the same cache (`tests/engine/test_decode.py`). It serves only what it
covers exactly, without LoRA adapters: the bf16 sampling copy or the fp32 weights' packed twin on CPU, their
layers packed where oneDNN packs their dtype (`prepack.py`; bf16 stays plain on AVX2 alone); anything else
decodes through transformers' forward.

Rows that start with the same prompt tokens (a GRPO step's system prompt) can hold that prefix's keys and values
once (`kv_cache.SharedPrefix`): the step then reads it once for all rows instead of once a row
(`attention.shared_prefix_attention`), which is the same attention to rounding, not bit for bit. A SmolLM2 step's
attention at 64 rows of 261 shared and 76 own columns took 36.8 ms instead of 67.0 (fp32, AVX2;
`benchmarks/held_once_attention.py`, which also shows it slower below ~6 rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agentgrad.engine.attention import shared_prefix_attention
from agentgrad.engine.kv_cache import SharedPrefix
from agentgrad.engine.prepack import PackedLinear, pack_weight, packed_linear, packing_available

ARCHITECTURES = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM"})
"""Model classes whose decoder layer is exactly what `LeanDecoder.__call__` computes."""
LINEARS = (torch.nn.Linear, PackedLinear)
"""The layer types the decoder multiplies as transformers would (not peft's, not quantized ones)."""


Product = tuple[torch.Tensor, torch.Tensor | None]
"""A weight (packed or plain) and its bias."""


def _products(linears: list[torch.nn.Linear], fuse: bool, pack: bool) -> list[Product]:
    """What computes these layers' outputs side by side: one fused weight (packed where `pack`), or each layer's own
    weight as its forward multiplies it (packed where `prepack.pack_linears` packed it)."""
    if not fuse or len(linears) == 1:
        return [
            (linear.packed_weight if isinstance(linear, PackedLinear) else linear.weight, linear.bias)
            for linear in linears
        ]
    weight = torch.cat([linear.weight for linear in linears])
    bias = None
    if any(linear.bias is not None for linear in linears):
        zeros = [linear.weight.new_zeros(linear.out_features) for linear in linears]
        bias = torch.cat([zero if linear.bias is None else linear.bias for linear, zero in zip(linears, zeros)])
    return [(pack_weight(weight) if pack else weight, bias)]


def _rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """transformers' Llama/Qwen2 RMSNorm: normalized in fp32, rounded to the input's dtype, then scaled."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


@dataclass
class _Layer:
    scaling: float
    input_norm: torch.nn.Module
    post_attention_norm: torch.nn.Module
    qkv: list[Product]
    o: list[Product]
    gate_up: list[Product]
    down: list[Product]


class LeanDecoder:
    """The next token's logits for every row of a batch, one token a row, over the engine's KV cache."""

    def __init__(self, model: Any) -> None:
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.intermediate = config.intermediate_size
        pack = isinstance(model.lm_head, PackedLinear)  # all layers are alike (`build`)
        # fused q/k/v and gate/up products are bit-identical to separate ones in bf16; packed fp32 ones are not
        fuse = model.lm_head.weight.dtype == torch.bfloat16
        self.linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor] = (
            packed_linear if pack else F.linear
        )
        with torch.no_grad():
            self.layers = [
                _Layer(
                    layer.self_attn.scaling,
                    layer.input_layernorm,
                    layer.post_attention_layernorm,
                    _products([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj], fuse, pack),
                    _products([layer.self_attn.o_proj], fuse, pack),
                    _products([layer.mlp.gate_proj, layer.mlp.up_proj], fuse, pack),
                    _products([layer.mlp.down_proj], fuse, pack),
                )
                for layer in model.model.layers
            ]
            self.head = _products([model.lm_head], fuse, pack)

    def _multiply(self, x: torch.Tensor, products: list[Product]) -> torch.Tensor:
        if len(products) == 1:
            return self.linear(x, *products[0])
        return torch.cat([self.linear(x, weight, bias) for weight, bias in products], dim=-1)

    @classmethod
    def build(cls, model: Any) -> LeanDecoder | None:
        """A decoder over `model`'s current weights (build again after they change), or None where it would not
        compute exactly what transformers does: another architecture or configuration, weights not bf16 or fp32 on
        CPU, or not packed where this machine packs them."""
        if type(model).__name__ not in ARCHITECTURES or type(model.lm_head) not in LINEARS:
            return None
        config = model.config
        dtype = model.lm_head.weight.dtype
        layers_packed = packing_available(dtype)
        if (
            config.hidden_act != "silu"
            or getattr(config, "pretraining_tp", 1) not in (None, 1)
            or getattr(config, "use_sliding_window", False)
            or any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or [])
            or dtype not in (torch.bfloat16, torch.float32)
        ):
            return None
        for layer in model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            linears = [attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj]
            linears += [mlp.gate_proj, mlp.up_proj, mlp.down_proj, model.lm_head]
            if any(
                type(linear) not in LINEARS
                or isinstance(linear, PackedLinear) != layers_packed
                or linear.weight.dtype != dtype
                or linear.weight.device.type != "cpu"
                for linear in linears
            ):
                return None
        return cls(model)

    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
        prefix: SharedPrefix | None = None,
    ) -> torch.Tensor:
        """Logits `[rows, vocab]` for `tokens` `[rows]` at `positions` `[rows]`; `mask` `[rows, cached + 1]` is 1 where
        a token is real (the new one included); the keys and values of `tokens` are appended to `cache`. With a
        `prefix` held once, every row attends to it and then to its own cached columns (`shared_prefix_attention`)."""
        rows, heads, kv_heads, dim = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        base = self.model.model
        x = base.embed_tokens(tokens)
        cos, sin = base.rotary_emb(x[:, None], positions[:, None])  # [rows, 1, dim]
        half = dim // 2
        # rotate_half(q) * sin, where rotate_half(q) = [-q2, q1], is roll(q) * [-sin1, sin2]: the same products
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        attend = mask[:, None, None, :].bool()
        if prefix is not None:
            attend = torch.zeros(attend.shape, dtype=x.dtype).masked_fill_(~attend, float("-inf"))
        for index, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.input_norm)
            qkv = self._multiply(h, layer.qkv)
            qk = qkv[:, : (heads + kv_heads) * dim].view(rows, heads + kv_heads, dim)
            qk = qk * cos + torch.roll(qk, half, -1) * sin
            values = qkv[:, (heads + kv_heads) * dim :].view(rows, kv_heads, 1, dim)
            keys, values = cache.layers[index].update(qk[:, heads:, None], values)
            if prefix is None:
                out = F.scaled_dot_product_attention(
                    qk[:, :heads, None], keys, values, attn_mask=attend, scale=layer.scaling, enable_gqa=True
                )
            else:
                out = shared_prefix_attention(
                    qk[:, :heads, None], *prefix.kv[index], keys, values, attend, layer.scaling
                )
            x = x + self._multiply(out.view(rows, heads * dim), layer.o)
            h = _rms_norm(x, layer.post_attention_norm)
            gate_up = self._multiply(h, layer.gate_up)
            gated = F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :]
            x = x + self._multiply(gated, layer.down)
        return self._multiply(_rms_norm(x, base.norm), self.head)
