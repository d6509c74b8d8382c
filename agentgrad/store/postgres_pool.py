"""Connections to PostgreSQL for the store: the address read from a URL, a bounded pool per event loop, and the
errors that say what went wrong without the password.

The driver is asyncpg (benchmarks/pg_drivers.py: 2.2× psycopg 3's transactions/s at a third of its client CPU,
docs/scaling.md). Its connections belong to the event loop that opened them, and a store is called from
several loops (a server's, a sweeper thread's, a test's threads), so each loop gets its own pool, of at
most `pool_size` connections. A call that finds them all busy for `pool_timeout` seconds fails with
`StoreUnavailable` (HTTP 503, which clients retry) naming the limit and how to raise it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import asyncpg

from agentgrad.store.errors import StoreError, StoreUnavailable

T = TypeVar("T")
log = logging.getLogger(__name__)

POOL_SIZE = 10
"""Connections a store keeps open per event loop at most (`?pool_size=` in the store URL)."""
POOL_TIMEOUT_SECONDS = 5.0
"""Longest a call waits for a free connection before it is answered 503 (`?pool_timeout=`)."""
WRITE_LANES = 2
"""Write transactions a store keeps open at once per event loop (`?write_lanes=`); the writes that arrive
meanwhile commit together in the next (`postgres_transactions`). With the database on another host, where each
round trip waits for the network, more lanes keep more writes in flight."""
CONNECT_TIMEOUT_SECONDS = 10.0
RETRY_SECONDS = 30.0
"""How long a call retries while the database cannot be reached (a restart, a failover), then fails 503."""
LISTEN_RETRY_SECONDS = 5.0
"""After a listening connection could not be opened, how long waits poll before one is tried again."""

OPTIONS: dict[str, Callable[[str], Any]] = {
    "pool_size": int,
    "pool_timeout": float,
    "write_lanes": int,
    "migrate": lambda v: v.lower() not in ("0", "false", "no"),
}
"""The store URL's own query parameters (the rest go to the driver: `sslmode`, `search_path`, ...)."""

CONNECTION_LOST: tuple[type[BaseException], ...] = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,  # the connection closed under a call, among others
    asyncpg.CannotConnectNowError,  # the server is starting or stopping
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    # The server's last words (FATAL: terminating connection, at a shutdown) read while the connection sat idle
    # between two statements: the driver's protocol is stuck until the socket closes, and the next statement fails
    # with "cannot switch to state 12; another operation (2) is in progress".
    asyncpg.InternalClientError,
)
"""What a call sees when the database goes away or is not there yet: retried within `RETRY_SECONDS`."""
INTERRUPTED: tuple[type[BaseException], ...] = (*CONNECTION_LOST, asyncpg.InterfaceError, asyncio.CancelledError)
"""What a call may leave a connection broken by, or with an operation still under way: it is closed, never reused."""
CONFLICTS: tuple[type[BaseException], ...] = (
    asyncpg.DeadlockDetectedError,
    asyncpg.SerializationError,
    asyncpg.UniqueViolationError,  # a twin write committed first (a retried span batch): run again, it is seen
)
"""Transactions that lost to another one and may simply run again."""


@dataclass(frozen=True)
class Address:
    """A store URL taken apart: what the driver gets (`dsn`, with the password), what messages show (`shown`,
    without it), and the store's own options."""

    dsn: str
    shown: str
    host: str
    port: int
    database: str
    user: str
    password: str | None
    pool_size: int = POOL_SIZE
    pool_timeout: float = POOL_TIMEOUT_SECONDS
    write_lanes: int = WRITE_LANES
    migrate: bool = True


def parse_address(url: str) -> Address:
    """The address in a `postgresql://user[:password]@host[:port]/database[?options]` URL (libpq's defaults
    for what it leaves out: PGHOST, PGPORT, PGUSER, PGDATABASE, else localhost, 5432, the login name)."""
    parts = urlsplit(url)
    options: dict[str, Any] = {}
    passed = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in OPTIONS:
            try:
                options[key] = OPTIONS[key](value)
            except ValueError:
                raise StoreError(f"the store URL's {key}={value!r} is not a number; write {key}=10, say") from None
        else:
            passed.append((key, value))
    for count in ("pool_size", "write_lanes"):
        if options.get(count, 1) < 1:
            raise StoreError(f"the store URL's {count} must be at least 1")
    try:
        port = parts.port or int(os.environ.get("PGPORT", 5432))
    except ValueError:
        raise StoreError("the store URL's port is not a number: postgresql://user@host:5432/dbname") from None
    user = unquote(parts.username or "") or os.environ.get("PGUSER") or _login()
    database = unquote(parts.path.lstrip("/")) or os.environ.get("PGDATABASE") or user
    host = parts.hostname or os.environ.get("PGHOST") or "localhost"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    shown = urlunsplit(("postgresql", f"{quote_user(user)}@{netloc or host}", f"/{database}", "", ""))
    dsn = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(passed), ""))
    password = None if parts.password is None else unquote(parts.password)
    return Address(dsn, shown, host, port, database, user, password, **options)


def quote_user(user: str) -> str:
    return user.replace("@", "%40").replace(":", "%3A").replace("/", "%2F")


def _login() -> str:
    try:
        return os.getlogin()
    except OSError:
        import getpass

        return getpass.getuser()


