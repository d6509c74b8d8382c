"""The engine server behind the guard, as `agentgrad engine serve` runs it: cross-site calls and foreign
hosts are refused before they reach the model, slow connections are cut, and with a token even
`/health` (which reports the engine's counters) needs it."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from agentgrad.engine import Engine
from agentgrad.engine.server import create_engine_app
from agentgrad.serving import ServerThread
from agentgrad.serving.guard import Guard
from tests.test_guard import cross_site_attempts, raw_get


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine


def test_a_cross_site_post_or_a_foreign_host_never_reaches_the_engine(engine: Engine) -> None:
    before = dict(engine.stats)
    with ServerThread(create_engine_app(engine), read_timeout=0.3) as server:
        body = {"model": engine.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for answer in cross_site_attempts(server.url, "/v1/chat/completions", body):
            assert answer.status_code == 403 and answer.json()["error"]["type"] == "permission_error", answer.text
        assert engine.stats == before  # nothing was generated
        assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200

        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            opened = time.monotonic()
            connection.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99\r\n\r\n{")
            assert connection.recv(4096) == b"" and time.monotonic() - opened < 5


def test_with_a_token_every_engine_path_needs_it_health_included(engine: Engine) -> None:
    with ServerThread(Guard(create_engine_app(engine), token="engine-token")) as server:
        for path in ("/health", "/v1/models", "/v1/nowhere"):
            for authorization in (None, "Bearer ", "Bearer wrong"):
                assert raw_get(server.url, path, authorization)[0] == 401, (path, authorization)
        assert raw_get(server.url, "/health", "Bearer engine-token")[0] == 200
