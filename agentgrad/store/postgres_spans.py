"""Spans in the PostgreSQL store: the statements that write and read them, run on a connection in the
store's transaction (`postgres.py`).

A write takes a few statements whatever the number of spans and rollouts: their rollouts' rows locked, in id
order (each counts its spans' sequence ids), their attempts read, the spans inserted as one multi-row insert.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

import agentgrad.store.transitions as t
from agentgrad.store.postgres_schema import prefixed
from agentgrad.store.sqlite_schema import ATTEMPT_COLUMNS, UNATTACHED, attempt_of
from agentgrad.types import Attempt, Span


async def write_spans(db: asyncpg.Connection, spans: Sequence[Span], at: float) -> list[Span]:
    """Store `spans` (checked: `transitions.check_spans`) received at `at`; returns them as stored, with their
    sequence ids (a span already stored under its span id: as it was stored)."""
    groups = t.by_rollout(spans)
    keys = [rollout_id or UNATTACHED for rollout_id in groups]
    pairs = list(
        dict.fromkeys(
            (spans[i].rollout_id, spans[i].attempt_id)
            for rollout_id, indices in groups.items()
            if rollout_id is not None
            for i in indices
        )
    )
    span_ids = [span.span_id for span in spans if span.span_id and span.rollout_id is not None]
    next_ids, attempts, known = await _lock_for_spans(db, pairs, span_ids)  # type: ignore[arg-type]
    if None in groups:
        unattached = await db.fetchval("SELECT value FROM counters WHERE name = 'unattached_spans' FOR UPDATE")
        next_ids[UNATTACHED] = unattached + 1
        known |= await _stored_span_ids(db, [(UNATTACHED, spans[i].span_id) for i in groups[None]])
    stored: list[Span] = list(spans)
    rows: list[tuple[Any, ...]] = []
    last: dict[str, int] = {}
    for key, (rollout_id, indices) in zip(keys, groups.items()):
        written, fresh = t.sequence_spans([spans[i] for i in indices], next_ids[key], known.setdefault(key, {}))
        for i, span in zip(indices, written):
            stored[i] = span
        rows += [(key, s.sequence_id, s.attempt_id, s.model_dump_json(), s.span_id or None) for s in fresh]
        if fresh:
            last[key] = fresh[-1].sequence_id
        if rollout_id is not None:
            for span in fresh:
                t.record_span(attempts[span.attempt_id], span, at)  # type: ignore[index]
    columns = [list(column) for column in zip(*rows)] if rows else [[]] * 5
    await db.execute(
        "WITH s AS (INSERT INTO spans (rollout_key, sequence_id, attempt_id, body, span_id) "
        "SELECT * FROM unnest($7::text[], $8::bigint[], $9::text[], $10::text[], $11::text[])), "
        "a AS (UPDATE attempts SET last_heartbeat_time = v.beat, reward = v.reward "
        "FROM unnest($1::text[], $2::float8[], $3::float8[]) AS v(id, beat, reward) WHERE attempt_id = v.id), "
        "r AS (UPDATE rollouts SET last_sequence_id = v.last "
        "FROM unnest($4::text[], $5::bigint[]) AS v(id, last) WHERE rollout_id = v.id) "
        "UPDATE counters SET value = $6::bigint WHERE name = 'unattached_spans' AND $6::bigint IS NOT NULL",
        [a.attempt_id for a in attempts.values()],
        [a.last_heartbeat_time for a in attempts.values()],
        [a.reward for a in attempts.values()],
        [key for key in last if key != UNATTACHED],
        [value for key, value in last.items() if key != UNATTACHED],
        last.get(UNATTACHED),
        *columns,
    )
    return stored


async def _lock_for_spans(
    db: asyncpg.Connection, pairs: list[tuple[str, str]], span_ids: list[str]
) -> tuple[dict[str, int], dict[str, Attempt], dict[str, dict[str, int]]]:
    """Lock the rollouts of the (rollout id, attempt id) pairs, in id order, and read what writing spans to
    them needs, in one statement: each rollout's next span sequence id, the attempts by id, and which of
    `span_ids` each rollout has stored already (rollout id → span id → sequence id). An unknown rollout or
    attempt raises what the store's `_get_attempt` says of it.

    The stored span ids are read as of the statement's start: a twin of this write committed while this one
    waited for the lock is missed here, and its span ids then collide in `spans_by_span_id`, which runs
    this transaction again (`CONFLICTS`), when they are seen."""
    if not pairs:
        return {}, {}, {}
    rows = await db.fetch(
        f"SELECT r.rollout_id, r.last_sequence_id, {prefixed('a', ATTEMPT_COLUMNS)}, "
        "(SELECT array_agg(s.span_id || ' ' || s.sequence_id) FROM spans AS s "
        "WHERE s.rollout_key = r.rollout_id AND s.span_id = ANY($3::text[])) "
        "FROM rollouts AS r LEFT JOIN attempts AS a ON a.rollout_id = r.rollout_id AND a.attempt_id = ANY($2::text[]) "
        "WHERE r.rollout_id = ANY($1::text[]) ORDER BY r.rollout_id FOR UPDATE OF r",
        sorted({rollout_id for rollout_id, _ in pairs}),
        [attempt_id for _, attempt_id in pairs],
        span_ids,
    )
    next_ids = {row[0]: row[1] + 1 for row in rows}
    found = {(row[2], row[3]): row[2:-1] for row in rows if row[2] is not None}
    known: dict[str, dict[str, int]] = {}
    for row in rows:
        for entry in row[-1] or ():
            span_id, sequence_id = entry.split(" ")
            known.setdefault(row[0], {})[span_id] = int(sequence_id)
    for rollout_id, attempt_id in pairs:
        if rollout_id not in next_ids:
            raise t.no_rollout(rollout_id)
        if (rollout_id, attempt_id) not in found:
            raise t.no_attempt(rollout_id, attempt_id)
    attempts = {attempt_id: attempt_of(found[rollout_id, attempt_id]) for rollout_id, attempt_id in pairs}
    return next_ids, attempts, known


async def _stored_span_ids(db: asyncpg.Connection, pairs: list[tuple[str, str | None]]) -> dict[str, dict[str, int]]:
    """Of the (rollout key, span id) pairs, those already stored: rollout key → span id → sequence id."""
    pairs = [(key, span_id) for key, span_id in pairs if span_id]
    if not pairs:
        return {}
    rows = await db.fetch(
        "SELECT s.rollout_key, s.span_id, s.sequence_id FROM unnest($1::text[], $2::text[]) AS k(key, id) "
        "JOIN spans AS s ON s.rollout_key = k.key AND s.span_id = k.id",
        [key for key, _ in pairs],
        [span_id for _, span_id in pairs],
    )
    known: dict[str, dict[str, int]] = {}
    for key, span_id, sequence_id in rows:
        known.setdefault(key, {})[span_id] = sequence_id
    return known


async def span_rows(
    db: asyncpg.Connection, rollout_id: str | None, attempt_id: str | None, all_attempts: bool
) -> list[Any]:
    """The stored bodies of the spans `Store.query_spans` asks for, in order; none where the rollout or the
    attempt is unknown (the store tells which)."""
    if rollout_id is None:
        return list(await db.fetch("SELECT body FROM spans WHERE rollout_key = $1 ORDER BY sequence_id", UNATTACHED))
    if attempt_id is not None:
        rows = await db.fetch(
            "SELECT body FROM spans WHERE rollout_key = $1 AND attempt_id = $2 ORDER BY sequence_id",
            rollout_id,
            attempt_id,
        )
    elif all_attempts:
        rows = await db.fetch("SELECT body FROM spans WHERE rollout_key = $1 ORDER BY sequence_id", rollout_id)
    else:
        rows = await db.fetch(
            "SELECT s.body FROM rollouts AS r JOIN spans AS s ON s.rollout_key = r.rollout_id "
            "AND s.attempt_id = r.latest_attempt_id WHERE r.rollout_id = $1 ORDER BY s.sequence_id",
            rollout_id,
        )
    return list(rows)


async def latest_span_rows(db: asyncpg.Connection, rollout_ids: list[str]) -> list[Any]:
    """One statement for every rollout: (rollout id, span body) of each one's latest attempt's spans, joined on
    `latest_attempt_id` (a rollout without spans: one row, body None; an unknown one: none)."""
    return list(
        await db.fetch(
            "SELECT r.rollout_id, s.body FROM rollouts AS r LEFT JOIN spans AS s ON s.rollout_key = r.rollout_id "
            "AND s.attempt_id = r.latest_attempt_id WHERE r.rollout_id = ANY($1::text[]) "
            "ORDER BY r.rollout_id, s.sequence_id",
            rollout_ids,
        )
    )


def spans_by_rollout(rollout_ids: list[str], rows: list[Any]) -> dict[str, list[Span]]:
    """`latest_span_rows`' rows as each rollout's spans; `NotFoundError` for the first rollout it has no row of."""
    found: dict[str, list[Span]] = {rollout_id: [] for rollout_id in rollout_ids}
    for rollout_id, body in rows:
        if body is not None:
            found[rollout_id].append(Span.model_validate_json(body))
    known = {row[0] for row in rows}
    if missing := [rollout_id for rollout_id in rollout_ids if rollout_id not in known]:
        raise t.no_rollout(missing[0])
    return found
