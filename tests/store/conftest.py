"""Every backend in `BACKENDS` runs the whole contract suite; `http-*` are a client talking to a
real server on loopback that keeps its data in the named backend. `postgres` is a fresh schema of one
PostgreSQL server for the session (`tests/postgres_server.py`).

Every store is built with the test's `clock` (a `ManualClock`); over HTTP the server's store
lives in this process, so moving the clock moves the server's time too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore, SqliteStore, Store
from agentgrad.store.client import StoreClient
from agentgrad.store.postgres import PostgresStore
from agentgrad.store.server import create_app
from tests.helpers import ManualClock
from tests.postgres_server import fresh_schema_url

LOCAL: dict[str, Callable[[Path, ManualClock], Store]] = {
    "memory": lambda tmp, clock: MemoryStore(clock=clock),
    "sqlite": lambda tmp, clock: SqliteStore(tmp / "store.db", clock=clock),
    "postgres": lambda tmp, clock: PostgresStore(fresh_schema_url(), clock=clock),
}
BACKENDS = [*LOCAL, *(f"http-{name}" for name in LOCAL)]


@pytest.fixture(scope="session")
def http_server() -> Iterator[tuple[Any, ServerThread]]:
    """One server for the session (starting one per test costs ~0.25 s); each test gives it a fresh store."""
    app = create_app(MemoryStore())
    with ServerThread(app) as server:
        yield app, server


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> AsyncIterator[Store]:
    name: str = request.param
    backend = LOCAL[name.removeprefix("http-")](tmp_path, clock)
    if not name.startswith("http-"):
        yield backend
        await backend.close()
        return
    app, server = request.getfixturevalue("http_server")
    app.state.store = backend
    client = StoreClient(server.url, retry_seconds=5)
    yield client
    await client.close()
    await backend.close()
