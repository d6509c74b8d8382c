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
covers exactly: on a CPU the bf16 sampling copy or the fp32 weights' packed twin, their layers packed where oneDNN
packs their dtype (`prepack.py`; bf16 stays plain on AVX2 alone), a LoRA adapter only merged into that twin; on a GPU the plain layers themselves
(no fused copy: the step reads the very parameters an update or a publish changes in place, so a captured CUDA graph
of it stays valid), and one LoRA adapter over them as peft computes it; anything else decodes through transformers'
forward.

`step_in_slots` is the same step over the static KV cache (`slots.py`): each row in a slot of fixed buffers, its
keys and values at the columns of their positions, so the step's tensors never move and a CUDA graph replays it
(`graphs.py`).

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

from agentgrad.engine.attention import decode_attention, shared_prefix_attention
from agentgrad.engine.kv_cache import SharedPrefix
from agentgrad.engine.prepack import Lora, PackedLinear, one_lora, pack_weight, packed_linear, packing_available

ARCHITECTURES = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM"})
"""Model classes whose decoder layer is exactly what `LeanDecoder.__call__` computes."""
DTYPES = (torch.bfloat16, torch.float32, torch.float16)


@dataclass
class Product:
    """A weight (packed or plain), its bias, and a LoRA adapter's (A, B, scaling) added to its output."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    lora: Lora | None = None


def _products(layers: list[Any], fuse: bool, pack: bool) -> list[Product]:
    """What computes these layers' outputs side by side: one fused weight (packed where `pack`), or each layer's own
    weight as its forward multiplies it (packed where `prepack.pack_linears` packed it), with its LoRA adapter."""
    found = []
    for layer in layers:
        pair = one_lora(layer)
        assert pair is not None, "LeanDecoder.build checks every layer"
        found.append(pair)
    linears = [linear for linear, _ in found]
    if not fuse or len(linears) == 1:
        return [
            Product(linear.packed_weight if isinstance(linear, PackedLinear) else linear.weight, linear.bias, lora)
            for linear, lora in found
        ]
    weight = torch.cat([linear.weight for linear in linears])
    bias = None
    if any(linear.bias is not None for linear in linears):
        zeros = [linear.weight.new_zeros(linear.out_features) for linear in linears]
        bias = torch.cat([zero if linear.bias is None else linear.bias for linear, zero in zip(linears, zeros)])
    return [Product(pack_weight(weight) if pack else weight, bias)]


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


Attention = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(layer index, queries `[rows, heads, dim]`, the new keys and values `[rows, kv_heads, dim]`) -> `[rows, heads *
dim]`: stores the keys and values where the cache keeps them and attends over the row's columns."""


