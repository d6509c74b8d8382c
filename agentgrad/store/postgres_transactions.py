"""How the PostgreSQL store's calls run: each in one transaction on a pooled connection (`postgres_pool.py`), run
again whole when it loses a deadlock or the database is away, and inside `run_once` part of its transaction, which
commits a call and its answer together.

Writes commit in groups: an event loop keeps at most `write_lanes` write transactions open (2; the store URL's
`?write_lanes=`), and the writes that arrive meanwhile run one after another in the next one, committed together
(up to `GROUP_WRITES`), their idempotency answers stored by one statement. A lone write waits for nothing. Why:
BEGIN, COMMIT and the answer were three of a write's four or five round trips, and on a busy server the round trips
are what a write costs (docs/scaling.md). A write of a group that fails rolls the group back: the others commit
together again, and it runs on its own, for its own answer.

A group's keyed writes are looked up first, in one statement: a retry of a write answered already (its answer lost
to a cut connection, say) gets that answer and does not run again. Run again, a claim would take another waiting
rollout `FOR UPDATE SKIP LOCKED` and hold it until its stored answer was found and it rolled back, and another
worker's claim meanwhile skipped that rollout and found the queue empty.

A call that cannot reach the database retries for `retry_seconds` (a restart, a failover), then fails with
`StoreUnavailable` (HTTP 503).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

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
GROUP_WRITES = 16
"""Most writes one transaction commits together."""

_JOINED: ContextVar[asyncpg.Connection | None] = ContextVar("agentgrad_postgres_transaction", default=None)
"""The connection of the transaction this task's write runs in (a group's, `_each`): an operation inside it joins it."""


def in_transaction() -> bool:
    """Whether this task's calls join a write's transaction (a `run_once` call's among them)."""
    return _JOINED.get() is not None


class _Undo(Exception):
    """Rolls the transaction of `run_once` back: its call failed, or its key was answered already."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body


class _Cut(Exception):
    """The connection closed under a transaction's work, whatever the work made of that (a store call inside
    `run_once` answers it as a 500): nothing was committed, and the transaction runs again whole."""


RUN_AGAIN: tuple[type[BaseException], ...] = (*CONNECTION_LOST, _Cut)
"""A transaction's failures that run it again whole, within `retry_seconds`."""


class _Failed(Exception):
    """The write at `index` of a group raised, or its key was answered already: the group is rolled back."""

    def __init__(self, index: int) -> None:
        self.index = index


@dataclass
class _Write:
    """A write waiting for its transaction; with a `key`, its result is an `Answer` stored under it on commit."""

    work: Work[Any]
    key: str | None
    future: asyncio.Future[Any]


@dataclass
class _Lanes:
    """One event loop's writes waiting for a transaction, and the tasks committing them."""

    waiting: deque[_Write] = field(default_factory=deque)
    committers: set[asyncio.Task[None]] = field(default_factory=set)


