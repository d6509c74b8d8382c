"""`open_store` takes the forms it documents and refuses any other address, never making a file of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgrad.store import MemoryStore, SqliteStore, StoreError, open_store
from agentgrad.store.client import StoreClient


@pytest.mark.parametrize(
    "address",
    ["mongodb://localhost:27017/agentgrad", "mysql://root@db/agentgrad", "sqlite:///runs/store.db", "ftp://x"],
)
def test_an_address_with_an_unknown_scheme_is_refused_naming_the_forms_that_work(
    address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError) as refused:
        open_store(address)
    message = str(refused.value)
    assert repr(address.split("://")[0] + "://") in message
    for form in ("'memory'", "SQLite file path", "http://", "postgresql://"):
        assert form in message
    assert list(tmp_path.iterdir()) == []  # no folder named after the scheme, no file


def test_the_documented_forms_open_their_backends(tmp_path: Path) -> None:
    assert isinstance(open_store("memory"), MemoryStore)
    assert isinstance(open_store(tmp_path / "runs" / "store.db"), SqliteStore)
    assert isinstance(open_store("http://127.0.0.1:4780"), StoreClient)


def test_an_empty_address_is_refused() -> None:
    with pytest.raises(StoreError, match="empty"):
        open_store("  ")
