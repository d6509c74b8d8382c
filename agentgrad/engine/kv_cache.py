"""KV caches for batched generation: buffers that grow in place, and merging two batches' caches.

Rows of a running batch are left-padded to one width. A batch joining it is padded (with masked
zeros) to the same width and stacked; finished rows are dropped with `batch_select_indices`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
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

    return GrowingLayer
