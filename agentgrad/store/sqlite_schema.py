"""The SQLite file's layout: its tables and indexes, how an older file is brought up to date (`migrate`), and the
mapping between rows and models (a rollout or an attempt read by id)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import agentgrad.store.transitions as t
from agentgrad.types import Attempt, Rollout, RolloutConfig

BUSY_TIMEOUT_MS = 30_000
"""How long a writer waits for another process's transaction before giving up."""

CACHE_KIB = 64 * 1024
"""Page cache per connection (SQLite's default is 2 MiB): a 100k-rollout queue's indexes stay in memory,
so a dequeue costs the same at 100k queued as at 1k."""

CHECKPOINT_PAGES = 4000
"""WAL size (4 KiB pages) at which a writer checkpoints itself, should the background thread fall behind."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_id TEXT PRIMARY KEY,
    input TEXT NOT NULL,
    mode TEXT,
    resources_id TEXT,
    status TEXT NOT NULL,
    config TEXT NOT NULL,
    metadata TEXT NOT NULL,
    reward REAL,
    num_attempts INTEGER NOT NULL DEFAULT 0,
    latest_attempt_id TEXT,
    enqueue_time REAL NOT NULL,
    start_time REAL,
    end_time REAL,
    queue_position REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rollouts_waiting ON rollouts(queue_position) WHERE status IN ('queuing', 'requeuing');
CREATE INDEX IF NOT EXISTS rollouts_by_status ON rollouts(status, enqueue_time);
CREATE INDEX IF NOT EXISTS rollouts_by_time ON rollouts(enqueue_time);
CREATE TABLE IF NOT EXISTS attempts (
    attempt_id TEXT PRIMARY KEY,
    rollout_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    worker_id TEXT,
    status TEXT NOT NULL,
    start_time REAL NOT NULL,
    end_time REAL,
    last_heartbeat_time REAL NOT NULL,
    reward REAL,
    error TEXT,
    timeout_seconds REAL,
    unresponsive_seconds REAL
);
CREATE INDEX IF NOT EXISTS attempts_by_rollout ON attempts(rollout_id, sequence);
CREATE INDEX IF NOT EXISTS attempts_running ON attempts(start_time) WHERE status = 'running';
CREATE TABLE IF NOT EXISTS spans (
    rollout_key TEXT NOT NULL,
    sequence_id INTEGER NOT NULL,
    attempt_id TEXT,
    body TEXT NOT NULL,
    span_id TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS spans_in_order ON spans(rollout_key, sequence_id);
CREATE TABLE IF NOT EXISTS resources (
    version INTEGER PRIMARY KEY,
    resources_id TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS workers (worker_id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS metrics (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    step INTEGER NOT NULL,
    value REAL NOT NULL,
    time REAL NOT NULL,
    run_id TEXT
);
CREATE INDEX IF NOT EXISTS metrics_by_name ON metrics(name, step);
CREATE TABLE IF NOT EXISTS runs (run_id TEXT PRIMARY KEY, start_time REAL NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS replies (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    time REAL NOT NULL,
    status INTEGER NOT NULL,
    body BLOB NOT NULL
);
"""
"""`replies` holds the answer of each mutating HTTP call by its idempotency key, committed with the change;
ids grow with time, so old answers are pruned from the front without an index on time."""


