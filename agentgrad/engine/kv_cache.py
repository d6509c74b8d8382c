"""KV caches for batched generation: buffers that grow in place, and merging two batches' caches.

Rows of a running batch are left-padded to one width. A batch joining it is padded (with masked
zeros) to the same width and stacked, and rows that finished are dropped, in one copy (`assemble`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

MIN_SHARED_PREFIX = 8
"""Sequences sharing at least this many leading tokens compute them once (generation and training)."""
KV_SPARE_TOKENS = 64
"""Room left in each KV buffer, so a decode step writes in place; it grows by this much when full."""


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all the prompts share."""
    first = prompts[0]
    length = len(first)
    for prompt in prompts[1:]:
        length = min(length, len(prompt))
        for i in range(length):
            if prompt[i] != first[i]:
                length = i
                break
    return length


def new_cache() -> Any:
    """An HF `DynamicCache` whose layers grow in place."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = growing_layer_class()
    return cache


@functools.cache
def growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A layer's keys and values in a buffer with spare room: a decode step writes in place
        instead of copying the whole cache (which cost a quarter of each step)."""

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            self.replace(key_states[:, :, :0], value_states[:, :, :0])
            self.is_initialized = True

        def replace(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            length = keys.shape[2]
            shape = (keys.shape[0], keys.shape[1], length + KV_SPARE_TOKENS, keys.shape[3])
            self._keys, self._values = keys.new_empty(shape), values.new_empty(shape)
            self._keys[:, :, :length], self._values[:, :, :length] = keys, values
            self.keys, self.values = self._keys[:, :, :length], self._values[:, :, :length]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start = self.keys.shape[2]
            end = start + key_states.shape[2]
            if end > self._keys.shape[2]:
                self.replace(self.keys, self.values)
                if end > self._keys.shape[2]:
                    self.replace(torch.cat([self.keys, key_states], 2), torch.cat([self.values, value_states], 2))
                    return self.keys, self.values
            self._keys[:, :, start:end], self._values[:, :, start:end] = key_states, value_states
            self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self.replace(self.keys[indices], self.values[indices])

        def assemble(self, parts: Sequence[tuple[torch.Tensor, torch.Tensor]], width: int) -> None:
            """Become these parts' rows stacked, each right-aligned in `width` columns with zeros on
            its left (masked padding; zeros, since 0 × garbage in attention could be NaN), in one copy."""
            first = parts[0][0]
            shape = (sum(keys.shape[0] for keys, _ in parts), first.shape[1], width + KV_SPARE_TOKENS, first.shape[3])
            self._keys, self._values = first.new_empty(shape), first.new_empty(shape)
            start = 0
            for keys, values in parts:
                rows, pad = keys.shape[0], width - keys.shape[2]
                for buffer, part in ((self._keys, keys), (self._values, values)):
                    buffer[start : start + rows, :, :pad] = 0
                    buffer[start : start + rows, :, pad:width] = part
                start += rows
            self.keys, self.values = self._keys[:, :, :width], self._values[:, :, :width]

    return GrowingLayer


@dataclass
class Batch:
    """The rows being generated together (`rows.Row`), their KV cache and what the next step feeds."""

    rows: list[Any]
    cache: Any
    mask: torch.Tensor  # (rows, cached length): 1 where a real token is cached
    positions: torch.Tensor  # (rows,): position id of the next token
    last: torch.Tensor  # (rows,): the token to feed next

    @property
    def live(self) -> int:
        """Rows still generating (the others finished and are dropped later, see `engine.FINISHED_SHARE_TO_DROP`)."""
        return sum(row.finish_reason is None for row in self.rows)


def restack(running: Batch, added: Batch | None = None) -> Batch:
    """One batch of the running batch's unfinished rows and the added batch's rows: the caches
    left-padded with masked zeros to one width (no column that is padding in every row) and
    stacked, in one copy. Without `added`, it drops the finished rows."""
    keep = torch.tensor(
        [i for i, row in enumerate(running.rows) if row.finish_reason is None],
        dtype=torch.long,
        device=running.mask.device,
    )
    mask = running.mask[keep]
    mask = mask[:, int(mask.any(dim=0).int().argmax()) :] if len(keep) else mask[:, :0]
    leading = running.mask.shape[1] - mask.shape[1]
    width = max(mask.shape[1], added.mask.shape[1] if added else 0)

    def pad(tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat([tensor.new_zeros(tensor.shape[0], width - tensor.shape[1]), tensor], dim=1)

    for layer_index, mine in enumerate(running.cache.layers):
        parts = [(mine.keys[keep, :, leading:], mine.values[keep, :, leading:])]
        if added is not None:
            theirs = added.cache.layers[layer_index]
            parts.append((theirs.keys, theirs.values))
        mine.assemble(parts, width)
    return Batch(
        rows=[running.rows[i] for i in keep.tolist()] + (added.rows if added else []),
        cache=running.cache,
        mask=torch.cat([pad(mask)] + ([pad(added.mask)] if added else []), dim=0),
        positions=torch.cat([running.positions[keep]] + ([added.positions] if added else [])),
        last=torch.cat([running.last[keep]] + ([added.last] if added else [])),
    )
