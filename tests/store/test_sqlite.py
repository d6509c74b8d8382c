"""What only a durable, shared file can promise: several processes, and surviving a kill."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from agentgrad.store import SqliteStore
from agentgrad.types import Metric, Span

CLAIM_AND_FINISH = textwrap.dedent(
    """
    import asyncio, json, sys
    from agentgrad.store import SqliteStore

    async def main(path, worker):
        store = SqliteStore(path)
        claimed = []
        while (item := await store.dequeue_rollout(worker_id=worker)) is not None:
            claimed.append(item.rollout_id)
            await store.update_attempt(item.rollout_id, item.attempt.attempt_id, status="succeeded")
        print(json.dumps(claimed))

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


def test_exactly_one_of_four_processes_claims_each_rollout(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    store = SqliteStore(path)
    asyncio.run(store.enqueue_rollouts([{"input": i} for i in range(400)]))
    workers = [
        subprocess.Popen([sys.executable, "-c", CLAIM_AND_FINISH, str(path), f"p{i}"], stdout=subprocess.PIPE, text=True)
        for i in range(4)
    ]
    claims = [json.loads(worker.communicate(timeout=120)[0]) for worker in workers]
    assert all(worker.returncode == 0 for worker in workers)
    everything = [rid for claimed in claims for rid in claimed]
    assert len(everything) == 400 and len(set(everything)) == 400
    assert asyncio.run(store.stats()).rollouts == {"succeeded": 400}


WRITE_UNTIL_KILLED = textwrap.dedent(
    """
    import asyncio, sys
    from agentgrad.store import SqliteStore
    from agentgrad.types import Metric, Span

    async def main(path):
        store = SqliteStore(path)
        i = 0
        while True:
            started = await store.start_rollout({"i": i})
            spans = [Span(rollout_id=started.rollout_id, attempt_id=started.attempt.attempt_id, name=f"s{j}",
                          attributes={"i": i, "j": j}) for j in range(3)]
            await store.add_spans(spans)
            await store.update_attempt(started.rollout_id, started.attempt.attempt_id, status="succeeded", reward=i)
            print(started.rollout_id, flush=True)
            i += 1

    asyncio.run(main(sys.argv[1]))
    """
)


def test_everything_committed_before_a_sigkill_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "killed.db"
    writer = subprocess.Popen([sys.executable, "-c", WRITE_UNTIL_KILLED, str(path)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    acknowledged = [writer.stdout.readline().strip() for _ in range(50)]
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=10)
    assert writer.returncode == -signal.SIGKILL

    async def read_back() -> None:
        store = SqliteStore(path)
        for i, rollout_id in enumerate(acknowledged):
            rollout = await store.get_rollout(rollout_id)
            assert rollout.status.value == "succeeded" and rollout.reward == i
            spans = await store.query_spans(rollout_id)
            assert [s.name for s in spans] == ["s0", "s1", "s2"] and spans[2].attributes == {"i": i, "j": 2}
        # the file is still a healthy store: it takes new work
        started = await store.start_rollout("after")
        await store.update_attempt(started.rollout_id, started.attempt.attempt_id, status="succeeded")
        await store.close()

    asyncio.run(read_back())


OLD_SPANS_TABLE = """
CREATE TABLE spans (
    rollout_key TEXT NOT NULL,
    sequence_id INTEGER NOT NULL,
    attempt_id TEXT,
    body TEXT NOT NULL,
    PRIMARY KEY (rollout_key, sequence_id)
) WITHOUT ROWID
"""


def test_a_file_from_before_span_ids_had_a_column_still_opens_and_keeps_counting(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(OLD_SPANS_TABLE)
    store = SqliteStore(path)
    started = asyncio.run(store.start_rollout("t"))
    old = Span(rollout_id=started.rollout_id, attempt_id=started.attempt.attempt_id, name="old", sequence_id=1)
    with sqlite3.connect(path) as db:  # a span written by the earlier code, without a span_id column
        db.execute("INSERT INTO spans (rollout_key, sequence_id, attempt_id, body) VALUES (?, 1, ?, ?)",
                   (started.rollout_id, started.attempt.attempt_id, old.model_dump_json()))
    store = SqliteStore(path)
    new = Span(rollout_id=started.rollout_id, attempt_id=started.attempt.attempt_id, name="new", span_id="a" * 16)
    assert [s.sequence_id for s in asyncio.run(store.add_spans([new, new]))] == [2, 2]
    assert [s.name for s in asyncio.run(store.query_spans(started.rollout_id))] == ["old", "new"]


def test_a_metric_that_is_not_a_number_is_kept_as_one(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")  # SQLite alone would turn NaN into NULL and refuse it
    asyncio.run(store.add_metrics([Metric(name="train/loss", step=0, value=float("nan")),
                                   Metric(name="train/loss", step=1, value=float("inf"))]))
    values = [m.value for m in asyncio.run(store.query_metrics("train/loss"))]
    assert math.isnan(values[0]) and values[1] == float("inf")
