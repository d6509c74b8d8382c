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


def test_a_store_that_cannot_be_opened_says_which_path_and_why(tmp_path: Path) -> None:
    import pytest

    from agentgrad.store import StoreError

    folder = tmp_path / "runs"
    folder.mkdir()
    with pytest.raises(StoreError) as caught:  # SQLite alone says `unable to open database file`
        SqliteStore(folder)
    assert f"cannot open the store {folder}" in str(caught.value) and "is a folder" in str(caught.value)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    with pytest.raises(StoreError, match=f"cannot open the store {blocker / 'store.db'}"):
        SqliteStore(blocker / "store.db")


def test_a_store_in_a_read_only_folder_says_the_folder_is_read_only(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from agentgrad.store import StoreError

    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    if os.access(folder, os.W_OK):  # root writes anyway: let SQLite and the check see what a user would
        real_connect = sqlite3.connect
        monkeypatch.setattr(sqlite3, "connect", lambda path, *a, **k: real_connect(path, *a, **k) if str(path) != str(
            folder / "store.db") else (_ for _ in ()).throw(sqlite3.OperationalError("unable to open database file")))
        monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(folder))
    try:
        with pytest.raises(StoreError) as caught:
            SqliteStore(folder / "store.db")
    finally:
        folder.chmod(0o700)
    message = str(caught.value)
    assert str(folder / "store.db") in message and f"the folder {folder} is read-only" in message, message


def test_a_file_from_before_runs_were_recorded_opens_with_its_metrics_and_takes_runs(tmp_path: Path) -> None:
    from agentgrad.types import Metric, Run

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE metrics (id INTEGER PRIMARY KEY, name TEXT NOT NULL, step INTEGER NOT NULL, "
            "value REAL NOT NULL, time REAL NOT NULL)"
        )
        db.execute("INSERT INTO metrics (name, step, value, time) VALUES ('val/accuracy', 0, 0.25, 1.0)")
    store = SqliteStore(path)

    async def check() -> None:
        (old,) = await store.query_metrics("val/accuracy")
        assert (old.value, old.run_id) == (0.25, None)
        await store.put_run(Run(run_id="r1", name="new", algorithm="GRPO"))
        await store.add_metrics([Metric(name="val/accuracy", step=1, value=0.5, run_id="r1")])
        assert [m.value for m in await store.query_metrics(run_id="r1")] == [0.5]
        assert [r.name for r in await store.query_runs()] == ["new"]
        await store.close()

    asyncio.run(check())
