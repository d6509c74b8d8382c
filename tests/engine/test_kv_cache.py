"""The running batch's KV cache: rows leave and join in place, laid out exactly as stacking them anew would be, and
the buffers a cache gives up are handed out again."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentgrad.engine.kv_cache import (
    MIN_HELD_ONCE_PREFIX,
    Batch,
    BufferPool,
    SharedPrefix,
    drop_finished,
    hold_prefix_once,
    new_cache,
    restack,
    unshare_prefix,
)

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


def with_prefix_held_once(
    tokens: tuple[int, ...], prefix: list[torch.Tensor], rows: list[tuple[Row, list[torch.Tensor]]], version: int = 0
) -> Batch:
    """A batch as a prefill of prompts sharing `tokens` leaves it (the prefix, then each row's own columns
    left-padded), with the prefix then held once."""
    own = prefilled(rows)
    cache = new_cache()
    for layer, keys in enumerate(own.cache.layers):
        whole = torch.cat([prefix[layer].expand(len(rows), -1, -1, -1), keys.keys], 2)
        cache.update(whole, -whole, layer)
    mask = torch.cat([own.mask.new_ones(len(rows), len(tokens)), own.mask], 1)
    batch = Batch(own.rows, cache, mask, mask.sum(-1), own.last)
    hold_prefix_once(batch, SharedPrefix(tokens, [(keys, -keys) for keys in prefix], version))
    return batch


def assert_holds(batch: Batch, whole: dict[str, list[torch.Tensor]]) -> None:
    """Every row's keys and values, the held prefix's then its own real columns in order, are the row's whole
    sequence; padding columns are zeros (0 × garbage in attention could be NaN)."""
    for index, row in enumerate(batch.rows):
        real = batch.mask[index].bool()
        for layer, cache_layer in enumerate(batch.cache.layers):
            held = [batch.prefix.kv[layer]] if batch.prefix is not None else []
            keys = torch.cat([k for k, _ in held] + [cache_layer.keys[index : index + 1, :, real]], 2)
            values = torch.cat([v for _, v in held] + [cache_layer.values[index : index + 1, :, real]], 2)
            assert torch.equal(keys, whole[row.name][layer]) and torch.equal(values, -whole[row.name][layer])
            assert not cache_layer.keys[index, :, ~real].any() and not cache_layer.values[index, :, ~real].any()


def test_a_prefix_held_once_stays_held_as_far_as_joining_batches_share_it_and_no_row_changes() -> None:
    system = own_kv(MIN_HELD_ONCE_PREFIX + 6, 20)  # a system prompt, then a few tokens of each task
    task_one, task_two = own_kv(6, 21), own_kv(4, 22)
    one = tuple(range(MIN_HELD_ONCE_PREFIX + 6)) + (100, 101, 102, 103, 104, 105)
    two = tuple(range(MIN_HELD_ONCE_PREFIX + 6)) + (200, 201, 202, 203)
    a, b, c, d, e = (Row(name) for name in "abcde")
    own = {a: own_kv(5, 1), b: own_kv(3, 2), c: own_kv(4, 3), d: own_kv(2, 4), e: own_kv(7, 5)}
    first = [torch.cat([s, t], 2) for s, t in zip(system, task_one)]
    second = [torch.cat([s, t], 2) for s, t in zip(system, task_two)]
    whole = {row.name: [torch.cat([p, o], 2) for p, o in zip(first if row in (a, b) else second, own[row])]
             for row in (a, b, c, d)}
    whole["e"] = own[e]

    with torch.inference_mode():
        running = with_prefix_held_once(one, first, [(a, own[a]), (b, own[b])])
        assert running.prefix is not None and running.cache.layers[0].keys.shape[2] == 5  # the rows hold their own
        assert_holds(running, whole)

        # another task's rows join: the system prompt they share stays held once, each task's own tokens go into
        # its rows
        running = restack(running, with_prefix_held_once(two, second, [(c, own[c]), (d, own[d])]), capacity=8)
        assert running.prefix is not None and running.prefix.tokens == one[: MIN_HELD_ONCE_PREFIX + 6]
        assert_holds(running, whole)

        # a decode step appends a token to every row; a finished row leaves
        for layer, cache_layer in enumerate(running.cache.layers):
            token = torch.full((4, HEADS, 1, DIM), float(layer + 7))
            cache_layer.update(token, -token)
            for name in "abcd":
                whole[name][layer] = torch.cat([whole[name][layer], token[:1]], 2)
        running.mask = torch.cat([running.mask, torch.ones_like(running.mask[:, :1])], 1)
        a.finish_reason = "stop"
        running = drop_finished(running)
        del whole["a"]
        assert running.prefix is not None
        assert_holds(running, whole)

        # rows computed by other weights share nothing with these, whatever their tokens: all go back into the rows
        later = with_prefix_held_once(two, second, [(e, own[e])], version=1)
        whole["e"] = [torch.cat([p, o], 2) for p, o in zip(second, own[e])]
        running = restack(running, later, capacity=8)
        assert running.prefix is None
        assert_holds(running, whole)


def test_a_prefix_shorter_than_the_minimum_is_not_held_once_by_a_join() -> None:
    shared = MIN_HELD_ONCE_PREFIX - 1
    base = own_kv(shared + 2, 30)
    ones, twos = [k[:, :, : shared + 1] for k in base], [torch.cat([k[:, :, :shared], k[:, :, shared + 1 :]], 2) for k in base]
    a, b = Row("a"), Row("b")
    whole = {"a": [torch.cat([p, o], 2) for p, o in zip(ones, own_kv(2, 31))],
             "b": [torch.cat([p, o], 2) for p, o in zip(twos, own_kv(3, 32))]}
    with torch.inference_mode():
        running = with_prefix_held_once(tuple(range(shared + 1)), ones, [(a, own_kv(2, 31))])
        joining = with_prefix_held_once(tuple(range(shared)) + (999,), twos, [(b, own_kv(3, 32))])
        running = restack(running, joining, capacity=4)
        assert running.prefix is None
        assert_holds(running, whole)
        unshare_prefix(running, 0)  # nothing held: nothing to do
        assert_holds(running, whole)


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
