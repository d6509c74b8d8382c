"""A training step's span reads: one query per rollout (before) against one query for the step (`query_spans_of`).

    .venv/bin/python benchmarks/span_queries.py [--rollouts 64] [--calls 3] [--tokens 300] [--repeats 5]

A step of GRPO reads the spans of every successful rollout (each model call's span carries its prompt and response
token ids and logprobs). This builds a step's worth of rollouts in a SQLite store, then times reading them
rollout by rollout (`query_spans`, what the loop did) and all at once, on the SQLite store itself and through a
store server over HTTP (runners on other processes or machines read the same way). Medians of `--repeats`,
alternating, with the load average beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from agentgrad import semconv as sc
from agentgrad.store import SqliteStore, Store
from agentgrad.store.client import StoreClient
from agentgrad.store.server import store_server
from agentgrad.types import Span


async def fill(store: Store, rollouts: int, calls: int, tokens: int) -> list[str]:
    """`rollouts` finished rollouts, each with `calls` model-call spans of `tokens` prompt and response tokens."""
    ids = []
    for _ in range(rollouts):
        started = await store.start_rollout({"question": "What is 123 + 456?"}, mode="train")
        rid, aid = started.rollout_id, started.attempt.attempt_id
        spans = [
            Span(
                rollout_id=rid,
                attempt_id=aid,
                name="chat",
                attributes={
                    sc.GEN_AI_OPERATION: sc.CHAT,
                    sc.PROMPT_TOKEN_IDS: list(range(tokens)),
                    sc.RESPONSE_TOKEN_IDS: list(range(tokens // 4)),
                    sc.RESPONSE_LOGPROBS: [-0.5] * (tokens // 4),
                },
            )
            for _ in range(calls)
        ]
        await store.add_spans(spans)
        await store.update_attempt(rid, aid, status="succeeded", reward=1.0)
        ids.append(rid)
    return ids


async def one_by_one(store: Store, ids: list[str]) -> float:
    began = time.perf_counter()
    for rid in ids:
        await store.query_spans(rid)
    return time.perf_counter() - began


async def at_once(store: Store, ids: list[str]) -> float:
    began = time.perf_counter()
    await store.query_spans_of(ids)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3, help="model calls per rollout")
    parser.add_argument("--tokens", type=int, default=300, help="prompt tokens per call (responses a quarter)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        store = SqliteStore(Path(folder) / "store.db")
        ids = asyncio.run(fill(store, args.rollouts, args.calls, args.tokens))
        with store_server(store) as server:
            client = StoreClient(server.url)
            for name, target in (("SQLite", store), ("HTTP", client)):
                before, after = [], []
                for _ in range(args.repeats):
                    before.append(asyncio.run(one_by_one(target, ids)))
                    after.append(asyncio.run(at_once(target, ids)))
                b, a = statistics.median(before), statistics.median(after)
                print(
                    f"{name:6s} {args.rollouts} rollouts x {args.calls} calls: one query per rollout {b * 1000:8.1f} ms, "
                    f"one query for the step {a * 1000:8.1f} ms ({b / a:.1f}x; load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
            asyncio.run(client.close())


if __name__ == "__main__":
    main()
