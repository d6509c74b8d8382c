"""How the PostgreSQL store's calls run: each in one transaction on a pooled connection (`postgres_pool.py`), run
again whole when it loses a deadlock or the database is away, and inside `run_once` part of its transaction, which
commits a call and its answer together.

A call that cannot reach the database retries for `retry_seconds` (a restart, a failover), then fails with
`StoreUnavailable` (HTTP 503).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TypeVar

import asyncpg

from agentgrad.store.errors import StoreUnavailable
from agentgrad.store.idempotency import REPLY_SECONDS, Answer
from agentgrad.store.postgres_pool import CONFLICTS, CONNECTION_LOST, Pools, connection_problem
from agentgrad.store.transitions import Clock

log = logging.getLogger(__name__)

T = TypeVar("T")
Work = Callable[[asyncpg.Connection], Awaitable[T]]

FIRST_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 1.0

_JOINED: ContextVar[asyncpg.Connection | None] = ContextVar("agentgrad_postgres_transaction", default=None)
"""The connection of the `run_once` transaction this task is in: an operation inside it joins it (a savepoint)."""


def in_run_once() -> bool:
    """Whether this task's calls join a `run_once` transaction."""
    return _JOINED.get() is not None


class _Undo(Exception):
    """Rolls the transaction of `run_once` back: its call failed, or its key was answered already."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body


class Transactions:
    """The store's calls on `pools`' connections, each in a transaction of its own or the `run_once` one it is in."""

    def __init__(self, pools: Pools, retry_seconds: float, clock: Clock) -> None:
        self.pools = pools
        self.retry_seconds = retry_seconds
        self.clock = clock
        self._last_prune = 0.0

    async def write(self, work: Work[T]) -> T:
        """`work` in one transaction, run again whole if it loses a deadlock or the database is away (until
        `retry_seconds`); inside `run_once`, part of its transaction (which an error answer rolls back whole)."""
        joined = _JOINED.get()
        if joined is not None:
            return await work(joined)
        return await self._retrying(work, transaction=True)

    async def read(self, work: Work[T]) -> T:
        joined = _JOINED.get()
        return await work(joined) if joined is not None else await self._retrying(work, transaction=False)

    async def _retrying(self, work: Work[T], *, transaction: bool) -> T:
        address = self.pools.address
        deadline = time.monotonic() + self.retry_seconds
        backoff = FIRST_BACKOFF_SECONDS
        while True:
            committing = False
            try:
                async with self.pools.connection() as conn:
                    if not transaction:
                        return await work(conn)
                    tx = conn.transaction()
                    await tx.start()
                    try:
                        result = await work(conn)
                    except BaseException:
                        if not conn.is_closed():
                            await tx.rollback()
                        raise
                    committing = True
                    await tx.commit()
                    return result
            except CONFLICTS as exc:
                if time.monotonic() > deadline:
                    raise StoreUnavailable(
                        f"a transaction kept losing to others for {self.retry_seconds:g} s: {exc}"
                    ) from exc
                log.debug("a transaction lost to another one (%s); running it again", exc)
            except CONNECTION_LOST as exc:
                if committing:
                    raise StoreUnavailable(
                        f"the connection to {address.shown} was lost while committing ({exc}): the change may or "
                        "may not be stored; a client retrying with the same idempotency key gets it applied once"
                    ) from None
                if time.monotonic() + backoff > deadline:
                    raise StoreUnavailable(
                        connection_problem(address, exc) + f" (still failing after {self.retry_seconds:g} s)"
                    ) from None
                log.warning("PostgreSQL at %s unreachable (%s); retrying", address.shown, exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    async def run_once(self, key: str, work: Callable[[], Awaitable[Answer]]) -> Answer:
        """The call and its answer commit in one transaction: a retry with `key` after a lost answer (to this
        server or another) gets the first answer back, and nothing is applied twice.

        The call runs first and its answer is stored under `key` last, in the same transaction: one statement
        more than the call. Where `key` is answered already (a retry; or a twin still running, whose commit the
        insert waits for), the call is rolled back whole and the stored answer returned; an error answer is
        rolled back too, and is the answer only when `key` has none."""

        async def once(db: asyncpg.Connection) -> Answer:
            joined = _JOINED.set(db)
            try:
                status, body = await work()
            finally:
                _JOINED.reset(joined)
            if status >= 300:
                raise _Undo(status, body)
            at = self.clock()
            stored = await db.fetchval(
                "INSERT INTO replies (key, time, status, body) VALUES ($1, $2, $3, $4) "
                "ON CONFLICT (key) DO NOTHING RETURNING id",
                key,
                at,
                status,
                body,
            )
            if stored is None:
                raise _Undo(status, body)
            if at - self._last_prune > REPLY_SECONDS / 10:
                self._last_prune = at
                await db.execute("DELETE FROM replies WHERE time < $1", at - REPLY_SECONDS)
            return status, body

        try:
            return await self.write(once)
        except _Undo as undone:
            row = await self.read(lambda db: db.fetchrow("SELECT status, body FROM replies WHERE key = $1", key))
            return (row[0], bytes(row[1])) if row is not None else (undone.status, undone.body)
