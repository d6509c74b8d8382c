"""A full disk is a clear error that no one retries: the SQLite store says so naming its file, the server
answers 507 and logs one line per incident, and the HTTP client fails at once with the server's message.

The disk fills up by SQLite's own page limit (`PRAGMA max_page_count`): SQLite then fails writes exactly as
on a full disk (SQLITE_FULL, "database or disk is full")."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import httpx
import pytest

from agentgrad.serving import ServerThread
from agentgrad.store import SqliteStore
from agentgrad.store.client import StoreClient
from agentgrad.store.errors import DiskFullError
from agentgrad.store.server import create_app
from agentgrad.types import AttemptedRollout, Span


def fill_up(store: SqliteStore) -> None:
    """Leave the store's file room for only a couple more pages, as a full disk would."""
    pages = store._transactions.conn.execute("PRAGMA page_count").fetchone()[0]
    store._transactions.conn.execute(f"PRAGMA max_page_count = {pages + 2}")


def big_span(started: AttemptedRollout, i: int) -> Span:
    return Span(rollout_id=started.rollout_id, attempt_id=started.attempt.attempt_id, name=f"big-{i}" + "x" * 5000)


async def test_a_full_disk_is_an_error_naming_the_store_logged_once_and_reads_still_work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteStore(tmp_path / "store.db")
    started = await store.start_rollout("t")
    fill_up(store)
    caplog.set_level(logging.WARNING)
    failures = []
    for i in range(6):
        try:
            await store.add_spans([big_span(started, i)])
        except DiskFullError as exc:
            failures.append(str(exc))
    assert len(failures) >= 4
    assert str(tmp_path / "store.db") in failures[0] and "is full" in failures[0]
    full = [r for r in caplog.records if "disk is full" in r.getMessage()]
    assert len(full) == 1 and full[0].exc_info is None  # one line for the incident, no traceback
    assert (await store.get_rollout(started.rollout_id)).status.value == "running"  # reads still work
    stored = await store.query_spans(started.rollout_id)
    assert len(stored) == 6 - len(failures)  # what was acknowledged is there, nothing else
    await store.close()


def test_a_full_disk_is_a_507_once_and_the_client_fails_at_once_with_its_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteStore(tmp_path / "store.db")
    started = asyncio.run(store.start_rollout("t"))
    fill_up(store)
    caplog.set_level(logging.WARNING)
    with ServerThread(create_app(store)) as server:
        url = f"{server.url}/api/spans"
        answers = []
        for i in range(6):
            answer = httpx.post(url, content=f'{{"spans": [{big_span(started, i).model_dump_json()}]}}',
                                headers={"content-type": "application/json", "idempotency-key": f"k{i}"})
            answers.append(answer)
        refused = [a for a in answers if a.status_code != 200]
        assert refused and all(a.status_code == 507 for a in refused), [a.text for a in answers]
        first = refused[0].json()
        assert first["error"] == "DiskFullError" and str(tmp_path / "store.db") in first["detail"]

        client = StoreClient(server.url)  # retries 5xx for 60 s by default: not this one
        began = time.monotonic()
        with pytest.raises(DiskFullError, match="is full"):
            asyncio.run(client.add_spans([big_span(started, 99)]))
        assert time.monotonic() - began < 5
    assert not [r for r in caplog.records if r.exc_info]  # no traceback per write
    assert len([r for r in caplog.records if "disk is full" in r.getMessage()]) == 1
