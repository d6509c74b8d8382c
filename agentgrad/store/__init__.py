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


STORE_FORMS = (
    "'memory'; a SQLite file path (runs/store.db); the URL of a store server (http://host:4780, https://...); "
    "a PostgreSQL database (postgresql://user@host:5432/dbname, with the 'agentgrad[postgres]' extra)"
)
"""What `open_store` understands, as its errors list it."""

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_store(spec: str | Path | Store) -> Store:
    """A store from a string: `memory`, a SQLite file path, the URL of a store server, or a PostgreSQL URL.

    Anything else with `://` in it is refused, never taken for a file name."""
    if isinstance(spec, Store):
        return spec
    text = str(spec)
    if text in ("memory", ":memory:"):
        return MemoryStore()
    if text.startswith(("http://", "https://")):
        from agentgrad.store.client import StoreClient

        return StoreClient(text)
    if text.startswith(POSTGRES_SCHEMES):
        from agentgrad.store.postgres import PostgresStore

        return PostgresStore(text)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise StoreError(f"unknown store address scheme {scheme + '://'!r}; a store is one of: {STORE_FORMS}")
    if not text.strip():
        raise StoreError(f"the store address is empty; a store is one of: {STORE_FORMS}")
    return SqliteStore(text)
