"""What the CLI's commands share: the error a command line can cause, and running work on a store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgrad.store import NotFoundError, Store, open_store


class UsageError(Exception):
    """The command line asks for something that cannot be done; the message says what to change."""


def with_store(spec: str, work: Callable[[Store], Any]) -> None:
    """Open the store `spec` names (a SQLite file that must exist, a server URL, or memory), run `work`, close it."""
    if spec not in ("memory", ":memory:") and not spec.startswith(("http://", "https://")) and not Path(spec).exists():
        raise NotFoundError(f"no store file at {spec}; pass the path that a run printed, or a store server URL")

    async def run() -> None:
        store = open_store(spec)
        try:
            await work(store)
        finally:
            await store.close()

    asyncio.run(run())
