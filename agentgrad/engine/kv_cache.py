"""KV caches for batched generation: buffers that grow in place, and merging two batches' caches.

Rows of a running batch are left-padded to one width. A batch joining it is padded (with masked
zeros) to the same width and stacked, in one copy (`assemble`); rows that finished are dropped in
place, copying only the rows that move into their places (`keep_rows`). Buffers a cache no longer
needs go back to `KV_POOL` and are handed out again (in inference mode, on CPU).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

MIN_SHARED_PREFIX = 8
"""Sequences sharing at least this many leading tokens compute them once (generation and training)."""
MIN_HELD_ONCE_PREFIX = 64
"""A running batch whose rows all start with at least this many tokens holds their keys and values once
(`SharedPrefix`). A chosen floor, not a measured crossover: a shorter prefix saves little reading, and holding it
costs a second attention call a layer."""
KV_SPARE_TOKENS = 64
"""Room left in each KV buffer, so a decode step writes in place; it grows by this much when full."""


KV_POOL_BYTES = 2 * 2**30
"""The most bytes of retired KV buffers kept for reuse."""
KV_POOL_MIN_BYTES = 2**20
"""Smaller buffers are not pooled: malloc reuses its own small blocks, and a long pool is slow to search."""


class BufferPool:
    """Retired KV buffers, handed out again for the next cache of the same dtype. On CPU, the first write to
    fresh memory costs a page fault every 4 KiB: joining 63 rows to a running batch of SmolLM2 in a GRPO step
    (~0.5 GB of keys and values) took 330-840 ms with ~107,000 faults, against ~50 ms for the copy into memory
    written before. Only inference tensors are pooled: autograd may hold a training cache's tensors."""

    def __init__(self, max_bytes: int = KV_POOL_BYTES, min_bytes: int = KV_POOL_MIN_BYTES) -> None:
        self.max_bytes, self.min_bytes = max_bytes, min_bytes
        self._free: list[torch.Tensor] = []
        self._bytes = 0
        self._lock = threading.Lock()

    def empty(self, shape: Sequence[int], like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """An uninitialized `shape` tensor of `like`'s dtype and device, and the flat buffer it views (to `give`
        back): the smallest retired buffer that holds it, but no more than four times its size."""
        numel = math.prod(shape)
        if (
            like.device.type == "cpu"
            and numel * like.element_size() >= self.min_bytes
            and torch.is_inference_mode_enabled()
        ):
            with self._lock:
                fits = [
                    i
                    for i, flat in enumerate(self._free)
                    if flat.dtype == like.dtype and numel <= flat.numel() <= 4 * numel
                ]
                if fits:
                    flat = self._free.pop(min(fits, key=lambda i: self._free[i].numel()))
                    self._bytes -= flat.numel() * flat.element_size()
                    return flat[:numel].view(shape), flat
        flat = like.new_empty(numel)
        return flat.view(shape), flat

    def give(self, flat: torch.Tensor) -> None:
        """Keep a flat buffer nothing reads any more for reuse, dropping the oldest past `max_bytes`."""
        size = flat.numel() * flat.element_size()
        if flat.device.type != "cpu" or not flat.is_inference() or size < self.min_bytes:
            return
        with self._lock:
            self._free.append(flat)
            self._bytes += size
            while self._bytes > self.max_bytes:
                dropped = self._free.pop(0)
                self._bytes -= dropped.numel() * dropped.element_size()

    @property
    def bytes(self) -> int:
        """Bytes of retired buffers kept for reuse."""
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._bytes = 0


KV_POOL = BufferPool()


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
        """A layer's keys and values, `[rows, heads, columns, dim]`, in a buffer with room to spare: columns on the
        right, so a decode step writes in place instead of copying the whole cache (which cost a quarter of each
        step); rows and columns on the left where a batch is running, so rows join it in place (`join`)."""

        _flat: tuple[torch.Tensor, torch.Tensor] | None = None

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.device = key_states.device
            self.replace(key_states[:, :, :0], value_states[:, :, :0])
            self.is_initialized = True

        def _allocate(self, rows: int, width: int, left: int, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
            """New key and value buffers (from `KV_POOL`) for `rows` rows of `width` columns, with `left` free columns
            before them and `KV_SPARE_TOKENS` after, and the flat buffers they view (for `_adopt`)."""
            shape = (rows, like.shape[1], left + width + KV_SPARE_TOKENS, like.shape[3])
            (keys, flat_keys), (values, flat_values) = KV_POOL.empty(shape, like), KV_POOL.empty(shape, like)
            return keys, values, flat_keys, flat_values

        def _adopt(self, buffers: tuple[torch.Tensor, ...], rows: int, left: int, width: int) -> None:
            """Serve rows `[0, rows)`, columns `[left, left + width)` of these `_allocate`d buffers, once they hold
            what this layer keeps; the old ones go back to `KV_POOL`."""
            self.release()
            keys, values, flat_keys, flat_values = buffers
            self._flat = flat_keys, flat_values
            self._base = keys, values
            self._place(rows, left, width)

        def _place(self, rows: int, left: int, width: int) -> None:
            keys, values = self._base
            self._left = left
            self._keys, self._values = keys[:rows, :, left:], values[:rows, :, left:]
            self.keys, self.values = self._keys[:, :, :width], self._values[:, :, :width]

        def release(self) -> None:
            """Give the buffers to `KV_POOL`: nothing reads this layer afterwards."""
            for flat in self._flat or ():
                KV_POOL.give(flat)
            self._flat = None

        def replace(
            self, keys: torch.Tensor, values: torch.Tensor, index: torch.Tensor | None = None, *, room: bool = False
        ) -> None:
            """Hold these keys and values (their rows `index`, if given) in new buffers; `room`: keep the rows and
            left columns to spare that the current buffers have."""
            rows, width = (keys.shape[0] if index is None else len(index)), keys.shape[2]
            capacity, left = (self._base[0].shape[0], self._left) if room else (rows, 0)
            buffers = self._allocate(capacity, width, left, keys)
            for buffer, part in zip(buffers, (keys, values)):
                if index is None:
                    buffer[:rows, :, left : left + width] = part
                else:
                    torch.index_select(part, 0, index, out=buffer[:rows, :, left : left + width])
            self._adopt(buffers, rows, left, width)

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start = self.keys.shape[2]
            end = start + key_states.shape[2]
            if end > self._keys.shape[2]:
                self.replace(self.keys, self.values, room=True)
                if end > self._keys.shape[2]:
                    self.replace(torch.cat([self.keys, key_states], 2), torch.cat([self.values, value_states], 2))
                    return self.keys, self.values
            self._keys[:, :, start:end], self._values[:, :, start:end] = key_states, value_states
            self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self.replace(self.keys, self.values, indices)

        def keep_rows(self, moves: Sequence[tuple[int, int]], rows: int, leading: int) -> None:
            """Keep the first `rows` rows, after copying each move's source row over its target row, without
            the first `leading` columns: in place, copying only the moved rows."""
            width = self.keys.shape[2]
            for target, source in moves:
                self._keys[target, :, leading:width] = self._keys[source, :, leading:width]
                self._values[target, :, leading:width] = self._values[source, :, leading:width]
            self._place(rows, self._left + leading, width - leading)

        def prepend(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            """Put these columns (`[1, heads, n, dim]`, the same for every row) before every row's columns: in place
            where there are columns to spare on the left."""
            rows, width, added = self.keys.shape[0], self.keys.shape[2], keys.shape[2]
            if added <= self._left:
                for buffer, part in zip(self._base, (keys, values)):
                    buffer[:rows, :, self._left - added : self._left] = part
                self._place(rows, self._left - added, width + added)
            else:
                self.replace(
                    torch.cat([keys.expand(rows, -1, -1, -1), self.keys], 2),
                    torch.cat([values.expand(rows, -1, -1, -1), self.values], 2),
                    room=True,
                )

        def can_join(self, rows: int, width: int) -> bool:
            """Whether `rows` rows of `width` columns can `join` in place."""
            return self.keys.shape[0] + rows <= self._base[0].shape[0] and width - self.keys.shape[2] <= self._left

        def join(self, keys: torch.Tensor, values: torch.Tensor) -> None:
            """Append these rows (`can_join`), right-aligned with the others and zeros on their left; the other rows
            get zeros in the columns they gain. Only the joining rows are copied."""
            rows, width = self.keys.shape[0], self.keys.shape[2]
            wider = max(width, keys.shape[2])
            left = self._left - (wider - width)
            for buffer, part in zip(self._base, (keys, values)):
                buffer[:rows, :, left : self._left] = 0
                end = left + wider
                buffer[rows : rows + len(part), :, left : end - part.shape[2]] = 0
                buffer[rows : rows + len(part), :, end - part.shape[2] : end] = part
            self._place(rows + len(keys), left, wider)

        def assemble(self, parts: Sequence[tuple[torch.Tensor, torch.Tensor]], width: int, capacity: int) -> None:
            """Become these parts' rows stacked, each right-aligned in `width` columns with zeros on its left (masked
            padding; zeros, since 0 × garbage in attention could be NaN), in one copy; with room for `capacity`
            rows and `KV_SPARE_TOKENS` more columns on the left, to `join` in place."""
            first = parts[0][0]
            rows = sum(keys.shape[0] for keys, _ in parts)
            left = KV_SPARE_TOKENS
            buffers = self._allocate(max(rows, capacity), width, left, first)
            start = 0
            for keys, values in parts:
                count, pad = keys.shape[0], width - keys.shape[2]
                for buffer, part in zip(buffers, (keys, values)):
                    buffer[start : start + count, :, left : left + pad] = 0
                    buffer[start : start + count, :, left + pad : left + width] = part
                start += count
            self._adopt(buffers, rows, left, width)

    return GrowingLayer


@dataclass
class SharedPrefix:
    """The leading tokens every row of a batch starts with, their keys and values held once (`[1, kv_heads, tokens,
    dim]` a layer) instead of in every row: a decode step reads them once for all rows
    (`attention.shared_prefix_attention`). `version`: the weights that computed them."""

    tokens: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    version: int


@dataclass
class Batch:
    """The rows being generated together (`rows.Row`), their KV cache and what the next step feeds."""

    rows: list[Any]
    cache: Any
    mask: torch.Tensor  # (rows, cached length): 1 where a real token is cached, after `prefix`
    positions: torch.Tensor  # (rows,): position id of the next token
    last: torch.Tensor  # (rows,): the token to feed next
    prefix: SharedPrefix | None = None  # leading tokens of every row, held once; the cache holds what follows

    @property
    def live(self) -> int:
        """Rows still generating (the others finished and are dropped later, see `engine.FINISHED_SHARE_TO_DROP`)."""
        return sum(row.finish_reason is None for row in self.rows)


def held_bytes(batch: Batch) -> int:
    """Bytes of keys and values `batch` holds: its rows' (the columns in use) and a prefix held once."""
    held = sum(keys.nbytes + values.nbytes for keys, values in batch.prefix.kv) if batch.prefix is not None else 0
    return held + sum(layer.keys.nbytes + layer.values.nbytes for layer in batch.cache.layers)


def row_kv(batch: Batch, index: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The keys and values of row `index`'s first `length` tokens, a layer each (a finished row, for the prefix
    cache): the prefix held once, if any, and the rightmost columns of its cache row; None where they are not laid
    out so (keep nothing rather than something wrong)."""
    own = length - (len(batch.prefix.tokens) if batch.prefix is not None else 0)  # the rest is the prefix held once
    width = batch.mask.shape[1]
    if own > width or any(layer.keys.shape[2] != width for layer in batch.cache.layers):
        return None
    if not bool(batch.mask[index, width - own :].all()):
        return None
    kv = []
    for layer_index, layer in enumerate(batch.cache.layers):
        keys, values = (part[index : index + 1, :, width - own :] for part in (layer.keys, layer.values))
        if batch.prefix is not None:
            held_keys, held_values = batch.prefix.kv[layer_index]
            kv.append((torch.cat([held_keys, keys], 2), torch.cat([held_values, values], 2)))
        else:
            kv.append((keys.clone(), values.clone()))  # a copy: the batch goes on
    return kv


def hold_prefix_once(batch: Batch, prefix: SharedPrefix) -> None:
    """Hold the prefix every row's cache starts with (its first columns) once, in `batch.prefix`: the rows keep
    the columns after it (in place, nothing copied)."""
    shared = len(prefix.tokens)
    rows = batch.mask.shape[0]
    for layer in batch.cache.layers:
        layer.keep_rows([], rows, shared)
    batch.mask = batch.mask[:, shared:]
    batch.prefix = prefix


def unshare_prefix(batch: Batch, keep: int) -> None:
    """Hold only the first `keep` tokens of `batch.prefix` once (none: 0), copying the rest into every row's
    cache before its own columns."""
    prefix = batch.prefix
    if prefix is None or keep == len(prefix.tokens):
        return
    for layer, (keys, values) in zip(batch.cache.layers, prefix.kv):
        layer.prepend(keys[:, :, keep:], values[:, :, keep:])
    batch.mask = torch.cat([batch.mask.new_ones(batch.mask.shape[0], len(prefix.tokens) - keep), batch.mask], dim=1)
    batch.prefix = (
        SharedPrefix(prefix.tokens[:keep], [(k[:, :, :keep], v[:, :, :keep]) for k, v in prefix.kv], prefix.version)
        if keep
        else None
    )


def _common_held_prefix(one: SharedPrefix | None, other: SharedPrefix | None) -> int:
    """How many of two batches' once-held prefix tokens they can go on holding once together."""
    if one is None or other is None or one.version != other.version:
        return 0
    common = common_prefix_length([one.tokens, other.tokens])
    return common if common >= MIN_HELD_ONCE_PREFIX else 0


def drop_finished(running: Batch) -> Batch:
    """The running batch without its finished rows, in place: the last unfinished rows move into the places
    of finished rows before them, and columns that are padding in every remaining row go. Only the moved rows
    are copied; `restack` copied the whole cache, ~60 ms a time for SmolLM2's 64 rows in a GRPO step."""
    rows = running.rows
    count = sum(row.finish_reason is None for row in rows)
    holes = [i for i in range(count) if rows[i].finish_reason is not None]
    movers = [i for i in range(count, len(rows)) if rows[i].finish_reason is None]
    order = list(range(count))
    for hole, mover in zip(holes, movers):
        order[hole] = mover
    index = torch.tensor(order, dtype=torch.long, device=running.mask.device)
    mask = running.mask[index]
    leading = int(mask.any(dim=0).int().argmax()) if count else mask.shape[1]
    for layer in running.cache.layers:
        layer.keep_rows(list(zip(holes, movers)), count, leading)
    return Batch(
        rows=[rows[i] for i in order],
        cache=running.cache,
        mask=mask[:, leading:],
        positions=running.positions[index],
        last=running.last[index],
        prefix=running.prefix,
    )


def restack(running: Batch, added: Batch, capacity: int) -> Batch:
    """One batch of the running batch's unfinished rows and the added batch's rows, left-padded with masked zeros
    to one width (no column that is padding in every row). In place where the running cache has the room
    (`GrowingLayer.can_join`), copying only the added rows; else stacked in one copy, with room for `capacity` rows."""
    if any(row.finish_reason is not None for row in running.rows):
        running = drop_finished(running)
    common = _common_held_prefix(running.prefix, added.prefix)
    unshare_prefix(running, common)
    unshare_prefix(added, common)
    layers = list(zip(running.cache.layers, added.cache.layers))
    width = max(running.mask.shape[1], added.mask.shape[1])
    if all(mine.can_join(theirs.keys.shape[0], theirs.keys.shape[2]) for mine, theirs in layers):
        for mine, theirs in layers:
            mine.join(theirs.keys, theirs.values)
            theirs.release()
    else:
        for mine, theirs in layers:
            mine.assemble([(mine.keys, mine.values), (theirs.keys, theirs.values)], width, capacity)
            theirs.release()

    def pad(tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat([tensor.new_zeros(tensor.shape[0], width - tensor.shape[1]), tensor], dim=1)

    return Batch(
        rows=running.rows + added.rows,
        cache=running.cache,
        mask=torch.cat([pad(running.mask), pad(added.mask)], dim=0),
        positions=torch.cat([running.positions, added.positions]),
        last=torch.cat([running.last, added.last]),
        prefix=running.prefix,
    )