def migrate(db: sqlite3.Connection) -> None:
    """Bring the file's schema up to date (in the caller's write transaction): a new file gets `SCHEMA`, a file
    from an earlier agentgrad the columns and indexes added since."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    if "run_id" not in {row[1] for row in db.execute("PRAGMA table_info(metrics)")}:
        db.execute("ALTER TABLE metrics ADD COLUMN run_id TEXT")  # a file from before runs were recorded
    if "span_id" not in {row[1] for row in db.execute("PRAGMA table_info(spans)")}:
        db.execute("ALTER TABLE spans ADD COLUMN span_id TEXT")  # a file from before spans had ids here
    db.execute("CREATE INDEX IF NOT EXISTS spans_by_span_id ON spans(rollout_key, span_id) WHERE span_id IS NOT NULL")


UNATTACHED = ""
"""`rollout_key` of spans recorded outside any rollout."""

ROLLOUT_COLUMNS = (
    "rollout_id, input, mode, resources_id, status, config, metadata, reward, num_attempts, "
    "latest_attempt_id, enqueue_time, start_time, end_time"
)
ATTEMPT_COLUMNS = (
    "rollout_id, attempt_id, sequence, worker_id, status, start_time, end_time, last_heartbeat_time, reward, error"
)


def rollout_of(row: Sequence[Any]) -> Rollout:
    """A rollout from its `ROLLOUT_COLUMNS` (a SQLite or a PostgreSQL row)."""
    return Rollout(
        rollout_id=row[0],
        input=json.loads(row[1]),
        mode=row[2],
        resources_id=row[3],
        status=row[4],
        config=RolloutConfig.model_validate_json(row[5]),
        metadata=json.loads(row[6]),
        reward=row[7],
        num_attempts=row[8],
        latest_attempt_id=row[9],
        enqueue_time=row[10],
        start_time=row[11],
        end_time=row[12],
    )


def attempt_of(row: Sequence[Any]) -> Attempt:
    """An attempt from its `ATTEMPT_COLUMNS` (a SQLite or a PostgreSQL row)."""
    return Attempt(
        rollout_id=row[0],
        attempt_id=row[1],
        sequence=row[2],
        worker_id=row[3],
        status=row[4],
        start_time=row[5],
        end_time=row[6],
        last_heartbeat_time=row[7],
        reward=row[8],
        error=row[9],
    )


def select_rollout(db: sqlite3.Connection, rollout_id: str) -> Rollout:
    row = db.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
    if row is None:
        raise t.no_rollout(rollout_id)
    return rollout_of(row)


def select_attempt(db: sqlite3.Connection, rollout_id: str, attempt_id: str) -> Attempt:
    """The attempt; an unknown one (or rollout) raises what the state machine says of it."""
    row = db.execute(
        f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = ? AND rollout_id = ?", (attempt_id, rollout_id)
    ).fetchone()
    if row is None:
        select_rollout(db, rollout_id)
        raise t.no_attempt(rollout_id, attempt_id)
    return attempt_of(row)


def rollout_row(rollout: Rollout) -> tuple[Any, ...]:
    """A new rollout's values, in the order both SQL stores insert them: rollout_id, input, mode, resources_id,
    status, config, metadata, enqueue_time."""
    return (
        rollout.rollout_id,
        json.dumps(rollout.input),
        rollout.mode,
        rollout.resources_id,
        rollout.status.value,
        rollout.config.model_dump_json(),
        json.dumps(rollout.metadata),
        rollout.enqueue_time,
    )


def rollout_changes(rollout: Rollout) -> tuple[Any, ...]:
    """What a transition may change in a rollout, in the order both SQL stores update it: status, metadata,
    reward, num_attempts, latest_attempt_id, start_time, end_time."""
    return (
        rollout.status.value,
        json.dumps(rollout.metadata),
        rollout.reward,
        rollout.num_attempts,
        rollout.latest_attempt_id,
        rollout.start_time,
        rollout.end_time,
    )


def running_attempt_row(rollout: Rollout, attempt: Attempt, worker_id: str | None) -> tuple[Any, ...]:
    """A just-opened attempt's values, in the order both SQL stores insert them (status 'running' is spelt in the
    statement): rollout_id, attempt_id, sequence, worker_id, start_time, last_heartbeat_time, timeout_seconds,
    unresponsive_seconds."""
    return (
        rollout.rollout_id,
        attempt.attempt_id,
        attempt.sequence,
        worker_id,
        attempt.start_time,
        attempt.last_heartbeat_time,
        rollout.config.timeout_seconds,
        rollout.config.unresponsive_seconds,
    )
