"""Decode attention over a prefix every row shares: each row's own copy (SDPA) against the prefix held once.

    .venv/bin/python benchmarks/held_once_attention.py [--dtype float32] [--shared 261] [--own 16,76,150]
        [--rows 1,8,64] [--model smollm2]

One decode step's attention for 30 layers (SmolLM2: 9 query heads over 3 key/value heads of 64; `--model qwen`:
14 over 2, 24 layers), one query token a row, each row `shared` tokens of a common prefix then `own` columns of
its own with a third of them padding (masked). "whole rows": `attention.decode_attention` over every row's
copy of the prefix and its own columns, as a step runs without a held prefix; "grouped call": the same attention as
one `scaled_dot_product_attention(..., enable_gqa=True)` call, which `decode_attention` makes in fp32 only (in bf16
it was five times slower, issue 41; in fp32 the two columns time the same call, and differ by the run's noise);
"held once":
`attention.shared_prefix_attention`, the prefix read once for all rows, joined with each row's own columns by
their log-sum-exps (`kv_cache.SharedPrefix`). Every layer has caches of its own, so none stays in the
processor's cache; best of 5, ms a step; the largest difference between the two outputs beside it.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from agentgrad.engine.attention import decode_attention, shared_prefix_attention
from agentgrad.engine.threads import set_threads

SHAPES = {"smollm2": (9, 3, 30), "qwen": (14, 2, 24)}
"""Query heads, key/value heads, layers."""
DIM = 64


def best_of(runs: int, step: object) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        step()  # type: ignore[operator]
        times.append(time.perf_counter() - began)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--model", default="smollm2", choices=sorted(SHAPES))
    parser.add_argument("--shared", type=int, default=261, help="prefix tokens every row starts with")
    parser.add_argument("--own", default="16,76,150", help="each row's own columns, comma-separated cases")
    parser.add_argument("--rows", default="1,8,64")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    heads, kv_heads, layers = SHAPES[args.model]
    scale = DIM**-0.5
    print(f"{args.model} shapes, {args.dtype}, {args.threads} threads, {args.shared} shared tokens, {layers} layers")
    print(f"{'rows':>5} {'own':>5} {'grouped call ms':>16} {'whole rows ms':>14} {'held once ms':>13} {'ratio':>6} "
          f"{'max diff':>9}")  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    for rows in (int(r) for r in args.rows.split(",")):
        for own in (int(o) for o in args.own.split(",")):
            query = torch.randn(rows, heads, 1, DIM, generator=generator).to(dtype)
            prefix = [(torch.randn(1, kv_heads, args.shared, DIM, generator=generator).to(dtype),) * 2 for _ in range(layers)]
            mine = [torch.randn(rows, kv_heads, own, DIM, generator=generator).to(dtype) for _ in range(layers)]
            mask = torch.ones(rows, own, dtype=torch.bool)
            mask[1:, : own // 3] = False  # left padding in all rows but the longest
            whole = [torch.cat([p.expand(rows, -1, -1, -1), m], 2).contiguous() for (p, _), m in zip(prefix, mine)]
            whole_mask = torch.cat([torch.ones(rows, args.shared, dtype=torch.bool), mask], 1)[:, None, None, :]
            additive = torch.zeros(rows, 1, 1, own, dtype=dtype).masked_fill_(~mask[:, None, None, :], float("-inf"))

            def grouped_step() -> list[torch.Tensor]:
                return [
                    F.scaled_dot_product_attention(query, w, w, attn_mask=whole_mask, scale=scale, enable_gqa=True)
                    for w in whole
                ]

            def rows_step() -> list[torch.Tensor]:
                return [decode_attention(query, w, w, whole_mask, scale) for w in whole]

            def held_step() -> list[torch.Tensor]:
                return [
                    shared_prefix_attention(query, k, v, m, m, additive, scale) for (k, v), m in zip(prefix, mine)
                ]

            diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(rows_step(), held_step()))
            grouped, full, held = best_of(5, grouped_step), best_of(5, rows_step), best_of(5, held_step)
            print(f"{rows:>5} {own:>5} {grouped:>16.2f} {full:>14.2f} {held:>13.2f} {full / held:>5.2f}× {diff:>9.1e}")


if __name__ == "__main__":
    main()