class Transactions:
    """The store's calls on `pools`' connections, each in a transaction of its own or the `run_once` one it is in."""

    def __init__(self, pools: Pools, retry_seconds: float, clock: Clock) -> None:
        self.pools = pools
        self.retry_seconds = retry_seconds
        self.clock = clock
        self.lanes = pools.address.write_lanes
        self.commits = 0
        """Write transactions committed, and the writes in them: `writes / commits` is the mean group."""
        self.writes = 0
        self._last_prune = 0.0
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lanes] = weakref.WeakKeyDictionary()

    async def write(self, work: Work[T]) -> T:
        """`work` in a transaction, with the writes of this loop that wait beside it; run again whole if it loses
        a deadlock or the database is away (until `retry_seconds`); inside `run_once`, part of its transaction
        (which an error answer rolls back whole)."""
        joined = _JOINED.get()
        if joined is not None:
            return await work(joined)
        return await self._grouped(work, None)

    async def _grouped(self, work: Work[T], key: str | None) -> T:
        loop = asyncio.get_running_loop()
        lanes = self._loops.get(loop)
        if lanes is None:
            lanes = self._loops[loop] = _Lanes()
        future: asyncio.Future[T] = loop.create_future()
        lanes.waiting.append(_Write(work, key, future))
        if len(lanes.committers) < self.lanes:
            committer = loop.create_task(self._commit_waiting(lanes))
            lanes.committers.add(committer)
            committer.add_done_callback(lanes.committers.discard)  # one cancelled before it ever ran
        return await future

    async def _commit_waiting(self, lanes: _Lanes) -> None:
        """Commit the waiting writes, group after group, until none waits.

        It stops counting as a committer in the very turn it finds none waiting. Left to its done callback, it
        would count until the loop's next turn, after the writers it answered resume: a write made by one of them
        then found every lane taken and waited until some later write started a committer (a client timed out at
        60 s when none came, as at the end of a busy spell)."""
        try:
            while lanes.waiting:
                group: list[_Write] = []
                while lanes.waiting and len(group) < GROUP_WRITES:
                    write = lanes.waiting.popleft()
                    if not write.future.done():  # its caller went away before it ran: it never does
                        group.append(write)
                try:
                    await self._commit(group)
                except BaseException:  # this loop is closing
                    for write in group + list(lanes.waiting):
                        write.future.cancel()
                    raise
        finally:
            if (me := asyncio.current_task()) is not None:
                lanes.committers.discard(me)

    async def _commit(self, group: list[_Write]) -> None:
        """The writes of `group` in one transaction, each answered with its result; a write that fails is rolled
        back with the others, which commit together again, and then runs on its own."""
        if not group:
            return
        try:
            results = await self._retrying(lambda conn: self._each(conn, group), transaction=True)
        except _Failed as failed:
            alone = group.pop(failed.index)
            await self._commit(group)
            await self._commit([alone])
            return
        except Exception as exc:  # the transaction's own failure (the database away too long): every write's
            for write in group:
                if not write.future.done():
                    write.future.set_exception(exc)
            return
        self.commits += 1
        self.writes += len(group)
        for write, result in zip(group, results):
            if not write.future.done():
                write.future.set_result(result)

    async def _each(self, conn: asyncpg.Connection, group: list[_Write]) -> list[Any]:
        """Runs the writes of `group` one after another on `conn`, then stores the answers of those with a key in
        one statement; a write whose key was answered before the group began gets that answer and does not run. A
        write that raises, or whose key was answered meanwhile (by a twin), fails the group (`_Failed`), unless it
        is alone: then it raises its own error, or `_Undo`."""
        keys = [write.key for write in group if write.key is not None]
        answered: dict[str, Answer] = {}
        if keys:
            rows = await conn.fetch("SELECT key, status, body FROM replies WHERE key = ANY($1::text[])", keys)
            answered = {row[0]: (row[1], bytes(row[2])) for row in rows}
        joined = _JOINED.set(conn)  # what a write calls inside joins the group's transaction
        results: list[Any] = []
        try:
            for index, write in enumerate(group):
                if write.key in answered:
                    results.append(answered[write.key])
                    continue
                try:
                    results.append(await write.work(conn))
                except CONNECTION_LOST:
                    raise  # the group runs again whole
                except Exception as exc:  # a conflict too: it may be this write's own, and run again alone
                    if len(group) == 1:
                        raise
                    raise _Failed(index) from exc
        finally:
            _JOINED.reset(joined)
        keyed = [
            (index, write.key, results[index])
            for index, write in enumerate(group)
            if write.key is not None and write.key not in answered
        ]
        seen: set[str] = set()
        for index, key, _ in keyed:
            if key in seen:  # a twin in this very group: it runs again alone, and finds the first one's answer
                raise _Failed(index)
            seen.add(key)
        if keyed:
            at = self.clock()
            stored = {
                row[0]
                for row in await conn.fetch(
                    "INSERT INTO replies (key, time, status, body) SELECT k, $2, s, b "
                    "FROM unnest($1::text[], $3::int[], $4::bytea[]) AS v(k, s, b) "
                    "ON CONFLICT (key) DO NOTHING RETURNING key",
                    [key for _, key, _ in keyed],
                    at,
                    [answer[0] for _, _, answer in keyed],
                    [answer[1] for _, _, answer in keyed],
                )
            }
            for index, key, answer in keyed:
                if key not in stored:  # a retry of a write answered already, or its twin's commit came first
                    if len(group) == 1:
                        raise _Undo(*answer)
                    raise _Failed(index)
            if at - self._last_prune > REPLY_SECONDS / 10:
                self._last_prune = at
                await conn.execute("DELETE FROM replies WHERE time < $1", at - REPLY_SECONDS)
        return results

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
                    except Exception as exc:  # (one cancelled is not rolled back: the pool closes its connection)
                        if conn.is_closed():
                            if isinstance(exc, CONNECTION_LOST):
                                raise
                            raise _Cut(f"the connection closed under the transaction ({exc!r})") from exc
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
            except RUN_AGAIN as exc:
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

        The call runs first and its answer is stored under `key` last, in the same transaction (with the answers
        of the group's other writes: one statement for them all). Where `key` is answered already (a retry; or a
        twin still running, whose commit the insert waits for), the call is rolled back whole and the stored
        answer returned; an error answer is rolled back too, and is the answer only when `key` has none."""

        async def call(db: asyncpg.Connection) -> Answer:
            status, body = await work()  # its store calls join this transaction (`_each` set `_JOINED`)
            if status >= 300:
                raise _Undo(status, body)
            return status, body

        if _JOINED.get() is not None:
            raise RuntimeError("run_once inside a transaction: its answer would not be kept with its change")
        try:
            return await self._grouped(call, key)
        except _Undo as undone:
            row = await self.read(lambda db: db.fetchrow("SELECT status, body FROM replies WHERE key = $1", key))
            return (row[0], bytes(row[1])) if row is not None else (undone.status, undone.body)
