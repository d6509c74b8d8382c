"""Spans in the SQLite store: the statements that write and read them, run on a connection in the store's
transaction or under its lock (`sqlite.py`).

A write takes one statement per kind whatever the number of spans and rollouts (a coalesced batch over HTTP
holds one span of each of many rollouts): their attempts read, each rollout's next sequence id, the span ids
already stored, then the spans inserted and the attempts' heartbeats and rewards updated.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import agentgrad.store.transitions as t
from agentgrad.store.sqlite_schema import ATTEMPT_COLUMNS, UNATTACHED, attempt_of, select_attempt, select_rollout
from agentgrad.types import Attempt, Span


def write_spans(db: sqlite3.Connection, spans: Sequence[Span], at: float) -> list[Span]:
    """Store `spans` (checked: `transitions.check_spans`) received at `at`; returns them as stored, with their
    sequence ids (a span already stored under its span id: as it was stored)."""
    stored: list[Span] = list(spans)
    rows: list[tuple[Any, ...]] = []
    groups = t.by_rollout(spans)
    attempts = _select_attempts(
        db,
        [
            (spans[i].rollout_id, spans[i].attempt_id)  # type: ignore[misc]
            for rollout_id, indices in groups.items()
            if rollout_id is not None
            for i in indices
        ],
    )
    keys = [rollout_id or UNATTACHED for rollout_id in groups]
    next_ids = _next_sequence_ids(db, keys)
    known = _stored_span_ids(
        db,
        [(key, spans[i].span_id) for key, indices in zip(keys, groups.values()) for i in indices if spans[i].span_id],
    )
    for key, (rollout_id, indices) in zip(keys, groups.items()):
        written, fresh = t.sequence_spans([spans[i] for i in indices], next_ids[key], known.setdefault(key, {}))
        for i, span in zip(indices, written):
            stored[i] = span
        rows += [(key, s.sequence_id, s.attempt_id, s.model_dump_json(), s.span_id or None) for s in fresh]
        if rollout_id is not None:
            for span in fresh:
                t.record_span(attempts[span.attempt_id], span, at)  # type: ignore[index]
    db.executemany(
        "INSERT INTO spans (rollout_key, sequence_id, attempt_id, body, span_id) VALUES (?, ?, ?, ?, ?)", rows
    )
    db.executemany(
        "UPDATE attempts SET last_heartbeat_time = ?, reward = ? WHERE attempt_id = ?",
        [(a.last_heartbeat_time, a.reward, a.attempt_id) for a in attempts.values()],
    )
    return stored


def span_bodies(
    db: sqlite3.Connection, rollout_id: str | None, attempt_id: str | None, *, all_attempts: bool
) -> list[str]:
    """The stored JSON of the spans of `Store.query_spans`, in sequence order (the caller parses them once it has
    let go of the connection)."""
    params: tuple[str | None, ...]
    if rollout_id is None:
        sql, params = "SELECT body FROM spans WHERE rollout_key = ?", (UNATTACHED,)
    else:
        if attempt_id is not None:
            select_attempt(db, rollout_id, attempt_id)
        elif not all_attempts:
            attempt_id = select_rollout(db, rollout_id).latest_attempt_id
        if all_attempts and attempt_id is None:
            sql, params = "SELECT body FROM spans WHERE rollout_key = ?", (rollout_id,)
        else:
            sql, params = "SELECT body FROM spans WHERE rollout_key = ? AND attempt_id = ?", (rollout_id, attempt_id)
    return [row[0] for row in db.execute(sql + " ORDER BY sequence_id", params).fetchall()]


def span_bodies_of(db: sqlite3.Connection, wanted: list[str]) -> dict[str, list[str]]:
    """The stored JSON of the latest attempt's spans of each rollout (`Store.query_spans_of`), in two statements."""
    ids = json.dumps(wanted)
    known = db.execute(
        "SELECT rollout_id FROM rollouts WHERE rollout_id IN (SELECT value FROM json_each(?))", (ids,)
    ).fetchall()
    if len(known) < len(wanted):
        raise t.no_rollout(next(rid for rid in wanted if rid not in {row[0] for row in known}))
    rows = db.execute(
        "SELECT s.rollout_key, s.body FROM spans s JOIN rollouts r ON r.rollout_id = s.rollout_key "
        "AND s.attempt_id = r.latest_attempt_id WHERE s.rollout_key IN (SELECT value FROM json_each(?)) "
        "ORDER BY s.rollout_key, s.sequence_id",
        (ids,),
    ).fetchall()
    found: dict[str, list[str]] = {rid: [] for rid in wanted}
    for rollout_id, body in rows:
        found[rollout_id].append(body)
    return found


def _select_attempts(db: sqlite3.Connection, pairs: list[tuple[str, str]]) -> dict[str, Attempt]:
    """The attempts named by (rollout id, attempt id) pairs, by attempt id, in one statement; an unknown one
    raises what `select_attempt` says of it."""
    wanted = dict.fromkeys(pairs)
    if not wanted:
        return {}
    rows = db.execute(
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id IN (SELECT value FROM json_each(?))",
        (json.dumps([attempt_id for _, attempt_id in wanted]),),
    ).fetchall()
    found = {(row[0], row[1]): row for row in rows}
    for rollout_id, attempt_id in wanted:
        if (rollout_id, attempt_id) not in found:
            select_attempt(db, rollout_id, attempt_id)  # raises
    return {attempt_id: attempt_of(found[rollout_id, attempt_id]) for rollout_id, attempt_id in wanted}


def _next_sequence_ids(db: sqlite3.Connection, keys: list[str]) -> dict[str, int]:
    """Each rollout's next span sequence id (read in the write transaction, so no one else takes it); the subquery
    per key is answered from the end of the `spans_in_order` index, however many spans it has."""
    rows = db.execute(
        "SELECT value, (SELECT COALESCE(MAX(sequence_id), 0) + 1 FROM spans WHERE rollout_key = value) "
        "FROM json_each(?)",
        (json.dumps(keys),),
    )
    return dict(rows.fetchall())


def _stored_span_ids(db: sqlite3.Connection, pairs: list[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """Of the (rollout key, span id) pairs, those already stored: rollout key → span id → sequence id."""
    if not pairs:
        return {}
    rows = db.execute(
        "SELECT s.rollout_key, s.span_id, s.sequence_id FROM json_each(?) AS j "
        "JOIN spans AS s INDEXED BY spans_by_span_id "
        "ON s.rollout_key = json_extract(j.value, '$[0]') AND s.span_id = json_extract(j.value, '$[1]')",
        (json.dumps(pairs),),
    )
    known: dict[str, dict[str, int]] = {}
    for key, span_id, sequence_id in rows.fetchall():
        known.setdefault(key, {})[span_id] = sequence_id
    return known
