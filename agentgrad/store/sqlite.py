"""`SqliteStore`: the embedded default. One file, WAL journal, safe across threads and processes.

Every write is one `BEGIN IMMEDIATE` transaction, so a claim by `dequeue_rollout` is atomic
even when several processes share the file, and everything committed survives the writer
being killed. Statements run directly on the calling thread: they take microseconds, less
than a hop to a thread pool would.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentgrad.semconv import REWARD
from agentgrad.store.base import (
    HEALTH_CHECK_SECONDS,
    NotFoundError,
    Store,
    StoreError,
    as_requests,
    attempt_outcome,
    check_attempt_update,
    check_rollout_update,
    new_attempt_id,
    new_rollout_id,
)
from agentgrad.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    Metric,
    NamedResources,
    ResourcesSnapshot,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
    Worker,
    WorkerStatus,
    now,
)

BUSY_TIMEOUT_MS = 30_000
"""How long a writer waits for another process's transaction before giving up."""

CHECKPOINT_SECONDS = 0.5
"""How often a background thread copies the WAL into the database file. Checkpoints fsync; done by
the writer that crosses SQLite's threshold, they stall it (and a server's event loop) for tens of ms."""

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
    time REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS metrics_by_name ON metrics(name, step);
"""

UNATTACHED = ""
"""`rollout_key` of spans recorded outside any rollout."""

ROLLOUT_COLUMNS = (
    "rollout_id, input, mode, resources_id, status, config, metadata, reward, num_attempts, "
    "latest_attempt_id, enqueue_time, start_time, end_time"
)
ATTEMPT_COLUMNS = (
    "rollout_id, attempt_id, sequence, worker_id, status, start_time, end_time, last_heartbeat_time, reward, error"
)


def _rollout(row: sqlite3.Row) -> Rollout:
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


def _attempt(row: sqlite3.Row) -> Attempt:
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


def _checkpoint_until(path: Path, stop: threading.Event) -> None:
    """Move committed WAL frames into the database file every `CHECKPOINT_SECONDS`, never blocking writers."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        while not stop.wait(CHECKPOINT_SECONDS):
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:  # the file went away, or is busy: the writers' own checkpoints still run
                pass
    finally:
        conn.close()


