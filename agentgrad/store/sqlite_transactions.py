"""How the SQLite store's calls run: on one connection to the file, shared by the store's threads under a lock, each
write one `BEGIN IMMEDIATE` transaction (a savepoint inside another), and inside `run_once` part of its transaction,
which commits a call and its answer together; a thread of its own checkpoints the WAL (`checkpoint_until`).

A write that finds the disk full fails with `DiskFullError`, which names the file and is logged once per incident
(not once per write); reads still work meanwhile.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentgrad.store.errors import DiskFullError
from agentgrad.store.idempotency import REPLY_SECONDS, Answer, finish_now
from agentgrad.store.sqlite_schema import BUSY_TIMEOUT_MS, CACHE_KIB, CHECKPOINT_PAGES
from agentgrad.store.transitions import Clock

log = logging.getLogger(__name__)

SQLITE_FULL = 13
"""SQLite's result code for "database or disk is full"."""

CHECKPOINT_SECONDS = 0.5
"""How often a background thread copies the WAL into the database file. Checkpoints fsync; done by
the writer that crosses SQLite's threshold, they stall it (and a server's event loop) for tens of ms."""


class Transactions:
    """The store's connection to its file (`conn`, used under `lock`), and the transactions its calls run in."""

    def __init__(self, path: Path, clock: Clock) -> None:
        """Open (or create) the file at `path`; `open_reason` says why that failed where SQLite does not."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.clock = clock
        self.lock = threading.RLock()
        self._depth = 0  # nesting of `write` on the thread holding the lock
        self._full = False  # the last write found the disk full (logged once until a write succeeds)
        self._last_prune = 0.0
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        self.conn.execute(f"PRAGMA wal_autocheckpoint = {CHECKPOINT_PAGES}")

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, holding the file's write lock from its first statement. Nested in
        another (`run_once` around an operation), it is a savepoint: it undoes only itself on error."""
        with self.lock:
            nested = self._depth > 0
            self.conn.execute("SAVEPOINT nested" if nested else "BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield self.conn
            except BaseException as exc:
                if self.conn.in_transaction:  # SQLite rolls a transaction back itself on some errors (a full disk)
                    if nested:
                        self.conn.execute("ROLLBACK TO nested")
                        self.conn.execute("RELEASE nested")
                    else:
                        self.conn.execute("ROLLBACK")
                if (full := self._disk_full(exc)) is not None and full is not exc:
                    raise full from exc
                raise
            finally:
                self._depth -= 1
            if not self.conn.in_transaction:
                return  # an error inside, answered there, made SQLite roll it all back: nothing to commit
            try:
                self.conn.execute("RELEASE nested" if nested else "COMMIT")
            except sqlite3.Error as exc:
                if not nested and self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                if (full := self._disk_full(exc)) is not None:
                    raise full from exc
                raise
            if self._full and not nested:
                self._full = False
                log.warning("store %s: writes succeed again (the disk has room)", self.path)

    def _disk_full(self, exc: BaseException) -> DiskFullError | None:
        """The error to raise for `exc` when it says the disk is full, logged once per incident (not once per write)."""
        if isinstance(exc, DiskFullError):
            return exc
        full = (isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == SQLITE_FULL) or (
            isinstance(exc, OSError) and exc.errno == errno.ENOSPC
        )
        if not full:
            return None
        if not self._full:
            self._full = True
            log.error(
                "store %s: the disk is full (%s); writes fail until there is room, reads still work", self.path, exc
            )
        return DiskFullError(
            f"the disk holding the store {self.path} is full ({exc}): nothing was written; free space "
            f"on it (or move the store to a disk with room) and try again; reads still work"
        )

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection, this thread's alone meanwhile: for reads of several statements, or a look before a write."""
        with self.lock:
            yield self.conn

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of one statement."""
        with self.lock:
            return self.conn.execute(sql, params).fetchall()

    async def run_once(self, key: str, work: Callable[[], Awaitable[Answer]]) -> Answer:
        """The call and its answer commit in one transaction, so a retry with `key` after a crash gets the
        first answer back and nothing is applied twice. `work` must not wait on anything (store calls don't)."""
        with self.write() as db:
            row = db.execute("SELECT status, body FROM replies WHERE key = ?", (key,)).fetchone()
            if row is not None:
                return row[0], bytes(row[1])
            status, body = finish_now(work())
            if status < 300:
                at = self.clock()
                db.execute("INSERT INTO replies (key, time, status, body) VALUES (?, ?, ?, ?)", (key, at, status, body))
                if at - self._last_prune > REPLY_SECONDS / 10:
                    self._last_prune = at
                    db.execute(
                        "DELETE FROM replies WHERE id < (SELECT id FROM replies WHERE time >= ? ORDER BY id LIMIT 1)",
                        (at - REPLY_SECONDS,),
                    )
        return status, body

    def close(self) -> None:
        with self.lock:
            self.conn.close()


def open_reason(path: Path) -> str:
    """Why SQLite could not open `path`, where it is plain to see (SQLite says only `unable to open database file`)."""
    if path.is_dir():
        return f" ({path} is a folder: name a file inside it, like {path / 'store.db'})"
    folder = next((p for p in [path.parent, *path.parent.parents] if p.exists()), None)
    if folder is not None and folder != path.parent:
        return f" ({path.parent} does not exist and cannot be created in {folder})"
    if folder is not None and not folder.is_dir():
        return f" ({folder} is a file, not a folder)"
    if folder is not None and not os.access(folder, os.W_OK | os.X_OK):
        return f" (the folder {folder} is read-only for this user)"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return f" ({path} is read-only for this user)"
    return ""


def checkpoint_until(conn: sqlite3.Connection, stop: threading.Event) -> None:
    """Move committed WAL frames into the database file every `CHECKPOINT_SECONDS`, never blocking writers.

    `conn` is opened by the caller (`check_same_thread=False`) while the file surely exists: a thread
    opening it later could find its folder gone with a short-lived store, and die on it."""
    try:
        while not stop.wait(CHECKPOINT_SECONDS):
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error:  # the file went away, or is busy: the writers' own checkpoints still run
                pass
    finally:
        conn.close()
