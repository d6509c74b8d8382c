"""Decode steps captured as CUDA graphs: one per (rows, columns) bucket, captured when first needed, replayed.

An eager decode step on a GPU is ~25 small kernels a layer, each launched by Python: on the Qwen2.5-0.5B shape at
64 rows the engine's step took 129 ms of which the GPU computed a few (issue 41: ~1,250 launches a step, 72 % of the
CPU's time inside `cudaLaunchKernel`). Replayed as a graph, the launches cost the CPU one call. A graph fixes its
tensors' addresses and shapes, so the step runs over the static KV cache (`slots.SlotCache`), reads its tokens and
positions from buffers of its own, and is captured for a number of rows and of columns rounded up to a bucket:
rows beyond the batch's are padding (position 0, in slots no row uses), columns beyond a row's position are masked.
Graphs read the decoder's weights where they are (`LeanDecoder` on a GPU keeps no copies), so an update in place
or a publish needs no new capture; new slot buffers (more columns) or another model do.

Off a GPU, `StepGraphs` stands the step run again in for a graph's replay, so the buckets and the padding rows are
tested on a CPU (`tests/engine/test_static_decode.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

ROW_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
"""Row counts a graph is captured for (a batch runs in the smallest that holds it); past 256, multiples of 64."""
MIN_COLUMNS = 128
"""The fewest columns a graph attends over; more go in powers of two."""


def row_bucket(rows: int, slots: int) -> int:
    """The captured row count a batch of `rows` runs in (never more than the cache's slots)."""
    bucket = next((b for b in ROW_BUCKETS if b >= rows), -(-rows // 64) * 64)
    return min(bucket, slots)


def column_bucket(columns: int, capacity: int) -> int:
    """The captured column count for rows whose positions need `columns` (never more than the slots hold)."""
    bucket = MIN_COLUMNS
    while bucket < columns:
        bucket *= 2
    return min(bucket, capacity)


class StepGraphs:
    """`LeanDecoder.step_in_slots` captured per bucket, with the token and position buffers its graphs read."""

    def __init__(self, slots: int, device: torch.device) -> None:
        self.slots = slots
        self.tokens = torch.zeros(slots, dtype=torch.long, device=device)
        self.positions = torch.zeros(slots, dtype=torch.long, device=device)
        self.device = device
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self._graphs: dict[tuple[int, int], tuple[Callable[[], None], torch.Tensor]] = {}
        self.captures = 0

    def clear(self) -> None:
        """Drop every graph (the buffers they read are gone)."""
        self._graphs.clear()

    def run(
        self, decoder: Any, cache: Any, tokens: torch.Tensor, positions: torch.Tensor, columns: int
    ) -> torch.Tensor:
        """The step's logits `[rows, vocab]` (a view of the graph's output: read it before the next replay)."""
        rows = tokens.shape[0]
        bucket, width = row_bucket(rows, self.slots), column_bucket(columns, cache.capacity)
        self.tokens[:rows] = tokens
        self.positions[:rows] = positions
        if bucket > rows:  # padding rows: a real token at position 0 of slots no row uses
            self.tokens[rows:bucket] = 0
            self.positions[rows:bucket] = 0
        captured = self._graphs.get((bucket, width))
        if captured is None:
            captured = self._graphs[(bucket, width)] = self._capture(decoder, cache, bucket, width)
        replay, logits = captured
        replay()
        return logits[:rows]

    def _capture(self, decoder: Any, cache: Any, rows: int, columns: int) -> tuple[Callable[[], None], torch.Tensor]:
        """Warm the step up on a side stream (library handles, workspaces), then capture it; its replay and output.
        Both write the same keys and values the replay then writes again."""
        tokens, positions = self.tokens[:rows], self.positions[:rows]
        if self.device.type != "cuda":  # the step run again, into the same output: what a replay does
            logits = decoder.step_in_slots(tokens, positions, cache, columns)

            def again() -> None:
                logits.copy_(decoder.step_in_slots(tokens, positions, cache, columns))

            return again, logits
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                decoder.step_in_slots(tokens, positions, cache, columns)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            logits = decoder.step_in_slots(tokens, positions, cache, columns)
        self.captures += 1
        return graph.replay, logits
