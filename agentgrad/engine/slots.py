"""The static KV cache: every row of the running batch in a slot of buffers allocated once, so a decode step's
tensors keep their addresses and shapes and a CUDA graph of it replays (`graphs.py`).

One tensor holds every layer's keys and values, `[layers, 2, slots, kv_heads, capacity + 1, head_dim]`. Row `i` of
the running batch lives in slot `i`, its token at position `p` in column `p` (no padding between a row's tokens);
a step writes each row's new keys and values at the column of its position and attends over the columns up to it
(`LeanDecoder.step_in_slots`). Rows join in the slots after the others (their prefill's keys and values copied in,
`SlotCache.admit`), and finished rows leave by moving the last rows into their slots (`SlotCache.move`). The last
column takes the prefill's padding, which nothing reads. The capacity (columns) doubles when a row needs more,
up to the model's length; a new capacity means new buffers, and the graphs over the old ones are dropped.

`StaticDecoding` runs a batch of such rows: logits from a captured graph per (rows, columns) bucket on a GPU
(`graphs.StepGraphs`), from the same step run directly elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from agentgrad.engine.decode import LeanDecoder
from agentgrad.engine.kv_cache import Batch
from agentgrad.engine.prefix_cache import LayerKV

FIRST_CAPACITY = 256
"""Columns a slot holds at first; doubled as rows need more (each time the graphs are captured again)."""


class SlotCache:
    """Keys and values of `slots` rows, `capacity` positions each, every layer in one tensor."""

    def __init__(self, model: Any, slots: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        config = model.config
        heads = config.num_attention_heads
        dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.shape = (config.num_hidden_layers, 2, slots, config.num_key_value_heads, dim)
        self.dtype, self.device = dtype, device
        self.kv = self._allocate(capacity)

    def _allocate(self, capacity: int) -> torch.Tensor:
        layers, pair, slots, heads, dim = self.shape
        return torch.zeros(layers, pair, slots, heads, capacity + 1, dim, dtype=self.dtype, device=self.device)

    @property
    def capacity(self) -> int:
        return self.kv.shape[4] - 1

    @property
    def bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's keys and values, `[slots, kv_heads, capacity + 1, head_dim]` each."""
        return self.kv[index, 0], self.kv[index, 1]

    def grow(self, capacity: int) -> None:
        """Hold `capacity` columns a slot, keeping what the slots hold (new buffers: graphs over the old ones go)."""
        grown = self._allocate(capacity)
        grown[..., : self.capacity, :] = self.kv[..., : self.capacity, :]
        self.kv = grown

    def admit(self, batch: Batch, first: int) -> None:
        """Copy a prefilled batch's rows (`kv_cache.Batch`: left-padded, no prefix held once) into the slots from
        `first` on, each real column at the column of its position; padding goes to the last column."""
        real = batch.mask.bool()
        columns = torch.where(real, batch.mask.cumsum(-1) - 1, self.capacity)
        slots = torch.arange(first, first + real.shape[0], device=self.device)[:, None]
        for index, layer in enumerate(batch.cache.layers):
            keys, values = self.layer(index)
            keys[slots, :, columns] = layer.keys.transpose(1, 2)
            values[slots, :, columns] = layer.values.transpose(1, 2)

    def move(self, targets: list[int], sources: list[int]) -> None:
        """Copy the sources' slots over the targets' (finished rows' places taken by the last rows)."""
        if targets:
            into = torch.tensor(targets, device=self.device)
            self.kv.index_copy_(2, into, self.kv.index_select(2, torch.tensor(sources, device=self.device)))

    def row(self, slot: int, length: int) -> LayerKV:
        """A slot's first `length` columns, per layer `(1, kv_heads, length, head_dim)` (copies: the slot is reused)."""
        kept = self.kv[:, :, slot : slot + 1, :, :length].clone()
        return [(kept[index, 0], kept[index, 1]) for index in range(kept.shape[0])]


@dataclass
class SlotBatch:
    """The rows being generated, row `i` in slot `i` of the engine's `SlotCache`, and what the next step feeds."""

    rows: list[Any]
    positions: torch.Tensor  # (rows,), on the device: position of the next token, the column it is written at
    last: torch.Tensor  # (rows,), on the device: the token to feed next
    lengths: list[int] = field(default_factory=list)  # the positions again, on the host (columns without a wait)

    @property
    def live(self) -> int:
        return sum(row.finish_reason is None for row in self.rows)


class StaticDecoding:
    """Decode steps over a `SlotCache` of `slots` rows: replayed CUDA graphs on a GPU (`graphs.StepGraphs`), the
    same step run directly on a CPU (tests, and `Engine(decode="static")`)."""

    def __init__(self, model: Any, slots: int, max_len: int, device: torch.device, graphs: bool) -> None:
        dtype = next(model.parameters()).dtype
        self.max_len = max_len
        self.cache = SlotCache(model, slots, min(FIRST_CAPACITY, max_len), dtype, device)
        self.graphs = None
        if graphs:
            from agentgrad.engine.graphs import StepGraphs

            self.graphs = StepGraphs(slots, device)

    def join(self, running: SlotBatch | None, added: Batch) -> SlotBatch:
        """The running rows and a prefilled batch's, its keys and values copied into the slots after the others."""
        first = len(running.rows) if running is not None else 0
        lengths = added.positions.tolist()
        self._room(max(lengths) + 1)
        self.cache.admit(added, first)
        joined = SlotBatch(added.rows, added.positions, added.last, lengths)
        if running is None:
            return joined
        return SlotBatch(
            running.rows + joined.rows,
            torch.cat([running.positions, joined.positions]),
            torch.cat([running.last, joined.last]),
            running.lengths + joined.lengths,
        )

    def drop_finished(self, batch: SlotBatch) -> SlotBatch:
        """The batch without its finished rows: the last unfinished rows move into the slots of finished ones."""
        rows = batch.rows
        count = batch.live
        holes = [i for i in range(count) if rows[i].finish_reason is not None]
        movers = [i for i in range(count, len(rows)) if rows[i].finish_reason is None]
        self.cache.move(holes, movers)
        order = list(range(count))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        index = torch.tensor(order, dtype=torch.long, device=batch.positions.device)
        return SlotBatch(
            [rows[i] for i in order], batch.positions[index], batch.last[index], [batch.lengths[i] for i in order]
        )

    def logits(self, decoder: LeanDecoder, batch: SlotBatch) -> torch.Tensor:
        """Next-token logits `[rows, vocab]` for every row, its last token's keys and values written in its slot;
        the positions move one on."""
        columns = max(batch.lengths) + 1
        self._room(columns)
        if self.graphs is not None:
            logits = self.graphs.run(decoder, self.cache, batch.last, batch.positions, columns)
        else:
            logits = decoder.step_in_slots(batch.last, batch.positions, self.cache, columns)
        batch.positions = batch.positions + 1
        batch.lengths = [length + 1 for length in batch.lengths]
        return logits

    def row_kv(self, batch: SlotBatch, index: int, length: int) -> LayerKV:
        """The first `length` keys and values of a row (a finished one, for the prefix cache)."""
        return self.cache.row(index, length)

    def _room(self, columns: int) -> None:
        """Make the slots hold `columns` positions: doubled capacity, at most the model's length."""
        if columns <= self.cache.capacity:
            return
        capacity = self.cache.capacity
        while capacity < columns:
            capacity *= 2
        self.cache.grow(min(max(capacity, columns), self.max_len))
        if self.graphs is not None:
            self.graphs.clear()  # they read the old buffers
