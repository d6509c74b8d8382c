"""`PostgresStore`: the store in a PostgreSQL database, shared by any number of store servers on any hosts.

Each operation is one transaction (concurrent writes share one, committed together), and the state machine is
`transitions`, as for SQLite: this module finds rows, locks them, hands them to it as models and writes back what
it changed. Servers sharing a database
agree through its locks and announcements alone:
- a dequeue takes the oldest waiting rollout `FOR UPDATE SKIP LOCKED`: each is claimed once, and claimers
  never wait on each other;
- a change to a rollout, its attempts or its spans first locks the rollout's row (several: in id order, so
  two transactions never wait on each other in a cycle); the row counts the rollout's span sequence ids;
- the timeout sweep runs under an advisory lock: one server at a time;
- a write with an idempotency key (`run_once`) commits its answer with its change, and a retry of one answered
  already gets that answer without running again (`postgres_transactions`);
- a rollout that finishes is announced by the database on commit (`FINISHED_CHANNEL`): waits on every server
  listen for it, and look again on their own only once a second.
A call that cannot reach the database retries for `retry_seconds` (a restart, a failover), then fails with
`StoreUnavailable` (HTTP 503): `postgres_transactions`; connections come from `postgres_pool`. The statements
that write and read spans and resources are in `postgres_spans` and `postgres_resources`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

import agentgrad.store.transitions as t
from agentgrad.redact import remember_secret
from agentgrad.store.base import WAIT_POLL_SECONDS
from agentgrad.store.errors import StoreError
from agentgrad.store.idempotency import Answer
from agentgrad.store.local import SWEEP_SECONDS, AttemptChange, LocalStore, RolloutChange, RolloutQuery, WorkerChange
from agentgrad.store.postgres_pool import (
    CONNECT_TIMEOUT_SECONDS,
    RETRY_SECONDS,
    Pools,
    connection_problem,
    parse_address,
    run_in_thread,
)
from agentgrad.store.postgres_resources import (
    add_snapshot,
    all_snapshots,
    get_snapshot,
    latest_snapshot,
    update_metadata,
)
from agentgrad.store.postgres_schema import FINISHED_CHANNEL, LOCK_KEYS, ROLLOUT_WIDTH, WAITING_SQL, migrate, prefixed
from agentgrad.store.postgres_spans import latest_span_rows, span_rows, spans_by_rollout, write_spans
from agentgrad.store.postgres_transactions import Transactions, in_transaction
from agentgrad.store.sqlite_schema import (
    ATTEMPT_COLUMNS,
    ROLLOUT_COLUMNS,
    attempt_of,
    rollout_changes,
    rollout_of,
    rollout_row,
    running_attempt_row,
)
from agentgrad.store.transitions import Clock
from agentgrad.types import (
    Attempt,
    AttemptedRollout,
    Metric,
    NamedResources,
    ResourcesSnapshot,
    Rollout,
    RolloutStatus,
    Run,
    Span,
    StoreStats,
    Worker,
)

log = logging.getLogger(__name__)

LISTENING_POLL_SECONDS = 1.0
"""How often a wait looks again on its own while the database's announcements wake it (a missed one costs this)."""

INSERT_ROLLOUT = (
    "INSERT INTO rollouts (rollout_id, input, mode, resources_id, status, config, metadata, enqueue_time, "
    "queue_position) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)"
)
INSERT_ROLLOUTS = (
    "INSERT INTO rollouts (rollout_id, input, mode, resources_id, status, config, metadata, enqueue_time, "
    "queue_position) SELECT v.i, v.n, v.m, v.r, v.s, v.c, v.d, v.t, v.t FROM unnest($1::text[], $2::text[], "
    "$3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::float8[]) WITH ORDINALITY AS v(i, n, m, r, s, c, d, t, o) "
    "ORDER BY v.o"
)


