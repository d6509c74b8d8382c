"""Every backend in `BACKENDS` runs the whole contract suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from agentgrad.store import MemoryStore, SqliteStore, Store

BACKENDS: dict[str, Callable[[Path], Store]] = {
    "memory": lambda tmp: MemoryStore(),
    "sqlite": lambda tmp: SqliteStore(tmp / "store.db"),
}


@pytest.fixture(params=list(BACKENDS))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    backend = BACKENDS[request.param](tmp_path)
    yield backend
    await backend.close()