class LeanDecoder:
    """The next token's logits for every row of a batch, one token a row, over the engine's KV cache."""

    def __init__(self, model: Any) -> None:
        model = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.intermediate = config.intermediate_size
        self.dtype = model.lm_head.weight.dtype
        pack = isinstance(model.lm_head, PackedLinear)  # all layers are alike (`build`)
        # fused q/k/v and gate/up products are bit-identical to separate ones in bf16; packed fp32 ones are not; on a
        # GPU a fused weight would be a copy that an update leaves stale
        fuse = model.lm_head.weight.dtype == torch.bfloat16 and model.lm_head.weight.device.type == "cpu"
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

    def _product(self, x: torch.Tensor, product: Product) -> torch.Tensor:
        y = self.linear(x, product.weight, product.bias)
        if product.lora is None:
            return y
        a, b, scaling = product.lora  # as peft: the input in the adapter's dtype, the sum in the layer's
        return (y + F.linear(F.linear(x.to(a.dtype), a), b) * scaling).to(y.dtype)

    def _multiply(self, x: torch.Tensor, products: list[Product]) -> torch.Tensor:
        if len(products) == 1:
            return self._product(x, products[0])
        return torch.cat([self._product(x, product) for product in products], dim=-1)

    @classmethod
    def build(cls, model: Any) -> LeanDecoder | None:
        """A decoder over `model`'s current weights (on a CPU, build again after they change), or None where it
        would not compute exactly what transformers does: another architecture or configuration, weights not bf16 or
        fp32 on CPU, not packed where this machine packs them, or LoRA adapters other than one plain one on a GPU."""
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        if type(inner).__name__ not in ARCHITECTURES or one_lora(inner.lm_head) is None:
            return None
        config = inner.config
        weight = inner.lm_head.weight
        dtype, device = weight.dtype, weight.device
        on_cpu = device.type == "cpu"
        layers_packed = on_cpu and packing_available(dtype)
        if (
            config.hidden_act != "silu"
            or getattr(config, "pretraining_tp", 1) not in (None, 1)
            or getattr(config, "use_sliding_window", False)
            or any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or [])
            or dtype not in (DTYPES[:2] if on_cpu else DTYPES)
        ):
            return None
        for layer in inner.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            layers = [attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj]
            layers += [mlp.gate_proj, mlp.up_proj, mlp.down_proj, inner.lm_head]
            for found in map(one_lora, layers):
                if (
                    found is None
                    or (on_cpu and found[1] is not None)  # a CPU serves LoRA merged into a twin, or through peft
                    or isinstance(found[0], PackedLinear) != layers_packed
                    or found[0].weight.dtype != dtype
                    or found[0].weight.device != device
                ):
                    return None
        return cls(model)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attention) -> torch.Tensor:
        """Logits `[rows, vocab]` for `tokens` `[rows]` at `positions` `[rows]`, attending through `attend`."""
        rows, heads, kv_heads, dim = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        base = self.model.model
        x = base.embed_tokens(tokens)
        cos, sin = base.rotary_emb(x[:, None], positions[:, None])  # [rows, 1, dim]
        half = dim // 2
        # rotate_half(q) * sin, where rotate_half(q) = [-q2, q1], is roll(q) * [-sin1, sin2]: the same products
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        for index, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.input_norm)
            qkv = self._multiply(h, layer.qkv)
            qk = qkv[:, : (heads + kv_heads) * dim].view(rows, heads + kv_heads, dim)
            qk = qk * cos + torch.roll(qk, half, -1) * sin
            values = qkv[:, (heads + kv_heads) * dim :].view(rows, kv_heads, dim)
            x = x + self._multiply(attend(index, qk[:, :heads], qk[:, heads:], values), layer.o)
            h = _rms_norm(x, layer.post_attention_norm)
            gate_up = self._multiply(h, layer.gate_up)
            gated = F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :]
            x = x + self._multiply(gated, layer.down)
        return self._multiply(_rms_norm(x, base.norm), self.head)

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
        rows, dim = tokens.shape[0], self.head_dim
        visible = mask[:, None, None, :].bool()
        additive = None
        if prefix is not None:
            additive = torch.zeros(visible.shape, dtype=self.dtype).masked_fill_(~visible, float("-inf"))

        def attend(index: int, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            scaling = self.layers[index].scaling
            keys, values = cache.layers[index].update(keys[:, :, None], values[:, :, None])
            if prefix is None or additive is None:
                out = decode_attention(queries[:, :, None], keys, values, visible, scaling)
            else:
                out = shared_prefix_attention(queries[:, :, None], *prefix.kv[index], keys, values, additive, scaling)
            return out.view(rows, self.heads * dim)

        return self._forward(tokens, positions, attend)

    def step_in_slots(self, tokens: torch.Tensor, positions: torch.Tensor, cache: Any, columns: int) -> torch.Tensor:
        """Logits `[rows, vocab]` for the rows in the first `rows` slots of `cache` (`slots.SlotCache`): each row's
        token's keys and values are written at the column of its position, and it attends over the columns up to
        it among the first `columns`. Shapes depend only on (rows, columns): a CUDA graph of it replays."""
        rows, heads, kv_heads, dim = tokens.shape[0], self.heads, self.kv_heads, self.head_dim
        group = heads // kv_heads
        slots = torch.arange(rows, device=tokens.device)
        visible = torch.arange(columns, device=tokens.device) <= positions[:, None]
        additive = torch.zeros(visible.shape, dtype=self.dtype, device=tokens.device).masked_fill_(
            ~visible, float("-inf")
        )
        additive = additive[:, None, None, :]

        def attend(index: int, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            cached_keys, cached_values = cache.layer(index)  # [slots, kv_heads, capacity, dim]
            cached_keys[slots, :, positions] = keys
            cached_values[slots, :, positions] = values
            # the query heads of a key/value head as that head's queries: the keys are read once for the group
            out = F.scaled_dot_product_attention(
                queries.reshape(rows, kv_heads, group, dim),
                cached_keys[:rows, :, :columns],
                cached_values[:rows, :, :columns],
                attn_mask=additive,
                scale=self.layers[index].scaling,
            )
            return out.reshape(rows, heads * dim)

        return self._forward(tokens, positions, attend)
