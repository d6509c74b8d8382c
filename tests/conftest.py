"""Fixtures shared across the suite: the SmolLM2 engine (loaded once per session), and a fake
upstream with a gateway in front of it, each a real server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from agentgrad.gateway import Backend, Gateway
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from tests.fake_upstream import FakeUpstream

UPSTREAM_KEY = "sk-upstream-secret-1234"


@dataclass
class Upstream:
    fake: FakeUpstream
    url: str  # base URL, ending in /v1


@dataclass
class Served:
    gateway: Gateway
    url: str  # server root, no /v1
    store: MemoryStore


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    fake = FakeUpstream(api_key=UPSTREAM_KEY)
    with ServerThread(fake.app) as server:
        yield Upstream(fake, server.url + "/v1")


@pytest.fixture
def served(upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    store = MemoryStore()
    gateway = Gateway(
        store, {"policy": Backend(upstream.url, api_key_env="FAKE_UPSTREAM_KEY", system="vllm")}, retry_backoff_s=0.001
    )
    with ServerThread(gateway) as server:
        yield Served(gateway, server.url, store)


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    """SmolLM2-135M-Instruct in fp32 (sampling and training on the same weights), CPU."""
    from agentgrad.engine import Engine

    engine = Engine(sampling_dtype="float32", device="cpu")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def engine_gateway(engine: Any) -> Iterator[tuple[str, MemoryStore, Gateway]]:
    """The engine served on loopback behind a gateway (model "policy"): (gateway root URL, store, gateway)."""
    from agentgrad.engine.server import create_engine_app

    store = MemoryStore()
    with ServerThread(create_engine_app(engine)) as server:
        gateway = Gateway(store, {"policy": Backend(server.url + "/v1", model=engine.name, system="agentgrad")})
        with ServerThread(gateway) as front:
            yield front.url, store, gateway
