"""The PostgreSQL store's layout: its versioned migrations, and how a database is brought up to date.

`MIGRATIONS[i]` takes a database from version i to i + 1; a new agentgrad appends to it, never edits
what is there, so any older database is migrated forward in order. `schema_version` holds the version
a database is at; it is created, read and advanced under an advisory lock, so several store servers
starting at once on one database migrate it once. JSON columns are text (read back exactly as written,
as SQLite's are); times are seconds since the epoch, as everywhere in the store.
"""

from __future__ import annotations

from typing import Any

from agentgrad.store.errors import StoreError
from agentgrad.store.sqlite_schema import ROLLOUT_COLUMNS

MIGRATIONS: tuple[str, ...] = (
    # 1: rollouts, attempts, spans, resources, workers, metrics, runs
    """
    CREATE TABLE rollouts (
        rollout_id TEXT PRIMARY KEY,
        seq BIGINT GENERATED ALWAYS AS IDENTITY,
        input TEXT NOT NULL,
        mode TEXT,
        resources_id TEXT,
        status TEXT NOT NULL,
        config TEXT NOT NULL,
        metadata TEXT NOT NULL,
        reward DOUBLE PRECISION,
        num_attempts INTEGER NOT NULL DEFAULT 0,
        latest_attempt_id TEXT,
        enqueue_time DOUBLE PRECISION NOT NULL,
        start_time DOUBLE PRECISION,
        end_time DOUBLE PRECISION,
        queue_position DOUBLE PRECISION NOT NULL,
        last_sequence_id BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX rollouts_waiting ON rollouts (queue_position, seq) WHERE status IN ('queuing', 'requeuing');
    CREATE INDEX rollouts_by_status ON rollouts (status, enqueue_time, seq);
    CREATE INDEX rollouts_by_time ON rollouts (enqueue_time, seq);
    CREATE TABLE attempts (
        attempt_id TEXT PRIMARY KEY,
        rollout_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        worker_id TEXT,
        status TEXT NOT NULL,
        start_time DOUBLE PRECISION NOT NULL,
        end_time DOUBLE PRECISION,
        last_heartbeat_time DOUBLE PRECISION NOT NULL,
        reward DOUBLE PRECISION,
        error TEXT,
        timeout_seconds DOUBLE PRECISION,
        unresponsive_seconds DOUBLE PRECISION
    );
    CREATE INDEX attempts_by_rollout ON attempts (rollout_id, sequence);
    CREATE INDEX attempts_running ON attempts (start_time) WHERE status = 'running';
    CREATE TABLE spans (
        rollout_key TEXT NOT NULL,
        sequence_id BIGINT NOT NULL,
        attempt_id TEXT,
        body TEXT NOT NULL,
        span_id TEXT,
        PRIMARY KEY (rollout_key, sequence_id)
    );
    CREATE UNIQUE INDEX spans_by_span_id ON spans (rollout_key, span_id) WHERE span_id IS NOT NULL;
    CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);
    INSERT INTO counters VALUES ('unattached_spans', 0), ('resources', 0);
    CREATE TABLE resources (version INTEGER PRIMARY KEY, resources_id TEXT NOT NULL UNIQUE, body TEXT NOT NULL);
    CREATE TABLE workers (worker_id TEXT PRIMARY KEY, body TEXT NOT NULL);
    CREATE TABLE metrics (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name TEXT NOT NULL,
        step BIGINT NOT NULL,
        value DOUBLE PRECISION NOT NULL,
        time DOUBLE PRECISION NOT NULL,
        run_id TEXT
    );
    CREATE INDEX metrics_by_name ON metrics (name, step);
    CREATE TABLE runs (run_id TEXT PRIMARY KEY, start_time DOUBLE PRECISION NOT NULL, body TEXT NOT NULL);
    """,
    # 2: the answers of writes by idempotency key, committed with the write, so that a client's retry (to
    # this server or another) after a lost answer gets the first answer back; ids grow with time
    """
    CREATE TABLE replies (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        key TEXT NOT NULL UNIQUE,
        time DOUBLE PRECISION NOT NULL,
        status INTEGER NOT NULL,
        body BYTEA NOT NULL
    );
    """,
    # 3: a rollout that finishes is announced on FINISHED_CHANNEL, its id the payload, when its transaction commits:
    # a store server waiting on it wakes whichever server finished it, without polling
    """
    CREATE FUNCTION announce_finished_rollout() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('agentgrad_finished', NEW.rollout_id);
        RETURN NULL;
    END $$;
    CREATE TRIGGER rollout_finished AFTER UPDATE OF status ON rollouts FOR EACH ROW
        WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
        EXECUTE FUNCTION announce_finished_rollout();
    """,
)
"""The schema, as the steps from an empty database: version `len(MIGRATIONS)` is this agentgrad's."""

VERSION = len(MIGRATIONS)

MIGRATE_COMMAND = "agentgrad store migrate --store {url}"
"""What brings a database up to date by hand (the store also does it when it opens one, unless told not to)."""

LOCK_KEYS = {"migrate": 0x61677261, "sweep": 0x61677273}
"""Advisory lock numbers (`pg_advisory_xact_lock(number, hashtext(current_schema()))`): one schema's
migrations, one schema's timeout sweep. Held by one session of the database at a time."""

FINISHED_CHANNEL = "agentgrad_finished"
"""The channel (`LISTEN`) on which the database announces each rollout that finishes, by its id (migration 3's
trigger, which spells it out: a migration's text never changes)."""

WAITING_SQL = "status IN ('queuing', 'requeuing')"
"""The waiting rollouts, spelt as the partial index `rollouts_waiting` is, so the planner uses it."""

ROLLOUT_WIDTH = len(ROLLOUT_COLUMNS.split(","))
"""How many columns `ROLLOUT_COLUMNS` names: where a rollout's ends in a joined row."""


def prefixed(table: str, columns: str) -> str:
    """`a, b` as `t.a, t.b`: columns of one table of a join."""
    return ", ".join(f"{table}.{column.strip()}" for column in columns.split(","))


def version_problem(found: int, migrate: bool, url: str) -> str | None:
    """Why a database at schema version `found` cannot be used as it is, or None when it can (or will be migrated)."""
    if found > VERSION:
        return (
            f"the database is at schema version {found}, newer than this agentgrad's ({VERSION}): a newer "
            "agentgrad wrote it; upgrade agentgrad here (pip install -U 'agentgrad[postgres]')"
        )
    if found < VERSION and not migrate:
        return (
            f"the database is at schema version {found}, older than this agentgrad's ({VERSION}); migrate it "
            f"with `{MIGRATE_COMMAND.format(url=url)}` (it keeps every row), then start again"
        )
    return None


async def migrate(conn: Any, migrate: bool, shown: str) -> tuple[int, int]:
    """Bring the database (the first schema on its search path) to `VERSION`, or raise `StoreError` saying why it
    cannot be; returns (the version found, the version now). A database without agentgrad's tables gets them."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))", LOCK_KEYS["migrate"])
        if not await conn.fetchval("SELECT to_regclass('schema_version') IS NOT NULL"):
            await conn.execute(
                "CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (0)"
            )
        found = await conn.fetchval("SELECT version FROM schema_version")
        if found == 0:
            migrate = True  # an empty database: nothing to keep, nothing to ask
        if problem := version_problem(found, migrate, shown):
            raise StoreError(f"cannot use the store {shown}: {problem}")
        for step in MIGRATIONS[found:]:
            await conn.execute(step)
        await conn.execute("UPDATE schema_version SET version = $1", VERSION)
    return found, max(found, VERSION)
