"""The sampling model's linear layers with their weights packed once for oneDNN, not at every call.

A bf16 `F.linear` on CPU hands the weight to oneDNN, which lays it out in its blocked format on each call:
every decode step read the 270 MB of SmolLM2's weights and wrote them again before multiplying. Packed
once (`torch.ops.mkldnn._reorder_linear_weight`, as torch.compile's CPU backend does), a (1536 × 576)
product took 187 µs instead of 293 at 1 row, 216 instead of 303 at 8 and 264 instead of 446 at 64 (1 thread,
weights too many to stay in the processor's cache; `docs/benchmarks.md`), with identical results; a SmolLM2
decode step took 20-23 % less CPU at 1, 8 and 64 rows with the same greedy tokens. Only the sampling copy is
packed (the trained fp32 weights keep plain layers), again at each `Engine.publish`; the packed weights are
one more bf16 copy of the linear layers (~0.27 GB for SmolLM2 with its output layer, ~1 GB for Qwen2.5-0.5B).

fp32 weights pack too, on AVX2 as well, where oneDNN's packed product beats MKL's plain one at a decode step's few
rows (over all of SmolLM2's weights, 2 threads: 55 → 43 ms at 1 row, 98 → 58 at 8, 269 → 179 at 64). Processors
without oneDNN's bf16 path sample with the fp32 trained weights themselves, so the engine packs a `packed_twin`:
a second module tree over the very same parameters, whose linear layers multiply with packed copies.

A LoRA-adapted model (one adapter) on a CPU samples from such a twin too, its adapters merged into the packed copies
(W + scaling·B·A, in fp32): Qwen2.5-Coder-0.5B with rank-16 adapters on every projection decoded 16 rows at 41.7
tok/s through peft's layers and 96.3 through the merged twin (fp32, AVX-512, 2 threads; `benchmarks/lora_sampling.py`).
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch

PACK_ROWS = 64
"""The row count oneDNN lays the packed weights out for (any count works; the engine's default batch)."""


def bf16_supported() -> bool:
    """Whether oneDNN has a bf16 path on this CPU (AVX-512 or AVX-NE-CONVERT); on AVX2 alone bf16 is emulated, slowly."""
    return bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())


def packing_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether linear weights of `dtype` can be packed for oneDNN here: a CPU build with mkldnn; for bf16, on a
    processor with oneDNN's bf16 path (`bf16_supported`; on AVX2 alone the reorder raises, and layers stay plain)."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and (dtype == torch.float32 or bf16_supported())
    )


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out × in, bf16 or fp32, CPU) laid out once in oneDNN's blocked format, for `packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)


def packed_linear(input: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear` with a weight from `pack_weight`."""
    return torch.ops.mkldnn._linear_pointwise(input, packed, bias, "none", [], "")


Lora = tuple[torch.Tensor, torch.Tensor, float]
"""A LoRA adapter's A and B weights and its scaling: a layer's output gains `scaling · B·A·x`."""


def one_lora(layer: Any) -> tuple[torch.nn.Linear, Lora | None] | None:
    """A layer's plain linear and its one active LoRA adapter (None: no adapter), or None where peft would compute
    something else (several adapters, DoRA, dropout, a merged or disabled adapter, a LoRA bias)."""
    if type(layer) in (torch.nn.Linear, PackedLinear):
        return layer, None
    base = getattr(layer, "base_layer", None)
    active = getattr(layer, "active_adapters", None)
    if type(base) is not torch.nn.Linear or not isinstance(active, list) or len(active) != 1:
        return None
    name = active[0]
    if (
        getattr(layer, "merged", True)
        or getattr(layer, "disable_adapters", True)
        or layer.use_dora.get(name)
        or type(layer.lora_dropout[name]) is not torch.nn.Identity
        or layer.lora_A[name].bias is not None
        or layer.lora_B[name].bias is not None
        or getattr(layer, "lora_variant", {}).get(name) is not None
    ):
        return None
    return base, (layer.lora_A[name].weight, layer.lora_B[name].weight, float(layer.scaling[name]))


def _adapted_layers(model: Any) -> list[tuple[str, Any]]:
    """The (name, layer) of each peft LoRA layer in `model`."""
    return [(name, module) for name, module in model.named_modules() if hasattr(module, "lora_A")]


def _merged_pair(layer: Any) -> tuple[torch.nn.Linear, Lora] | None:
    """A peft LoRA layer's plain linear and its adapter, where it holds exactly one plain adapter; else None."""
    found = one_lora(layer) if len(layer.lora_A) == 1 else None
    return None if found is None or found[1] is None else (found[0], found[1])


def merges(model: Any) -> bool:
    """Whether `packed_twin` can merge `model`'s adapters: each LoRA layer holds one plain adapter (not several, as
    a model serving one adapter per role does)."""
    layers = _adapted_layers(model)
    return bool(layers) and all(_merged_pair(layer) is not None for _, layer in layers)


class PackedLinear(torch.nn.Linear):
    """An `nn.Linear` that multiplies with `packed_weight` (its `weight`, laid out by `pack_weight`). A class, not a
    bound `forward`: a method bound on the layer would be a reference cycle, and a closed engine's packed weights
    would then wait for the cyclic garbage collector (in a test suite, gigabytes of them)."""

    packed_weight: torch.Tensor

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return packed_linear(input, self.packed_weight, self.bias)


def pack_linears(model: Any, adapters: dict[int, Lora] | None = None) -> int:
    """Pack (again, after its weights changed) every bf16 or fp32 CPU `nn.Linear` of `model` whose dtype this machine
    packs, making it a `PackedLinear`; returns how many. The plain weights stay the parameters (`publish` copies
    into them). A layer in `adapters` (by `id`) is packed with its adapter merged in: its packed product is not its
    `weight`'s."""
    packed = 0
    with torch.no_grad():
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if type(module) not in (torch.nn.Linear, PackedLinear) or weight is None or weight.device.type != "cpu":
                continue
            if weight.dtype not in (torch.bfloat16, torch.float32) or not packing_available(weight.dtype):
                continue
            lora = (adapters or {}).get(id(module))
            if lora is not None:
                a, b, scaling = lora
                weight = weight + (b.to(weight.dtype) @ a.to(weight.dtype)) * scaling
            module.packed_weight = pack_weight(weight.detach())
            module.__class__ = PackedLinear
            packed += 1
    return packed


def packed_twin(model: Any) -> Any:
    """`model`'s module tree again over the same parameters and buffers (no tensor copied), its linear layers packed
    (`pack_linears`): fp32 sampling from the weights training changes in place, with packed products. Packed
    copies do not follow those changes: make a new twin after them (`Engine.publish`).

    Of a peft model whose adapters `merges`, the twin is the base model's tree with each LoRA layer replaced by its
    plain linear, packed with the adapter merged in; the adapters' own weights are left to training."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    shared = {id(tensor): tensor for tensor in itertools.chain(inner.parameters(), inner.buffers())}
    twin = copy.deepcopy(inner, shared)
    twin.eval()
    adapters: dict[int, Lora] = {}
    for name, layer in _adapted_layers(twin):
        pair = _merged_pair(layer)
        if pair is None:
            raise ValueError(f"{name} does not hold one plain LoRA adapter: its twin cannot merge it (`merges`)")
        linear, adapters[id(pair[0])] = pair
        parent, _, attribute = name.rpartition(".")
        setattr(twin.get_submodule(parent), attribute, linear)
    if not packing_available(next(twin.parameters()).dtype) and adapters:
        raise ValueError("this machine packs no weights of this dtype: a twin cannot merge adapters into packed copies")
    pack_linears(twin, adapters)
    return twin
