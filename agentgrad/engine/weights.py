"""The engine's weights: the model that trains, and what sampling runs, kept in step.

Training uses `model` (fp32 master weights). Sampling may run a bf16 copy, which is ~2.7× faster on CPUs with
AVX512-bf16, or in fp32 on a CPU that packs a twin with packed layers (`prepack.py`); `publish` brings it up to the
trained weights. The engine holds one `Weights` and changes it under its `weights_lock`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from agentgrad.engine.attention import use_engine_attention
from agentgrad.engine.decode import LeanDecoder
from agentgrad.engine.model import load_model
from agentgrad.engine.prepack import bf16_supported, merges, pack_linears, packed_twin, packing_available
from agentgrad.engine.threads import in_own_thread, return_free_memory


def default_sampling_dtype(device: str) -> torch.dtype:
    """bf16 on a GPU and on a CPU that computes in it (`prepack.bf16_supported`), else fp32."""
    if device.startswith("cuda"):
        return torch.bfloat16
    return torch.bfloat16 if bf16_supported() else torch.float32


def load_weights(
    source: str | Path | None, device: str, sampling_dtype: torch.dtype, frozen: bool
) -> tuple[Weights, Any]:
    """The weights at `source` and their tokenizer; `frozen`: loaded in the sampling dtype, one copy that serves and
    trains (LoRA), without an fp32 copy's peak."""
    model, tokenizer = load_model(source, device=device, dtype=sampling_dtype if frozen else None)
    return Weights(model, device, sampling_dtype), tokenizer


class Weights:
    """The trained `model`, the module sampling runs (`sampler`: the model itself, a copy in the sampling dtype, or a
    packed twin) and the written-out decode step over it (`decoder`; None where transformers' forward serves)."""

    def __init__(self, model: torch.nn.Module, device: str, sampling_dtype: torch.dtype) -> None:
        self.model: Any = model  # a transformers model, which mypy reads untyped (pyproject.toml)
        self.device = device
        self.sampling_dtype = sampling_dtype
        self.model.eval()
        # fp32 samples from the trained weights themselves, through a twin with packed layers where this CPU packs
        self.twin = sampling_dtype == torch.float32 and device == "cpu" and packing_available(torch.float32)
        self.sampler: torch.nn.Module
        if sampling_dtype != next(model.parameters()).dtype:
            self.sampler = copy_for_sampling(model, sampling_dtype)
            use_engine_attention(self.sampler)
        else:
            use_engine_attention(model)
            self.sampler = packed_twin(model) if self.twin else model
        self.decoder: LeanDecoder | None = LeanDecoder.build(self.sampler)

    def freeze(self) -> None:
        """Round the weights to the sampling dtype and sample from them: one copy for sampling and for training
        adapters over them (`Engine.freeze_base`)."""
        self.sampler, self.decoder = (
            self.model,
            None,
        )  # the copy goes before the weights are rounded: never both at once
        self.model.to(self.sampling_dtype)
        use_engine_attention(self.model)
        self.decoder = LeanDecoder.build(self.model)

    def replace(self, model: torch.nn.Module, merge: bool) -> None:
        """Serve and train `model` instead; sampling then uses it directly, except with `merge` on a CPU that
        packs fp32: a packed twin with its one LoRA adapter merged in (`prepack.packed_twin`), remade by `publish`."""
        self.model = model
        self.model.eval()
        use_engine_attention(model)
        fp32 = next(model.parameters()).dtype == torch.float32
        self.twin = merge and self.device == "cpu" and fp32 and packing_available(torch.float32) and merges(model)
        self.sampler, self.decoder = model, None  # the old sampler's weights go before a twin is made
        if self.twin:
            self.sampler = in_own_thread(packed_twin, model)
        # on a CPU, over peft's layers it would hold copies of weights that training changes in place (`build`
        # says None), over the twin its packed copies; on a GPU it reads them where they are, one adapter included
        self.decoder = LeanDecoder.build(self.sampler)
        self.sampling_dtype = next(model.parameters()).dtype

    @contextmanager
    def training(self) -> Iterator[torch.nn.Module]:
        """The model in training mode; a packed twin is set aside meanwhile, its copies would go stale (the plain
        weights serve until `publish` packs anew)."""
        if self.twin:
            self.sampler, self.decoder = self.model, None
        self.model.train()
        try:
            yield self.model
        finally:
            self.model.eval()
            return_free_memory()  # the update's activations and temporaries

    def publish(self) -> None:
        """Bring sampling up to the trained weights, which may have changed in place: a new packed twin (the old one's
        copies gone first), or the copy in the sampling dtype overwritten."""
        if self.twin:
            self.sampler, self.decoder = self.model, None
            self.sampler = in_own_thread(packed_twin, self.model)
            self.decoder = in_own_thread(LeanDecoder.build, self.sampler)
        elif self.sampler is not self.model:
            in_own_thread(self._copy_into_sampler)

    @torch.no_grad()
    def _copy_into_sampler(self) -> None:
        for serving, trained in zip(self.sampler.parameters(), self.model.parameters()):
            serving.copy_(trained)
        pack_linears(self.sampler)
        self.decoder = LeanDecoder.build(self.sampler)


def copy_for_sampling(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`model` again in `dtype`, converted tensor by tensor: never a second copy in the trained dtype (a whole fp32
    copy first was 6 GB more at load for a 1.5B model)."""
    memo: dict[int, Any] = {
        id(p): torch.nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in model.parameters()
    }
    memo.update({id(b): b.to(dtype) if b.is_floating_point() else b.clone() for b in model.buffers()})
    sampler = copy.deepcopy(model, memo)
    sampler.eval()
    sampler.requires_grad_(False)
    pack_linears(sampler)
    return sampler
