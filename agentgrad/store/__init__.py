"""Stores: one interface (`Store`), several backends, and `open_store` to pick one from a string."""

from __future__ import annotations

from pathlib import Path

from agentgrad.store.base import Store
from agentgrad.store.errors import DiskFullError, InvalidTransitionError, NotFoundError, StoreError
from agentgrad.store.memory import MemoryStore
from agentgrad.store.sqlite import SqliteStore

__all__ = [
    "DiskFullError",
    "InvalidTransitionError",
    "MemoryStore",
    "NotFoundError",
    "SqliteStore",
    "Store",
    "StoreError",
    "open_store",
]


def open_store(spec: str | Path | Store) -> Store:
    """A store from a string: `memory`, a SQLite file path, or the URL of a store server."""
    if isinstance(spec, Store):
        return spec
    text = str(spec)
    if text in ("memory", ":memory:"):
        return MemoryStore()
    if text.startswith(("http://", "https://")):
        from agentgrad.store.client import StoreClient

        return StoreClient(text)
    return SqliteStore(text)