class SqliteStore(Store):
    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute(f"PRAGMA wal_autocheckpoint = {CHECKPOINT_PAGES}")
        with self._write() as db:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            if "span_id" not in {row[1] for row in db.execute("PRAGMA table_info(spans)")}:
                db.execute("ALTER TABLE spans ADD COLUMN span_id TEXT")  # a file from before spans had ids here
            db.execute(
                "CREATE INDEX IF NOT EXISTS spans_by_span_id ON spans(rollout_key, span_id) WHERE span_id IS NOT NULL"
            )
        self._last_check = 0.0
        self._checkpoints = threading.Event()
        weakref.finalize(self, self._checkpoints.set)  # a store dropped without close() stops its thread too
        threading.Thread(
            target=_checkpoint_until, args=(self.path, self._checkpoints), name=f"checkpoint {self.path.name}", daemon=True
        ).start()

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, holding the file's write lock from its first statement."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    async def close(self) -> None:
        self._checkpoints.set()
        with self._lock:
            self._conn.close()

    # ------------------------------------------------------------------ rollouts and attempts

    def _insert_rollout(self, db: sqlite3.Connection, rollout: Rollout) -> None:
        db.execute(
            "INSERT INTO rollouts (rollout_id, input, mode, resources_id, status, config, metadata, "
            "enqueue_time, queue_position) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                rollout.rollout_id,
                json.dumps(rollout.input),
                rollout.mode,
                rollout.resources_id,
                rollout.status.value,
                rollout.config.model_dump_json(),
                json.dumps(rollout.metadata),
                rollout.enqueue_time,
                rollout.enqueue_time,
            ),
        )

    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest | dict[str, Any]]) -> list[Rollout]:
        created = [
            Rollout(rollout_id=new_rollout_id(), **request.model_dump(exclude={"config"}), config=request.config)
            for request in as_requests(requests)
        ]
        with self._write() as db:
            for rollout in created:
                self._insert_rollout(db, rollout)
        return created

    def _open_attempt(self, db: sqlite3.Connection, rollout: Rollout, worker_id: str | None) -> AttemptedRollout:
        attempt = Attempt(
            rollout_id=rollout.rollout_id,
            attempt_id=new_attempt_id(),
            sequence=rollout.num_attempts + 1,
            worker_id=worker_id,
        )
        rollout.status = RolloutStatus.RUNNING
        rollout.num_attempts = attempt.sequence
        rollout.latest_attempt_id = attempt.attempt_id
        rollout.start_time = rollout.start_time or attempt.start_time
        db.execute(
            "UPDATE rollouts SET status = 'running', num_attempts = ?, latest_attempt_id = ?, start_time = ? "
            "WHERE rollout_id = ?",
            (attempt.sequence, attempt.attempt_id, rollout.start_time, rollout.rollout_id),
        )
        db.execute(
            "INSERT INTO attempts (rollout_id, attempt_id, sequence, worker_id, status, start_time, "
            "last_heartbeat_time, timeout_seconds, unresponsive_seconds) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?)",
            (
                rollout.rollout_id,
                attempt.attempt_id,
                attempt.sequence,
                worker_id,
                attempt.start_time,
                attempt.last_heartbeat_time,
                rollout.config.timeout_seconds,
                rollout.config.unresponsive_seconds,
            ),
        )
        return AttemptedRollout(**rollout.__dict__, attempt=attempt)

    async def dequeue_rollout(self, worker_id: str | None = None) -> AttemptedRollout | None:
        await self.check_attempts()
        with self._lock:  # a cheap look first, so idle workers do not take the write lock
            if not self._conn.execute(
                "SELECT 1 FROM rollouts WHERE status IN ('queuing', 'requeuing') LIMIT 1"
            ).fetchone():
                return None
            with self._write() as db:
                row = db.execute(
                    f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE status IN ('queuing', 'requeuing') "
                    "ORDER BY queue_position LIMIT 1"
                ).fetchone()
                return None if row is None else self._open_attempt(db, _rollout(row), worker_id)

    async def start_rollout(
        self,
        input: Any,
        *,
        mode: str | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        worker_id: str | None = None,
    ) -> AttemptedRollout:
        rollout = Rollout(
            rollout_id=new_rollout_id(),
            input=input,
            mode=mode,
            resources_id=resources_id,
            config=config or RolloutConfig(),
            metadata=metadata or {},
        )
        with self._write() as db:
            self._insert_rollout(db, rollout)
            return self._open_attempt(db, rollout, worker_id)

    def _get_rollout(self, db: sqlite3.Connection, rollout_id: str) -> Rollout:
        row = db.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (rollout_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no rollout with id {rollout_id!r}")
        return _rollout(row)

    def _get_attempt(self, db: sqlite3.Connection, rollout_id: str, attempt_id: str) -> Attempt:
        row = db.execute(
            f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE attempt_id = ? AND rollout_id = ?", (attempt_id, rollout_id)
        ).fetchone()
        if row is None:
            self._get_rollout(db, rollout_id)
            raise NotFoundError(f"rollout {rollout_id!r} has no attempt {attempt_id!r}")
        return _attempt(row)

    async def get_rollout(self, rollout_id: str) -> Rollout:
        with self._lock:
            return self._get_rollout(self._conn, rollout_id)

    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus | str] | None = None,
        mode: str | None = None,
        rollout_ids: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            statuses = [RolloutStatus(s).value for s in status]
            where.append(f"status IN ({', '.join('?' * len(statuses))})")
            params += statuses
        if mode is not None:
            where.append("mode = ?")
            params.append(mode)
        if rollout_ids is not None:
            ids = list(dict.fromkeys(rollout_ids))
            if not ids:
                return []
            where.append("rollout_id IN (SELECT value FROM json_each(?))")
            params.append(json.dumps(ids))
        sql = f"SELECT {ROLLOUT_COLUMNS} FROM rollouts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY enqueue_time, rowid LIMIT ? OFFSET ?"
        params += [-1 if limit is None else limit, offset]
        return [_rollout(row) for row in self._read(sql, params)]

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE rollout_id = ? ORDER BY sequence", (rollout_id,)
            ).fetchall()
            if not rows:
                self._get_rollout(self._conn, rollout_id)
        return [_attempt(row) for row in rows]

    def _end_attempt(
        self, db: sqlite3.Connection, rollout: Rollout, attempt: Attempt, status: AttemptStatus, at: float
    ) -> bool:
        """Close the attempt and move its rollout on; True when the rollout finished."""
        attempt.status = status
        attempt.end_time = at
        db.execute(
            "UPDATE attempts SET status = ?, end_time = ? WHERE attempt_id = ?", (status.value, at, attempt.attempt_id)
        )
        if rollout.status is not RolloutStatus.RUNNING or rollout.latest_attempt_id != attempt.attempt_id:
            return False
        outcome = attempt_outcome(rollout, status)
        if outcome is RolloutStatus.REQUEUING:
            db.execute(
                "UPDATE rollouts SET status = 'requeuing', queue_position = ? WHERE rollout_id = ?",
                (at, rollout.rollout_id),
            )
            return False
        reward = attempt.reward if status is AttemptStatus.SUCCEEDED else None
        db.execute(
            "UPDATE rollouts SET status = ?, end_time = ?, reward = ? WHERE rollout_id = ?",
            (outcome.value, at, reward, rollout.rollout_id),
        )
        return True

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        *,
        status: AttemptStatus | str | None = None,
        reward: float | None = None,
        error: str | None = None,
    ) -> Attempt:
        status = None if status is None else AttemptStatus(status)
        finished = False
        with self._write() as db:
            rollout = self._get_rollout(db, rollout_id)
            attempt = self._get_attempt(db, rollout_id, attempt_id)
            check_attempt_update(rollout, attempt, status)
            if reward is not None or error is not None:
                attempt.reward = attempt.reward if reward is None else float(reward)
                attempt.error = attempt.error if error is None else error
                db.execute(
                    "UPDATE attempts SET reward = ?, error = ? WHERE attempt_id = ?",
                    (attempt.reward, attempt.error, attempt_id),
                )
            if status is not None:
                finished = self._end_attempt(db, rollout, attempt, status, now())
        if finished:
            self._notify_finished()
        return attempt

    async def update_rollout(
        self,
        rollout_id: str,
        *,
        status: RolloutStatus | str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        status = None if status is None else RolloutStatus(status)
        with self._write() as db:
            rollout = self._get_rollout(db, rollout_id)
            check_rollout_update(rollout, status)
            if metadata:
                rollout.metadata = {**rollout.metadata, **metadata}
                db.execute(
                    "UPDATE rollouts SET metadata = ? WHERE rollout_id = ?", (json.dumps(rollout.metadata), rollout_id)
                )
            if status is not None:
                rollout.status = status
                rollout.end_time = now()
                db.execute(
                    "UPDATE rollouts SET status = ?, end_time = ? WHERE rollout_id = ?",
                    (status.value, rollout.end_time, rollout_id),
                )
        if status is not None:
            self._notify_finished()
        return rollout

    async def check_attempts(self, force: bool = False) -> None:
        at = now()
        if not force and at - self._last_check < HEALTH_CHECK_SECONDS:
            return
        self._last_check = at
        expired = self._read(
            "SELECT rollout_id, attempt_id, (timeout_seconds IS NOT NULL AND start_time + timeout_seconds < ?) "
            "FROM attempts WHERE status = 'running' AND ("
            "(timeout_seconds IS NOT NULL AND start_time + timeout_seconds < ?) OR "
            "(unresponsive_seconds IS NOT NULL AND last_heartbeat_time + unresponsive_seconds < ?))",
            (at, at, at),
        )
        if not expired:
            return
        finished = False
        with self._write() as db:
            for rollout_id, attempt_id, timed_out in expired:
                attempt = self._get_attempt(db, rollout_id, attempt_id)
                if attempt.status is not AttemptStatus.RUNNING:
                    continue  # another process got there first
                status = AttemptStatus.TIMEOUT if timed_out else AttemptStatus.UNRESPONSIVE
                finished |= self._end_attempt(db, self._get_rollout(db, rollout_id), attempt, status, at)
        if finished:
            self._notify_finished()

    # ------------------------------------------------------------------ spans

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        if not spans:
            return []
        at = now()
        stored: list[Span] = list(spans)
        with self._write() as db:
            by_rollout: dict[str | None, list[int]] = {}
            for index, span in enumerate(spans):
                by_rollout.setdefault(span.rollout_id, []).append(index)
            for rollout_id, indices in by_rollout.items():
                if rollout_id is not None:
                    for attempt_id in {spans[i].attempt_id for i in indices}:
                        if attempt_id is None:
                            raise StoreError(f"a span names rollout {rollout_id!r} but no attempt_id")
                        updated = db.execute(
                            "UPDATE attempts SET last_heartbeat_time = ? WHERE attempt_id = ? AND rollout_id = ?",
                            (at, attempt_id, rollout_id),
                        ).rowcount
                        if not updated:
                            self._get_attempt(db, rollout_id, attempt_id)  # raises NotFoundError
                key = rollout_id or UNATTACHED
                known = self._stored_span_ids(db, key, [spans[i].span_id for i in indices if spans[i].span_id])
                fresh, repeats = [], []
                for i in indices:
                    span_id = spans[i].span_id
                    if span_id and span_id in known:
                        repeats.append(i)
                    else:
                        fresh.append(i)
                        if span_id:
                            known[span_id] = 0  # its sequence id comes below
                if fresh:
                    first = self._next_sequence_id(db, key)
                    rows = []
                    for offset, i in enumerate(fresh):
                        span = stored[i] = spans[i].model_copy(update={"sequence_id": first + offset})
                        if span.span_id:
                            known[span.span_id] = span.sequence_id
                        rows.append((key, span.sequence_id, span.attempt_id, span.model_dump_json(), span.span_id or None))
                        reward = span.attributes.get(REWARD)
                        if rollout_id is not None and isinstance(reward, (int, float)):
                            db.execute(
                                "UPDATE attempts SET reward = ? WHERE attempt_id = ? AND status = 'running'",
                                (float(reward), span.attempt_id),
                            )
                    db.executemany(
                        "INSERT INTO spans (rollout_key, sequence_id, attempt_id, body, span_id) VALUES (?, ?, ?, ?, ?)", rows
                    )
                for i in repeats:
                    stored[i] = spans[i].model_copy(update={"sequence_id": known[spans[i].span_id]})
        return stored

    def _stored_span_ids(self, db: sqlite3.Connection, key: str, span_ids: list[str]) -> dict[str, int]:
        """Sequence ids of the spans among `span_ids` that this rollout already holds."""
        if not span_ids:
            return {}
        rows = db.execute(
            "SELECT span_id, sequence_id FROM spans INDEXED BY spans_by_span_id "
            "WHERE rollout_key = ? AND span_id IN (SELECT value FROM json_each(?))",
            (key, json.dumps(span_ids)),
        )
        return dict(rows.fetchall())

    def _next_sequence_id(self, db: sqlite3.Connection, key: str) -> int:
        """The rollout's next span sequence id (read in the write transaction, so no one else takes it)."""
        return int(db.execute("SELECT COALESCE(MAX(sequence_id), 0) + 1 FROM spans WHERE rollout_key = ?", (key,)).fetchone()[0])

    async def query_spans(
        self, rollout_id: str | None, attempt_id: str | None = None, *, all_attempts: bool = False
    ) -> list[Span]:
        with self._lock:
            if rollout_id is None:
                rows = self._conn.execute(
                    "SELECT body FROM spans WHERE rollout_key = ? ORDER BY sequence_id", (UNATTACHED,)
                ).fetchall()
            else:
                if attempt_id is not None:
                    self._get_attempt(self._conn, rollout_id, attempt_id)
                elif not all_attempts:
                    attempt_id = self._get_rollout(self._conn, rollout_id).latest_attempt_id
                if all_attempts and attempt_id is None:
                    sql, params = "SELECT body FROM spans WHERE rollout_key = ?", (rollout_id,)
                else:
                    sql, params = "SELECT body FROM spans WHERE rollout_key = ? AND attempt_id = ?", (rollout_id, attempt_id)
                rows = self._conn.execute(sql + " ORDER BY sequence_id", params).fetchall()
        return [Span.model_validate_json(row[0]) for row in rows]

    # ------------------------------------------------------------------ resources

    async def add_resources(
        self, resources: NamedResources, metadata: dict[str, Any] | None = None
    ) -> ResourcesSnapshot:
        with self._write() as db:
            version = db.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM resources").fetchone()[0]
            snapshot = ResourcesSnapshot(
                resources_id=f"res-{version}", version=version, resources=resources, metadata=metadata or {}
            )
            db.execute(
                "INSERT INTO resources VALUES (?, ?, ?)", (version, snapshot.resources_id, snapshot.model_dump_json())
            )
        return snapshot

    async def update_resources(self, resources_id: str, metadata: dict[str, Any]) -> ResourcesSnapshot:
        with self._write() as db:
            snapshot = self._get_resources(db, resources_id)
            snapshot.metadata = {**snapshot.metadata, **metadata}
            db.execute("UPDATE resources SET body = ? WHERE resources_id = ?", (snapshot.model_dump_json(), resources_id))
        return snapshot

    def _get_resources(self, db: sqlite3.Connection, resources_id: str) -> ResourcesSnapshot:
        row = db.execute("SELECT body FROM resources WHERE resources_id = ?", (resources_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no resources with id {resources_id!r}")
        return ResourcesSnapshot.model_validate_json(row[0])

    async def get_resources(self, resources_id: str) -> ResourcesSnapshot:
        with self._lock:
            return self._get_resources(self._conn, resources_id)

    async def get_latest_resources(self) -> ResourcesSnapshot | None:
        rows = self._read("SELECT body FROM resources ORDER BY version DESC LIMIT 1")
        return ResourcesSnapshot.model_validate_json(rows[0][0]) if rows else None

    async def query_resources(self) -> list[ResourcesSnapshot]:
        return [ResourcesSnapshot.model_validate_json(row[0]) for row in self._read("SELECT body FROM resources ORDER BY version")]

    # ------------------------------------------------------------------ workers, metrics, stats

    async def heartbeat(
        self,
        worker_id: str,
        *,
        status: WorkerStatus | str | None = None,
        active_attempts: Sequence[tuple[str, str]] | None = None,
        info: dict[str, Any] | None = None,
    ) -> Worker:
        at = now()
        with self._write() as db:
            for rollout_id, attempt_id in active_attempts or ():
                updated = db.execute(
                    "UPDATE attempts SET last_heartbeat_time = ? WHERE attempt_id = ? AND rollout_id = ?",
                    (at, attempt_id, rollout_id),
                ).rowcount
                if not updated:
                    self._get_attempt(db, rollout_id, attempt_id)
            row = db.execute("SELECT body FROM workers WHERE worker_id = ?", (worker_id,)).fetchone()
            worker = Worker.model_validate_json(row[0]) if row else Worker(worker_id=worker_id)
            worker.last_heartbeat_time = at
            if status is not None:
                worker.status = WorkerStatus(status)
            if active_attempts is not None:
                worker.active_attempts = [attempt_id for _, attempt_id in active_attempts]
            if info:
                worker.info = {**worker.info, **info}
            db.execute("INSERT OR REPLACE INTO workers VALUES (?, ?)", (worker_id, worker.model_dump_json()))
        return worker

    async def query_workers(self) -> list[Worker]:
        return [Worker.model_validate_json(row[0]) for row in self._read("SELECT body FROM workers ORDER BY worker_id")]

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        with self._write() as db:
            db.executemany(
                "INSERT INTO metrics (name, step, value, time) VALUES (?, ?, ?, ?)",
                # SQLite turns a NaN into NULL; as text it reads back as NaN (a diverged loss is a figure too)
                [(m.name, m.step, m.value if m.value == m.value else "NaN", m.time) for m in metrics],
            )

    async def query_metrics(self, name: str | None = None, prefix: str | None = None) -> list[Metric]:
        where, params = [], []
        if name is not None:
            where.append("name = ?")
            params.append(name)
        if prefix is not None:
            where.append("substr(name, 1, ?) = ?")
            params += [len(prefix), prefix]
        sql = "SELECT name, step, value, time FROM metrics"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._read(sql + " ORDER BY step, time, id", params)
        return [Metric(name=r[0], step=r[1], value=r[2], time=r[3]) for r in rows]

    async def stats(self) -> StoreStats:
        with self._lock:
            rollouts = dict(self._conn.execute("SELECT status, COUNT(*) FROM rollouts GROUP BY status").fetchall())
            attempts = dict(self._conn.execute("SELECT status, COUNT(*) FROM attempts GROUP BY status").fetchall())
            spans = self._conn.execute("SELECT COUNT(*) FROM spans").fetchone()[0]
            workers = self._conn.execute("SELECT COUNT(*) FROM workers").fetchone()[0]
            resources = self._conn.execute("SELECT COUNT(*) FROM resources").fetchone()[0]
        return StoreStats(rollouts=rollouts, attempts=attempts, spans=spans, workers=workers, resources=resources)
