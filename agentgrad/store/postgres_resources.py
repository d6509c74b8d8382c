"""Resources in the PostgreSQL store: the statements that add, update and read their snapshots, run on a connection
in the store's transaction (`postgres.py`). Versions come from a counter row, so every server of a database numbers
them in one sequence."""

from __future__ import annotations

from typing import Any

import asyncpg

import agentgrad.store.transitions as t
from agentgrad.store.transitions import Clock
from agentgrad.types import NamedResources, ResourcesSnapshot


async def add_snapshot(
    db: asyncpg.Connection, resources: NamedResources, metadata: dict[str, Any] | None, clock: Clock
) -> ResourcesSnapshot:
    """A new snapshot of `resources`, at the next version."""
    version = await db.fetchval("UPDATE counters SET value = value + 1 WHERE name = 'resources' RETURNING value")
    snapshot = t.new_snapshot(version, resources, metadata, clock())
    await db.execute(
        "INSERT INTO resources VALUES ($1, $2, $3)", version, snapshot.resources_id, snapshot.model_dump_json()
    )
    return snapshot


async def update_metadata(db: asyncpg.Connection, resources_id: str, metadata: dict[str, Any]) -> ResourcesSnapshot:
    """The snapshot with `metadata` merged into its own (the row locked while it changes)."""
    snapshot = await get_snapshot(db, resources_id, lock=True)
    snapshot.metadata = {**snapshot.metadata, **metadata}
    await db.execute("UPDATE resources SET body = $1 WHERE resources_id = $2", snapshot.model_dump_json(), resources_id)
    return snapshot


async def get_snapshot(db: asyncpg.Connection, resources_id: str, lock: bool = False) -> ResourcesSnapshot:
    body = await db.fetchval(
        "SELECT body FROM resources WHERE resources_id = $1" + (" FOR UPDATE" if lock else ""), resources_id
    )
    if body is None:
        raise t.no_resources(resources_id)
    return ResourcesSnapshot.model_validate_json(body)


async def latest_snapshot(db: asyncpg.Connection) -> ResourcesSnapshot | None:
    body = await db.fetchval("SELECT body FROM resources ORDER BY version DESC LIMIT 1")
    return None if body is None else ResourcesSnapshot.model_validate_json(body)


async def all_snapshots(db: asyncpg.Connection) -> list[ResourcesSnapshot]:
    rows = await db.fetch("SELECT body FROM resources ORDER BY version")
    return [ResourcesSnapshot.model_validate_json(row[0]) for row in rows]
