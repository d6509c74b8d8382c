"""The running batch's KV cache: rows leave and join in place, laid out exactly as stacking them anew would be, and
the buffers a cache gives up are handed out again."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentgrad.engine.kv_cache import Batch, BufferPool, drop_finished, new_cache, restack

HEADS, DIM, LAYERS = 2, 4, 2


@dataclass(eq=False)
class Row:
    name: str
    finish_reason: str | None = None


def own_kv(length: int, seed: int) -> list[torch.Tensor]:
    """A row's own keys (and values: the same, negated) per layer, without padding."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, HEADS, length, DIM, generator=generator) for _ in range(LAYERS)]


def stacked(rows: list[tuple[Row, list[torch.Tensor]]], width: int) -> list[torch.Tensor]:
    """The rows' keys per layer right-aligned in `width` columns with zeros on their left: the layout to expect."""
    out = []
    for layer in range(LAYERS):
        padded = [
            torch.cat([kv[layer].new_zeros(1, HEADS, width - kv[layer].shape[2], DIM), kv[layer]], 2) for _, kv in rows
        ]
        out.append(torch.cat(padded))
    return out


def prefilled(rows: list[tuple[Row, list[torch.Tensor]]]) -> Batch:
    """A batch as a prefill leaves it: its own cache, rows left-padded to its width."""
    width = max(kv[0].shape[2] for _, kv in rows)
    cache = new_cache()
    for layer, keys in enumerate(stacked(rows, width)):
        cache.update(keys, -keys, layer)
    mask = torch.tensor([[0] * (width - kv[0].shape[2]) + [1] * kv[0].shape[2] for _, kv in rows])
    return Batch([row for row, _ in rows], cache, mask, mask.sum(-1), torch.zeros(len(rows), dtype=torch.long))


def assert_laid_out(batch: Batch, rows: list[tuple[Row, list[torch.Tensor]]]) -> None:
    assert [row.name for row in batch.rows] == [row.name for row, _ in rows]
    width = batch.mask.shape[1]
    assert width == max(kv[0].shape[2] for _, kv in rows)  # no column that is padding in every row
    for layer, expected in zip(batch.cache.layers, stacked(rows, width)):
        assert torch.equal(layer.keys, expected) and torch.equal(layer.values, -expected)
    lengths = [kv[0].shape[2] for _, kv in rows]
    assert batch.mask.tolist() == [[0] * (width - n) + [1] * n for n in lengths]


def buffer_of(batch: Batch) -> int:
    return batch.cache.layers[0]._base[0].data_ptr()


def test_rows_leave_and_join_in_place_with_the_layout_of_a_fresh_stack() -> None:
    a, b, c, d, e, f = (Row(name) for name in "abcdef")
    lengths = {a: 5, b: 3, c: 4, d: 6, e: 2, f: 9}
    kv = {row.name: own_kv(length, seed) for seed, (row, length) in enumerate(lengths.items())}

    def rows(*chosen: Row) -> list[tuple[Row, list[torch.Tensor]]]:
        return [(row, kv[row.name]) for row in chosen]

    with torch.inference_mode():
        # a prefill's cache has no room to spare: the first join stacks anew, with room for 8 rows
        running = restack(prefilled(rows(a, b, c)), prefilled(rows(d)), capacity=8)
        assert_laid_out(running, rows(a, b, c, d))
        buffer = buffer_of(running)

        # b finished: the last row (d) moves into its place, then e joins, in the same buffer
        b.finish_reason = "stop"
        running = restack(running, prefilled(rows(e)), capacity=8)
        assert_laid_out(running, rows(a, d, c, e))
        assert buffer_of(running) == buffer

        # a longer row widens the batch to the left, in place: the others get zeros in the columns they gain
        running = restack(running, prefilled(rows(f)), capacity=8)
        assert_laid_out(running, rows(a, d, c, e, f))
        assert buffer_of(running) == buffer

        # a decode step appends a token to every row
        for layer, cache_layer in enumerate(running.cache.layers):
            token = torch.full((5, HEADS, 1, DIM), float(layer + 7))
            cache_layer.update(token, -token)
            for row in (a, d, c, e, f):
                kv[row.name][layer] = torch.cat([kv[row.name][layer], token[:1]], 2)
        running.mask = torch.cat([running.mask, torch.ones_like(running.mask[:, :1])], 1)
        assert_laid_out(running, rows(a, d, c, e, f))

        # all but d finished: the columns only the others used go too
        for row in (a, c, e, f):
            row.finish_reason = "stop"
        running = drop_finished(running)
        assert_laid_out(running, rows(d))

        # more rows than the room: stacked anew
        g = [Row(f"g{i}") for i in range(8)]
        kv.update({row.name: own_kv(2, 10 + i) for i, row in enumerate(g)})
        running = restack(running, prefilled(rows(*g)), capacity=8)
        assert_laid_out(running, rows(d, *g))
        assert buffer_of(running) != buffer


def test_a_retired_buffer_is_handed_out_again_in_inference_mode_only() -> None:
    pool = BufferPool(max_bytes=5_000, min_bytes=100)
    like = torch.zeros(1, dtype=torch.bfloat16)
    with torch.inference_mode():
        first, second, third = (torch.empty(1000, dtype=torch.bfloat16) for _ in range(3))  # 2,000 bytes each
        pool.give(first)
        view, owner = pool.empty((10, 50), like)
        assert owner is first and view.data_ptr() == first.data_ptr() and view.shape == (10, 50)
        pool.give(first)
        assert pool.empty((10, 20), like)[1] is not first  # it would waste more than three quarters of it
        assert pool.empty((10, 50), torch.zeros(1))[1] is not first  # another dtype
        pool.give(second)
        pool.give(third)  # 6,000 bytes: the oldest (first) goes
        handed = [pool.empty((1000,), like)[1] for _ in range(3)]
        assert not any(h is first for h in handed)
        assert any(h is second for h in handed) and any(h is third for h in handed)
        pool.give(second)
    assert pool.empty((1000,), like)[1] is not second  # outside inference mode, fresh memory
    pool.give(torch.empty(1000, dtype=torch.bfloat16))  # not an inference tensor (autograd may hold it): not kept
    with torch.inference_mode():
        assert pool.empty((1000,), like)[1] is second
        assert pool.empty((1000,), like)[1] is not second