def connection_problem(address: Address, exc: BaseException) -> str:
    """What went wrong connecting to `address`, naming host, port, database and user, and never the password."""
    if isinstance(exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError):
        hint = "check the user and password in the store URL (or ~/.pgpass)"
    elif isinstance(exc, asyncpg.InvalidCatalogNameError):
        hint = f"create it first (createdb -h {address.host} -p {address.port} {address.database}) or name another"
    elif isinstance(exc, asyncpg.TooManyConnectionsError):
        hint = "the server is at its max_connections: lower pool_size in the store URLs, or raise max_connections"
    elif isinstance(exc, OSError | asyncio.TimeoutError):
        hint = "is PostgreSQL running there and listening on that address (listen_addresses, pg_hba.conf)?"
    else:
        hint = "see PostgreSQL's message"
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if address.password:
        message = message.replace(address.password, "***")
    return (
        f"cannot use the PostgreSQL database {address.database!r} at {address.host}:{address.port} "
        f"as user {address.user!r} ({message}); {hint}"
    )


class Pools:
    """One bounded pool of connections per event loop, for one database."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self._pools: dict[asyncio.AbstractEventLoop, _Pool] = {}
        self._lock = threading.Lock()

    def _pool(self) -> _Pool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            with self._lock:
                for closed in [other for other in self._pools if other.is_closed()]:
                    del self._pools[closed]  # its connections died with their loop
                pool = self._pools[loop] = _Pool(self.address)
        return pool

    async def listen(self, channel: str, callback: Callable[[str], None]) -> bool:
        """Have `callback(payload)` called for each notification on `channel`, through one connection of this loop's
        own (outside the pool); False while it cannot be opened (the caller polls instead)."""
        return await self._pool().listen(channel, callback)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection of this loop's pool, for the duration of the block; 503 when all are busy too long. One that
        the block left by an `INTERRUPTED` error is closed, not pooled: the next call would find it broken, or busy."""
        pool = self._pool()
        conn = await pool.acquire()
        reusable = True
        try:
            yield conn
        except INTERRUPTED:
            reusable = False
            raise
        finally:
            pool.release(conn, reusable)

    async def close(self) -> None:
        """Close this loop's connections, and forget those of other loops (closed with them)."""
        with self._lock:
            pools, self._pools = self._pools, {}
        loop = asyncio.get_running_loop()
        for owner, pool in pools.items():
            if owner is loop:
                await pool.close()
            elif not owner.is_closed():
                try:  # a connection is only ever touched from its own loop's thread
                    owner.call_soon_threadsafe(pool.abandon)
                except RuntimeError:  # that loop closed meanwhile
                    pass


class _Pool:
    def __init__(self, address: Address) -> None:
        self.address = address
        self._idle: list[asyncpg.Connection] = []
        self._slots = asyncio.Semaphore(address.pool_size)
        self._listener: asyncpg.Connection | None = None
        self._opening: asyncio.Lock = asyncio.Lock()
        self._listen_failed = -LISTEN_RETRY_SECONDS

    async def listen(self, channel: str, callback: Callable[[str], None]) -> bool:
        if self._listener is not None and not self._listener.is_closed():
            return True
        if time.monotonic() - self._listen_failed < LISTEN_RETRY_SECONDS:
            return False
        async with self._opening:  # one listener however many waiters arrive together
            if self._listener is None or self._listener.is_closed():
                conn = None
                try:
                    conn = await asyncpg.connect(self.address.dsn, timeout=CONNECT_TIMEOUT_SECONDS)
                    await conn.add_listener(channel, lambda _conn, _pid, _channel, payload: callback(payload))
                except (*CONNECTION_LOST, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    if conn is not None:
                        conn.terminate()
                    log.warning("cannot listen on %s at %s (%s); polling", channel, self.address.shown, exc)
                    self._listen_failed = time.monotonic()
                    return False
                self._listener = conn
        return True

    async def acquire(self) -> asyncpg.Connection:
        try:
            if self._slots.locked():  # all busy: wait, at most pool_timeout (wait_for costs a task: only then)
                await asyncio.wait_for(self._slots.acquire(), self.address.pool_timeout)
            else:
                await self._slots.acquire()
        except TimeoutError:
            raise StoreUnavailable(
                f"all {self.address.pool_size} connections of this store's pool to {self.address.shown} were busy "
                f"for {self.address.pool_timeout:g} s; retry, or raise the limit with ?pool_size=N in the store "
                f"URL (each server process opens up to that many per event loop; the database allows "
                "max_connections in all)"
            ) from None
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.is_closed():
                    return conn
            return await asyncpg.connect(self.address.dsn, timeout=CONNECT_TIMEOUT_SECONDS)
        except BaseException:
            self._slots.release()
            raise

    def release(self, conn: asyncpg.Connection, reusable: bool = True) -> None:
        if not reusable or conn.is_closed() or conn.is_in_transaction():  # a call cut short: never reuse it
            conn.terminate()
        else:
            self._idle.append(conn)
        self._slots.release()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        if self._listener is not None:
            idle.append(self._listener)
            self._listener = None
        for conn in idle:
            try:
                await asyncio.wait_for(conn.close(), 1.0)
            except Exception:
                conn.terminate()

    def abandon(self) -> None:
        """Drop the idle connections at once (called in their loop's thread)."""
        idle, self._idle = self._idle, []
        if self._listener is not None:
            idle.append(self._listener)
            self._listener = None
        for conn in idle:
            conn.terminate()


def run_in_thread(work: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to its end on a new event loop in a thread of its own, from sync code that may itself be
    inside a running loop (a store opened by `open_store` within async code)."""
    result: list[Any] = []

    def target() -> None:
        try:
            result.append((True, asyncio.run(work)))
        except BaseException as exc:
            result.append((False, exc))

    thread = threading.Thread(target=target, name="postgres setup", daemon=True)
    thread.start()
    thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value