class PostgresStore(LocalStore):
    """The store in the PostgreSQL database at `url` (`postgresql://user:password@host:5432/dbname`).

    The URL may add `pool_size` (connections per event loop, 10), `pool_timeout` (seconds a call waits for
    one, 5), `write_lanes` (write transactions open at once per event loop, 2: more where the database is far)
    and `migrate=false` (refuse a database at an older schema version instead of migrating it; the
    `migrate` argument, when given, says instead);
    other parameters (`sslmode`, `search_path`, ...) go to the driver. Opening checks the address and brings
    the schema up to date, so a wrong one fails here, naming host, port and database (never the password).
    """

    def __init__(
        self,
        url: str,
        clock: Clock | None = None,
        *,
        sweep_seconds: float | None = SWEEP_SECONDS,
        retry_seconds: float = RETRY_SECONDS,
        migrate: bool | None = None,
    ) -> None:
        super().__init__(clock)
        self.address = parse_address(url)
        remember_secret(self.address.password)  # any log line or error that quotes it says [redacted]
        if migrate is not None:
            self.address = dataclasses.replace(self.address, migrate=migrate)
        self._pools = Pools(self.address)
        self._transactions = Transactions(self._pools, retry_seconds, self.clock)
        self.schema_found, self.schema_version = run_in_thread(self._setup())
        self._start_sweeper(sweep_seconds)

    def __repr__(self) -> str:
        return f"PostgresStore({self.address.shown!r})"

    async def _setup(self) -> tuple[int, int]:
        try:
            conn = await asyncpg.connect(self.address.dsn, timeout=CONNECT_TIMEOUT_SECONDS)
        except Exception as exc:  # asyncpg's errors for a bad address are of many kinds
            raise StoreError(connection_problem(self.address, exc)) from None
        try:
            return await migrate(conn, self.address.migrate, self.address.shown)
        finally:
            await conn.close()

    async def close(self) -> None:
        await super().close()
        await self._pools.close()

    async def run_once(self, key: str, work: Callable[[], Awaitable[Answer]]) -> Answer:
        """The call and its answer commit in one transaction (`Transactions.run_once`)."""
        return await self._transactions.run_once(key, work)

    # ------------------------------------------------------------------ rollouts and attempts

    async def _poll_seconds(self) -> float:
        """Waits wake on the database's announcement of each finished rollout (from any server of the database);
        they look again on their own only every `LISTENING_POLL_SECONDS`, or `WAIT_POLL_SECONDS` while this loop
        cannot listen."""
        listening = await self._pools.listen(FINISHED_CHANNEL, lambda rollout_id: self._notify_finished([rollout_id]))
        return LISTENING_POLL_SECONDS if listening else WAIT_POLL_SECONDS

    async def _queue_rollouts(self, rollouts: list[Rollout]) -> None:
        async def insert(db: asyncpg.Connection) -> None:  # one statement, the rows in order (their `seq`)
            await db.execute(INSERT_ROLLOUTS, *map(list, zip(*map(rollout_row, rollouts))))

        await self._transactions.write(insert)

    async def _open_attempt(self, db: asyncpg.Connection, rollout: Rollout, worker_id: str | None) -> AttemptedRollout:
        claimed = t.open_attempt(rollout, worker_id, self.clock())
        attempt = claimed.attempt
        await db.execute(
            "WITH r AS (UPDATE rollouts SET status = 'running', num_attempts = $3, latest_attempt_id = $2, "
            "start_time = $9 WHERE rollout_id = $1) "
            "INSERT INTO attempts (rollout_id, attempt_id, sequence, worker_id, status, start_time, "
            "last_heartbeat_time, timeout_seconds, unresponsive_seconds) VALUES ($1, $2, $3, $4, 'running', $5, $6, $7, $8)",
            *running_attempt_row(rollout, attempt, worker_id),
            rollout.start_time,
        )
        return claimed

    async def dequeue_rollout(self, worker_id: str | None = None) -> AttemptedRollout | None:
        await self.check_attempts()
        if not in_transaction() and not await self._transactions.read(
            lambda db: db.fetchval(f"SELECT 1 FROM rollouts WHERE {WAITING_SQL} LIMIT 1")
        ):
            return None  # a cheap look first: idle workers open no transaction

        async def claim(db: asyncpg.Connection) -> AttemptedRollout | None:
            row = await db.fetchrow(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE {WAITING_SQL} "
                "ORDER BY queue_position, seq LIMIT 1 FOR UPDATE SKIP LOCKED"
            )
            return None if row is None else await self._open_attempt(db, rollout_of(row), worker_id)

        return await self._transactions.write(claim)

    async def _start_rollout(self, rollout: Rollout, worker_id: str | None) -> AttemptedRollout:
        async def start(db: asyncpg.Connection) -> AttemptedRollout:
            await db.execute(INSERT_ROLLOUT, *rollout_row(rollout))
            return await self._open_attempt(db, rollout, worker_id)

        return await self._transactions.write(start)

    async def _get_rollout(self, db: asyncpg.Connection, rollout_id: str, lock: bool = False) -> Rollout:
        row = await db.fetchrow(
            f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = $1" + (" FOR UPDATE" if lock else ""),
            rollout_id,
        )
        if row is None:
            raise t.no_rollout(rollout_id)
        return rollout_of(row)

    async def _get_attempt(self, db: asyncpg.Connection, rollout_id: str, attempt_id: str) -> Attempt:
        row = await db.fetchrow(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = $1 AND rollout_id = $2", attempt_id, rollout_id
        )
        if row is None:
            await self._get_rollout(db, rollout_id)
            raise t.no_attempt(rollout_id, attempt_id)
        return attempt_of(row)

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return await self._transactions.read(lambda db: self._get_rollout(db, rollout_id))

    async def _query_rollouts(self, query: RolloutQuery) -> list[Rollout]:
        where: list[str] = []
        params: list[Any] = []
        if query.statuses is not None:
            params.append([status.value for status in query.statuses])
            where.append(f"status = ANY(${len(params)}::text[])")
        if query.mode is not None:
            params.append(query.mode)
            where.append(f"mode = ${len(params)}")
        if query.rollout_ids is not None:
            params.append(query.rollout_ids)
            where.append(f"rollout_id = ANY(${len(params)}::text[])")
        sql = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY enqueue_time, seq LIMIT ${len(params) + 1} OFFSET ${len(params) + 2}"
        rows = await self._transactions.read(lambda db: db.fetch(sql, *params, query.limit, query.offset))
        return [rollout_of(row) for row in rows]

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        async def read(db: asyncpg.Connection) -> list[Any]:
            rows = await db.fetch(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = $1 ORDER BY sequence", rollout_id
            )
            if not rows:
                await self._get_rollout(db, rollout_id)
            return list(rows)

        return [attempt_of(row) for row in await self._transactions.read(read)]

    async def _save_rollout(
        self, db: asyncpg.Connection, rollout: Rollout, before: RolloutStatus, attempt: Attempt | None = None
    ) -> None:
        """Write back what a transition changed to the rollout (and to `attempt`, in the same statement); a requeued
        rollout joins the back of the queue. One that finishes is announced by the database (`FINISHED_CHANNEL`)."""
        requeued = rollout.status is RolloutStatus.REQUEUING and before is not RolloutStatus.REQUEUING
        values = [
            *rollout_changes(rollout),
            requeued,
            self.clock(),
            rollout.rollout_id,
        ]
        sql = (
            "UPDATE rollouts SET status = $1, metadata = $2, reward = $3, num_attempts = $4, latest_attempt_id = $5, "
            "start_time = $6, end_time = $7, queue_position = CASE WHEN $8 THEN $9 ELSE queue_position END "
            "WHERE rollout_id = $10"
        )
        if attempt is not None:
            sql = (
                "WITH a AS (UPDATE attempts SET status = $11, end_time = $12, reward = $13, error = $14 "
                f"WHERE attempt_id = $15) {sql}"
            )
            values += [attempt.status.value, attempt.end_time, attempt.reward, attempt.error, attempt.attempt_id]
        await db.execute(sql, *values)

    async def _change_attempt(self, rollout_id: str, attempt_id: str, change: AttemptChange) -> Attempt:
        async def apply(db: asyncpg.Connection) -> Attempt:
            row = await db.fetchrow(  # the rollout, locked, and its attempt, in one statement
                f"SELECT {prefixed('r', ROLLOUT_COLUMNS)}, {prefixed('a', ATTEMPT_COLUMNS)} FROM rollouts AS r "
                "LEFT JOIN attempts AS a ON a.rollout_id = r.rollout_id AND a.attempt_id = $2 "
                "WHERE r.rollout_id = $1 FOR UPDATE OF r",
                rollout_id,
                attempt_id,
            )
            if row is None:
                raise t.no_rollout(rollout_id)
            if row[ROLLOUT_WIDTH + 1] is None:
                raise t.no_attempt(rollout_id, attempt_id)
            rollout, attempt = rollout_of(row[:ROLLOUT_WIDTH]), attempt_of(row[ROLLOUT_WIDTH:])
            before = rollout.status
            change(rollout, attempt)
            await self._save_rollout(db, rollout, before, attempt)
            return attempt

        return await self._transactions.write(apply)

    async def _change_rollout(self, rollout_id: str, change: RolloutChange) -> Rollout:
        async def apply(db: asyncpg.Connection) -> Rollout:
            rollout = await self._get_rollout(db, rollout_id, lock=True)
            before = rollout.status
            change(rollout)
            await self._save_rollout(db, rollout, before)
            return rollout

        return await self._transactions.write(apply)

    async def _expire_attempts(self, at: float) -> None:
        candidates = await self._transactions.read(
            lambda db: db.fetch(  # what may have expired, found by index; `transitions.expiry` decides
                "SELECT DISTINCT rollout_id FROM attempts WHERE status = 'running' AND ("
                "(timeout_seconds IS NOT NULL AND start_time + timeout_seconds < $1) OR "
                "(unresponsive_seconds IS NOT NULL AND last_heartbeat_time + unresponsive_seconds < $1))",
                at,
            )
        )
        if not candidates:
            return

        async def sweep(db: asyncpg.Connection) -> None:
            await db.execute("SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))", LOCK_KEYS["sweep"])
            rows = await db.fetch(  # read again under the locks: another server may have swept or moved them on
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ANY($1::text[]) AND status = 'running' "
                "ORDER BY rollout_id FOR UPDATE",
                sorted(row[0] for row in candidates),
            )
            for rollout in map(rollout_of, rows):
                assert rollout.latest_attempt_id is not None  # a running rollout has an attempt
                attempt = await self._get_attempt(db, rollout.rollout_id, rollout.latest_attempt_id)
                expired = t.expiry(rollout.config, attempt, at)
                if expired is not None:
                    t.end_attempt(rollout, attempt, expired, at)
                    await self._save_rollout(db, rollout, RolloutStatus.RUNNING, attempt)

        await self._transactions.write(sweep)

    # ------------------------------------------------------------------ spans (`postgres_spans.py`)

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """One transaction of a few statements whatever the number of spans and rollouts (`write_spans`)."""
        if not spans:
            return []
        at = self.clock()
        t.check_spans(spans)
        return await self._transactions.write(lambda db: write_spans(db, spans, at))

    async def query_spans(
        self, rollout_id: str | None, attempt_id: str | None = None, *, all_attempts: bool = False
    ) -> list[Span]:
        async def read(db: asyncpg.Connection) -> list[Any]:
            rows = await span_rows(db, rollout_id, attempt_id, all_attempts)
            if not rows and rollout_id is not None:  # nothing: because the rollout or the attempt is unknown?
                if attempt_id is not None:
                    await self._get_attempt(db, rollout_id, attempt_id)
                else:
                    await self._get_rollout(db, rollout_id)
            return rows

        return [Span.model_validate_json(row[0]) for row in await self._transactions.read(read)]

    async def query_spans_of(self, rollout_ids: Sequence[str]) -> dict[str, list[Span]]:
        """One statement for every rollout: each one's latest attempt's spans (`latest_span_rows`)."""
        wanted = list(dict.fromkeys(rollout_ids))
        if not wanted:
            return {}
        return spans_by_rollout(wanted, await self._transactions.read(lambda db: latest_span_rows(db, wanted)))

    # ------------------------------------------------------------------ resources (`postgres_resources.py`)

    async def add_resources(
        self, resources: NamedResources, metadata: dict[str, Any] | None = None
    ) -> ResourcesSnapshot:
        return await self._transactions.write(lambda db: add_snapshot(db, resources, metadata, self.clock))

    async def update_resources(self, resources_id: str, metadata: dict[str, Any]) -> ResourcesSnapshot:
        return await self._transactions.write(lambda db: update_metadata(db, resources_id, metadata))

    async def get_resources(self, resources_id: str) -> ResourcesSnapshot:
        return await self._transactions.read(lambda db: get_snapshot(db, resources_id))

    async def get_latest_resources(self) -> ResourcesSnapshot | None:
        return await self._transactions.read(latest_snapshot)

    async def query_resources(self) -> list[ResourcesSnapshot]:
        return await self._transactions.read(all_snapshots)

    # ------------------------------------------------------------------ workers, metrics, runs, stats

    async def _heartbeat(
        self, worker_id: str, change: WorkerChange, active_attempts: list[tuple[str, str]], at: float
    ) -> Worker:
        async def beat(db: asyncpg.Connection) -> Worker:
            if active_attempts:
                touched = await db.fetch(
                    "UPDATE attempts SET last_heartbeat_time = $1 FROM unnest($2::text[], $3::text[]) AS v(r, a) "
                    "WHERE attempt_id = v.a AND rollout_id = v.r RETURNING rollout_id, attempt_id",
                    at,
                    [rollout_id for rollout_id, _ in active_attempts],
                    [attempt_id for _, attempt_id in active_attempts],
                )
                alive = {(row[0], row[1]) for row in touched}
                for rollout_id, attempt_id in active_attempts:
                    if (rollout_id, attempt_id) not in alive:
                        await self._get_attempt(db, rollout_id, attempt_id)  # raises NotFoundError
            body = await db.fetchval("SELECT body FROM workers WHERE worker_id = $1 FOR UPDATE", worker_id)
            worker = change(None if body is None else Worker.model_validate_json(body))
            await db.execute(
                "INSERT INTO workers VALUES ($1, $2) ON CONFLICT (worker_id) DO UPDATE SET body = excluded.body",
                worker_id,
                worker.model_dump_json(),
            )
            return worker

        return await self._transactions.write(beat)

    async def query_workers(self) -> list[Worker]:
        rows = await self._transactions.read(lambda db: db.fetch("SELECT body FROM workers ORDER BY worker_id"))
        return [Worker.model_validate_json(row[0]) for row in rows]

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        if not metrics:
            return

        async def add(db: asyncpg.Connection) -> None:
            await db.executemany(
                "INSERT INTO metrics (name, step, value, time, run_id) VALUES ($1, $2, $3, $4, $5)",
                [(m.name, m.step, m.value, m.time, m.run_id) for m in metrics],
            )

        await self._transactions.write(add)

    async def query_metrics(
        self, name: str | None = None, prefix: str | None = None, run_id: str | None = None
    ) -> list[Metric]:
        where: list[str] = []
        params: list[Any] = []
        for value, condition in ((name, "name = ${}"), (prefix, "starts_with(name, ${})"), (run_id, "run_id = ${}")):
            if value is not None:
                params.append(value)
                where.append(condition.format(len(params)))
        sql = "SELECT name, step, value, time, run_id FROM metrics"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = await self._transactions.read(lambda db: db.fetch(sql + " ORDER BY step, time, id", *params))
        return [Metric(name=r[0], step=r[1], value=r[2], time=r[3], run_id=r[4]) for r in rows]

    async def latest_metrics(self) -> list[Metric]:
        """The newest point of each curve, in one statement (`DISTINCT ON` the name)."""
        rows = await self._transactions.read(
            lambda db: db.fetch(
                "SELECT DISTINCT ON (name) name, step, value, time, run_id FROM metrics ORDER BY name, time DESC, id DESC"
            )
        )
        return [Metric(name=r[0], step=r[1], value=r[2], time=r[3], run_id=r[4]) for r in rows]

    async def put_run(self, run: Run) -> Run:
        async def put(db: asyncpg.Connection) -> None:
            await db.execute(
                "INSERT INTO runs (run_id, start_time, body) VALUES ($1, $2, $3) ON CONFLICT (run_id) "
                "DO UPDATE SET start_time = excluded.start_time, body = excluded.body",
                run.run_id,
                run.start_time,
                run.model_dump_json(),
            )

        await self._transactions.write(put)
        return run.model_copy(deep=True)

    async def get_run(self, run_id: str) -> Run:
        body = await self._transactions.read(lambda db: db.fetchval("SELECT body FROM runs WHERE run_id = $1", run_id))
        if body is None:
            raise t.no_run(run_id)
        return Run.model_validate_json(body)

    async def query_runs(self) -> list[Run]:
        rows = await self._transactions.read(lambda db: db.fetch("SELECT body FROM runs ORDER BY start_time"))
        return [Run.model_validate_json(row[0]) for row in rows]

    async def stats(self) -> StoreStats:
        async def read(db: asyncpg.Connection) -> StoreStats:
            rollouts = await db.fetch("SELECT status, COUNT(*) FROM rollouts GROUP BY status")
            attempts = await db.fetch("SELECT status, COUNT(*) FROM attempts GROUP BY status")
            counts = await db.fetchrow(
                "SELECT (SELECT COUNT(*) FROM spans), (SELECT COUNT(*) FROM workers), (SELECT COUNT(*) FROM resources), "
                "(SELECT COALESCE(SUM(num_attempts - 1 + (status = 'requeuing')::int), 0) FROM rollouts "
                "WHERE num_attempts > 0)"
            )
            return StoreStats(
                rollouts=dict(map(tuple, rollouts)),
                attempts=dict(map(tuple, attempts)),
                spans=counts[0],
                workers=counts[1],
                resources=counts[2],
                requeues=counts[3],
            )

        return await self._transactions.read(read)
