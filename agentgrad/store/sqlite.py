"""`SqliteStore`: the embedded default. One file, WAL journal, safe across threads and processes.

Every write is one `BEGIN IMMEDIATE` transaction, so a claim by `dequeue_rollout` is atomic
even when several processes share the file, and everything committed survives the writer
being killed. Statements run directly on the calling thread: they take microseconds, less
than a hop to a thread pool would. The state machine is `transitions`; this module finds
rows, hands them to it as models and writes back what it changed. How its calls run (the
connection, its transactions, a full disk, `run_once`) is `sqlite_transactions`; the file's
schema is `sqlite_schema`, and the statements of spans are in `sqlite_spans`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import agentgrad.store.transitions as t
from agentgrad.store.errors import StoreError
from agentgrad.store.idempotency import Answer
from agentgrad.store.local import SWEEP_SECONDS, AttemptChange, LocalStore, RolloutChange, RolloutQuery, WorkerChange
from agentgrad.store.sqlite_schema import (
    ATTEMPT_COLUMNS,
    ROLLOUT_COLUMNS,
    attempt_of,
    migrate,
    rollout_changes,
    rollout_of,
    rollout_row,
    running_attempt_row,
    select_attempt,
    select_rollout,
)
from agentgrad.store.sqlite_spans import span_bodies, span_bodies_of, write_spans
from agentgrad.store.sqlite_transactions import Transactions, checkpoint_until, open_reason
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

WAITING_SQL = "status IN ('queuing', 'requeuing')"
"""The waiting rollouts, spelt exactly as the partial index `rollouts_waiting` is, so the planner uses it."""


class SqliteStore(LocalStore):
    """The store in the SQLite file at `path`, created (with its folder) if missing, brought up to date if older."""

    def __init__(
        self, path: str | Path, clock: Clock | None = None, *, sweep_seconds: float | None = SWEEP_SECONDS
    ) -> None:
        super().__init__(clock)
        self.path = Path(path)
        try:
            self._transactions = Transactions(self.path, self.clock)
            with self._transactions.write() as db:
                migrate(db)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(
                f"cannot open the store {self.path}: {exc}{open_reason(self.path)}; give a path where "
                "this user can create and write files (the store also writes <name>-wal and "
                "<name>-shm beside it)"
            ) from exc
        self._checkpoints = threading.Event()
        weakref.finalize(self, self._checkpoints.set)  # a store dropped without close() stops its thread too
        threading.Thread(
            target=checkpoint_until,
            args=(sqlite3.connect(self.path, isolation_level=None, check_same_thread=False), self._checkpoints),
            name=f"checkpoint {self.path.name}",
            daemon=True,
        ).start()
        self._start_sweeper(sweep_seconds)

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    async def close(self) -> None:
        await super().close()
        self._checkpoints.set()
        self._transactions.close()

    async def run_once(self, key: str, work: Callable[[], Awaitable[Answer]]) -> Answer:
        """The call and its answer commit in one transaction (`sqlite_transactions.py`)."""
        return await self._transactions.run_once(key, work)

    # ------------------------------------------------------------------ rollouts and attempts

    def _insert_rollout(self, db: sqlite3.Connection, rollout: Rollout) -> None:
        db.execute(
            "INSERT INTO rollouts (rollout_id, input, mode, resources_id, status, config, metadata, "
            "enqueue_time, queue_position) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*rollout_row(rollout), rollout.enqueue_time),
        )

    def _save_rollout(self, db: sqlite3.Connection, rollout: Rollout, before: RolloutStatus) -> bool:
        """Write back what a transition changed; a requeued rollout joins the back of the queue.
        True when the rollout has just finished."""
        db.execute(
            "UPDATE rollouts SET status = ?, metadata = ?, reward = ?, num_attempts = ?, latest_attempt_id = ?, "
            "start_time = ?, end_time = ?, queue_position = CASE WHEN ? THEN ? ELSE queue_position END "
            "WHERE rollout_id = ?",
            (
                *rollout_changes(rollout),
                rollout.status is RolloutStatus.REQUEUING and before is not RolloutStatus.REQUEUING,
                self.clock(),
                rollout.rollout_id,
            ),
        )
        return rollout.status is not before and rollout.status.finished

    def _save_attempt(self, db: sqlite3.Connection, attempt: Attempt) -> None:
        db.execute(
            "UPDATE attempts SET status = ?, end_time = ?, reward = ?, error = ? WHERE attempt_id = ?",
            (attempt.status.value, attempt.end_time, attempt.reward, attempt.error, attempt.attempt_id),
        )

    async def _queue_rollouts(self, rollouts: list[Rollout]) -> None:
        with self._transactions.write() as db:
            for rollout in rollouts:
                self._insert_rollout(db, rollout)

    def _open_attempt(self, db: sqlite3.Connection, rollout: Rollout, worker_id: str | None) -> AttemptedRollout:
        claimed = t.open_attempt(rollout, worker_id, self.clock())
        attempt = claimed.attempt
        db.execute(
            "UPDATE rollouts SET status = 'running', num_attempts = ?, latest_attempt_id = ?, start_time = ? "
            "WHERE rollout_id = ?",
            (attempt.sequence, attempt.attempt_id, rollout.start_time, rollout.rollout_id),
        )
        db.execute(
            "INSERT INTO attempts (rollout_id, attempt_id, sequence, worker_id, status, start_time, "
            "last_heartbeat_time, timeout_seconds, unresponsive_seconds) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?)",
            running_attempt_row(rollout, attempt, worker_id),
        )
        return claimed

    async def dequeue_rollout(self, worker_id: str | None = None) -> AttemptedRollout | None:
        await self.check_attempts()
        with self._transactions.reading() as db:  # a cheap look first, so idle workers do not take the write lock
            if not db.execute(f"SELECT 1 FROM rollouts WHERE {WAITING_SQL} LIMIT 1").fetchone():
                return None
            with self._transactions.write() as db:
                row = db.execute(
                    f"SELECT {ROLLOUT_COLUMNS} FROM rollouts INDEXED BY rollouts_waiting WHERE {WAITING_SQL} "
                    "ORDER BY queue_position LIMIT 1"
                ).fetchone()
                return None if row is None else self._open_attempt(db, rollout_of(row), worker_id)

    async def _start_rollout(self, rollout: Rollout, worker_id: str | None) -> AttemptedRollout:
        with self._transactions.write() as db:
            self._insert_rollout(db, rollout)
            return self._open_attempt(db, rollout, worker_id)

    async def get_rollout(self, rollout_id: str) -> Rollout:
        with self._transactions.reading() as db:
            return select_rollout(db, rollout_id)

    async def _query_rollouts(self, query: RolloutQuery) -> list[Rollout]:
        where: list[str] = []
        params: list[Any] = []
        if query.statuses is not None:
            where.append(f"status IN ({', '.join('?' * len(query.statuses))})")
            params += [status.value for status in query.statuses]
        if query.mode is not None:
            where.append("mode = ?")
            params.append(query.mode)
        if query.rollout_ids is not None:
            where.append("rollout_id IN (SELECT value FROM json_each(?))")
            params.append(json.dumps(query.rollout_ids))
        sql = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY enqueue_time, rowid LIMIT ? OFFSET ?"
        params += [-1 if query.limit is None else query.limit, query.offset]
        return [rollout_of(row) for row in self._transactions.read(sql, params)]

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        with self._transactions.reading() as db:
            rows = db.execute(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = ? ORDER BY sequence", (rollout_id,)
            ).fetchall()
            if not rows:
                select_rollout(db, rollout_id)
        return [attempt_of(row) for row in rows]

    async def _change_attempt(self, rollout_id: str, attempt_id: str, change: AttemptChange) -> Attempt:
        with self._transactions.write() as db:
            rollout = select_rollout(db, rollout_id)
            attempt = select_attempt(db, rollout_id, attempt_id)
            before = rollout.status
            change(rollout, attempt)
            self._save_attempt(db, attempt)
            finished = self._save_rollout(db, rollout, before)
        if finished:
            self._notify_finished([rollout_id])
        return attempt

    async def _change_rollout(self, rollout_id: str, change: RolloutChange) -> Rollout:
        with self._transactions.write() as db:
            rollout = select_rollout(db, rollout_id)
            before = rollout.status
            change(rollout)
            finished = self._save_rollout(db, rollout, before)
        if finished:
            self._notify_finished([rollout_id])
        return rollout

    async def _expire_attempts(self, at: float) -> None:
        candidates = self._transactions.read(  # what may have expired, found by index; `transitions.expiry` decides
            "SELECT rollout_id, attempt_id FROM attempts WHERE status = 'running' AND ("
            "(timeout_seconds IS NOT NULL AND start_time + timeout_seconds < ?) OR "
            "(unresponsive_seconds IS NOT NULL AND last_heartbeat_time + unresponsive_seconds < ?))",
            (at, at),
        )
        if not candidates:
            return
        finished = []
        with self._transactions.write() as db:
            for rollout_id, attempt_id in candidates:
                rollout = select_rollout(db, rollout_id)
                attempt = select_attempt(db, rollout_id, attempt_id)  # read again: another process may have won
                expired = t.expiry(rollout.config, attempt, at)
                if expired is not None:
                    t.end_attempt(rollout, attempt, expired, at)
                    self._save_attempt(db, attempt)
                    if self._save_rollout(db, rollout, RolloutStatus.RUNNING):
                        finished.append(rollout_id)
        if finished:
            self._notify_finished(finished)

    # ------------------------------------------------------------------ spans

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        if not spans:
            return []
        at = self.clock()
        t.check_spans(spans)
        with self._transactions.write() as db:
            return write_spans(db, spans, at)

    async def query_spans(
        self, rollout_id: str | None, attempt_id: str | None = None, *, all_attempts: bool = False
    ) -> list[Span]:
        with self._transactions.reading() as db:
            bodies = span_bodies(db, rollout_id, attempt_id, all_attempts=all_attempts)
        return [Span.model_validate_json(body) for body in bodies]

    async def query_spans_of(self, rollout_ids: Sequence[str]) -> dict[str, list[Span]]:
        wanted = list(dict.fromkeys(rollout_ids))
        with self._transactions.reading() as db:
            found = span_bodies_of(db, wanted)
        return {rid: [Span.model_validate_json(body) for body in bodies] for rid, bodies in found.items()}

    # ------------------------------------------------------------------ resources

    async def add_resources(
        self, resources: NamedResources, metadata: dict[str, Any] | None = None
    ) -> ResourcesSnapshot:
        with self._transactions.write() as db:
            version = db.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM resources").fetchone()[0]
            snapshot = t.new_snapshot(version, resources, metadata, self.clock())
            db.execute(
                "INSERT INTO resources VALUES (?, ?, ?)", (version, snapshot.resources_id, snapshot.model_dump_json())
            )
        return snapshot

    async def update_resources(self, resources_id: str, metadata: dict[str, Any]) -> ResourcesSnapshot:
        with self._transactions.write() as db:
            snapshot = self._get_resources(db, resources_id)
            snapshot.metadata = {**snapshot.metadata, **metadata}
            db.execute(
                "UPDATE resources SET body = ? WHERE resources_id = ?", (snapshot.model_dump_json(), resources_id)
            )
        return snapshot

    def _get_resources(self, db: sqlite3.Connection, resources_id: str) -> ResourcesSnapshot:
        row = db.execute("SELECT body FROM resources WHERE resources_id = ?", (resources_id,)).fetchone()
        if row is None:
            raise t.no_resources(resources_id)
        return ResourcesSnapshot.model_validate_json(row[0])

    async def get_resources(self, resources_id: str) -> ResourcesSnapshot:
        with self._transactions.reading() as db:
            return self._get_resources(db, resources_id)

    async def get_latest_resources(self) -> ResourcesSnapshot | None:
        rows = self._transactions.read("SELECT body FROM resources ORDER BY version DESC LIMIT 1")
        return ResourcesSnapshot.model_validate_json(rows[0][0]) if rows else None

    async def query_resources(self) -> list[ResourcesSnapshot]:
        return [
            ResourcesSnapshot.model_validate_json(row[0])
            for row in self._transactions.read("SELECT body FROM resources ORDER BY version")
        ]

    # ------------------------------------------------------------------ workers, metrics, stats

    async def _heartbeat(
        self, worker_id: str, change: WorkerChange, active_attempts: list[tuple[str, str]], at: float
    ) -> Worker:
        with self._transactions.write() as db:
            for rollout_id, attempt_id in active_attempts:
                updated = db.execute(
                    "UPDATE attempts SET last_heartbeat_time = ? WHERE attempt_id = ? AND rollout_id = ?",
                    (at, attempt_id, rollout_id),
                ).rowcount
                if not updated:
                    select_attempt(db, rollout_id, attempt_id)  # raises NotFoundError
            row = db.execute("SELECT body FROM workers WHERE worker_id = ?", (worker_id,)).fetchone()
            worker = change(Worker.model_validate_json(row[0]) if row else None)
            db.execute("INSERT OR REPLACE INTO workers VALUES (?, ?)", (worker_id, worker.model_dump_json()))
        return worker

    async def query_workers(self) -> list[Worker]:
        return [
            Worker.model_validate_json(row[0])
            for row in self._transactions.read("SELECT body FROM workers ORDER BY worker_id")
        ]

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        with self._transactions.write() as db:
            db.executemany(
                "INSERT INTO metrics (name, step, value, time, run_id) VALUES (?, ?, ?, ?, ?)",
                # SQLite turns a NaN into NULL; as text it reads back as NaN (a diverged loss is a figure too)
                [(m.name, m.step, m.value if m.value == m.value else "NaN", m.time, m.run_id) for m in metrics],
            )

    async def query_metrics(
        self, name: str | None = None, prefix: str | None = None, run_id: str | None = None
    ) -> list[Metric]:
        where: list[str] = []
        params: list[Any] = []
        if name is not None:
            where.append("name = ?")
            params.append(name)
        if prefix is not None:
            where.append("substr(name, 1, ?) = ?")
            params += [len(prefix), prefix]
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        sql = "SELECT name, step, value, time, run_id FROM metrics"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._transactions.read(sql + " ORDER BY step, time, id", params)
        return [Metric(name=r[0], step=r[1], value=r[2], time=r[3], run_id=r[4]) for r in rows]

    async def latest_metrics(self) -> list[Metric]:
        # SQLite takes the bare columns of a MAX() aggregate from the row holding the maximum
        rows = self._transactions.read("SELECT name, step, value, MAX(time), run_id FROM metrics GROUP BY name", ())
        return [Metric(name=r[0], step=r[1], value=r[2], time=r[3], run_id=r[4]) for r in rows]

    async def put_run(self, run: Run) -> Run:
        with self._transactions.write() as db:
            db.execute(
                "INSERT OR REPLACE INTO runs (run_id, start_time, body) VALUES (?, ?, ?)",
                (run.run_id, run.start_time, run.model_dump_json()),
            )
        return run.model_copy(deep=True)

    async def get_run(self, run_id: str) -> Run:
        rows = self._transactions.read("SELECT body FROM runs WHERE run_id = ?", (run_id,))
        if not rows:
            raise t.no_run(run_id)
        return Run.model_validate_json(rows[0][0])

    async def query_runs(self) -> list[Run]:
        return [
            Run.model_validate_json(row[0])
            for row in self._transactions.read("SELECT body FROM runs ORDER BY start_time")
        ]

    async def stats(self) -> StoreStats:
        with self._transactions.reading() as db:
            rollouts = dict(db.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status").fetchall())
            attempts = dict(db.execute("SELECT status, COUNT(*) FROM attempts GROUP BY status").fetchall())
            spans = db.execute("SELECT COUNT(*) FROM spans").fetchone()[0]
            workers = db.execute("SELECT COUNT(*) FROM workers").fetchone()[0]
            resources = db.execute("SELECT COUNT(*) FROM resources").fetchone()[0]
            requeues = db.execute(
                "SELECT COALESCE(SUM(num_attempts - 1 + (status = 'requeuing')), 0) FROM rollouts WHERE num_attempts > 0"
            ).fetchone()[0]
        return StoreStats(
            rollouts=rollouts,
            attempts=attempts,
            spans=spans,
            workers=workers,
            resources=resources,
            requeues=requeues,
        )
