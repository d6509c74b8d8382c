"""The HTTP guard in front of the store server, the gateway (and, in tests/engine/test_guard.py, the
engine): what a web page on another site, a rebound DNS name, an empty token or a slow client can
no longer do. Every server here runs as it is served: a real uvicorn on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentgrad.gateway import Backend, Gateway
from agentgrad.serving import ServerThread
from agentgrad.serving.guard import check_exposure, json_too_deep
from agentgrad.store import MemoryStore, SqliteStore
from agentgrad.store.server import create_app
from agentgrad.types import LLM
from tests.conftest import Served, Upstream

EVIL = "http://evil.example"
ATTACKER_LLM = {"llm": {"resource_type": "llm", "base_url": "http://attacker.invalid/v1", "model": "m"}}
CHAT = {"model": "policy", "messages": [{"role": "user", "content": "spend the key"}]}
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}


@pytest.fixture
def store_server(tmp_path: Path) -> Iterator[tuple[SqliteStore, str]]:
    store = SqliteStore(tmp_path / "store.db")
    with ServerThread(create_app(store)) as server:
        yield store, server.url
    asyncio.run(store.close())


def raw_get(url: str, path: str, authorization: str | None) -> tuple[int, bytes]:
    """GET with the `Authorization` header exactly as given (httpx refuses `Bearer ` with its trailing space)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    head = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
    if authorization is not None:
        head += f"Authorization: {authorization}\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(head.encode() + b"\r\n")
        reply = b""
        while chunk := connection.recv(65536):
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def cross_site_attempts(url: str, path: str, body: dict) -> list[httpx.Response]:  # type: ignore[type-arg]
    """What a page on another site can make a browser send, and what a rebound DNS name looks like."""
    raw = json.dumps(body)
    port = url.rsplit(":", 1)[1]
    return [
        httpx.post(url + path, content=raw, headers={"content-type": "text/plain", "origin": EVIL}),
        httpx.post(url + path, content=raw, headers={"content-type": "text/plain;charset=UTF-8"}),  # no Origin sent
        httpx.post(url + path, content=raw, headers={"content-type": "application/x-www-form-urlencoded"}),
        httpx.post(url + path, json=body, headers={"origin": EVIL}),
        httpx.post(url + path, json=body, headers={"origin": "null"}),
        httpx.post(url + path, json=body, headers={"sec-fetch-site": "cross-site"}),
        httpx.post(url + path, json=body, headers={"origin": f"http://localhost:{int(port) + 1}"}),  # another port
        httpx.post(url + path, json=body, headers={"host": f"evil.example:{port}"}),  # DNS rebinding
    ]


def test_a_cross_site_post_or_a_foreign_host_changes_nothing_in_the_store(store_server) -> None:  # type: ignore[no-untyped-def]
    store, url = store_server
    before = httpx.get(url + "/api/resources").json()
    attempts = cross_site_attempts(url, "/api/resources", {"resources": ATTACKER_LLM})
    attempts += cross_site_attempts(url, "/api/rollouts", {"requests": [{"input": "attacker's task"}]})
    for answer in attempts:
        assert answer.status_code == 403, answer.text
        assert set(answer.json()) == {"error", "detail"} and answer.json()["error"] == "Forbidden"
    assert httpx.get(url + "/api/resources").json() == before
    assert asyncio.run(store.stats()).rollouts == {}


def test_the_dashboard_and_same_origin_calls_pass_the_guard(store_server) -> None:  # type: ignore[no-untyped-def]
    _, url = store_server
    host = url.removeprefix("http://")
    page = httpx.get(url + "/", headers={"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"})  # a link
    assert page.status_code == 200 and "<html" in page.text.lower()
    same = {"origin": url, "sec-fetch-site": "same-origin"}
    assert httpx.post(url + "/api/rollouts", json={"requests": [{"input": 1}]}, headers=same).status_code == 200
    by_name = {"origin": f"http://localhost:{url.rsplit(':', 1)[1]}", "host": f"localhost:{url.rsplit(':', 1)[1]}"}
    assert httpx.get(url + "/api/stats", headers=by_name).status_code == 200
    assert httpx.get(url + "/api/stats", headers={"host": host.replace("127.0.0.1", "127.0.0.1")}).status_code == 200


def test_a_name_given_in_allowed_hosts_is_served_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTGRAD_ALLOWED_HOSTS", "head-node.lan, other-name")
    with ServerThread(create_app(MemoryStore())) as server:
        port = server.url.rsplit(":", 1)[1]
        assert httpx.get(server.url + "/api/stats", headers={"host": f"head-node.lan:{port}"}).status_code == 200
        assert httpx.get(server.url + "/api/stats", headers={"host": f"other.lan:{port}"}).status_code == 403


def test_with_a_token_any_host_name_may_reach_the_server_with_the_token() -> None:
    with ServerThread(create_app(MemoryStore(), token="s3cret")) as server:
        port = server.url.rsplit(":", 1)[1]
        named = {"host": f"trainer-host.lan:{port}", "authorization": "Bearer s3cret"}
        assert httpx.get(server.url + "/api/stats", headers=named).status_code == 200  # runners on other machines
        assert httpx.get(server.url + "/api/stats", headers={"host": named["host"]}).status_code == 401


def test_a_cross_site_post_or_a_foreign_host_never_reaches_the_gateways_upstream(
    served: Served, upstream: Upstream
) -> None:
    for answer in cross_site_attempts(served.url, "/v1/chat/completions", CHAT):
        assert answer.status_code == 403, answer.text
        error = answer.json()["error"]
        assert error["type"] == "permission_error" and error["code"] in ("cross_site_request", "host_not_allowed")
    assert upstream.fake.requests == []
    assert httpx.post(served.url + "/v1/chat/completions", json=CHAT).status_code == 200  # as the openai client sends


def test_the_gateway_checks_the_token_before_routing(upstream: Upstream) -> None:
    gateway = Gateway(MemoryStore(), {"policy": Backend(upstream.url)}, token="gw-token")
    with ServerThread(gateway) as server:
        for path in ("/v1/nowhere", "/admin", "/v1/models", "/rollouts/r/attempts/a/v1/chat/completions"):
            for auth in (None, "Bearer ", "Bearer wrong"):
                status, body = raw_get(server.url, path, auth)
                assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", path
        assert httpx.get(server.url + "/v1/nowhere", headers={"authorization": "Bearer gw-token"}).status_code == 404


def test_the_store_with_a_token_refuses_an_empty_bearer() -> None:
    with ServerThread(create_app(MemoryStore(), token="s3cret")) as server:
        for auth in ("Bearer ", "Bearer", "", "s3cret", "Bearer  s3cret"):
            assert raw_get(server.url, "/api/stats", auth)[0] == 401, auth
        assert httpx.get(server.url + "/api/stats", headers={"authorization": "Bearer s3cret"}).status_code == 200


def test_an_empty_token_is_refused_at_start() -> None:
    for token in ("", " ", "\t"):
        for host in ("0.0.0.0", "127.0.0.1"):
            with pytest.raises(ValueError, match="token is empty"):
                check_exposure(host, token)
        with pytest.raises(ValueError, match="token is empty"):
            create_app(MemoryStore(), token=token)
        with pytest.raises(ValueError, match="token is empty"):
            Gateway(MemoryStore(), default=Backend("http://127.0.0.1:9/v1"), token=token)


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--store", "memory", "--host", "0.0.0.0"],
        ["gateway", "--store", "memory", "--default", "http://127.0.0.1:9/v1", "--host", "0.0.0.0"],
        ["engine", "serve", "--host", "0.0.0.0"],  # refused before the model loads
    ],
)
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_an_empty_token_from_the_command_line_or_the_environment_is_refused_at_start(
    command: list[str], how: str
) -> None:
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = str(free.getsockname()[1])
    free.close()
    env = {**ENV, "AGENTGRAD_TOKEN": ""}
    argv = [*command, "--port", port] + (["--token", ""] if how == "flag" else [])
    result = subprocess.run([sys.executable, "-m", "agentgrad.cli", *argv], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "token is empty" in " ".join(result.stdout.split())


@pytest.mark.slow
def test_a_half_sent_or_silent_connection_is_closed_after_the_read_timeout(store_server, upstream) -> None:  # type: ignore[no-untyped-def]
    store = MemoryStore()
    for app in (create_app(store), Gateway(store, {"policy": Backend(upstream.url)})):
        with ServerThread(app, read_timeout=0.3) as server:
            port = int(server.url.rsplit(":", 1)[1])
            for sent in (b"", b"POST /api/rollouts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le",
                         b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 500\r\n\r\n{\"m"):
                with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
                    opened = time.monotonic()
                    connection.sendall(sent)
                    assert connection.recv(4096) == b""  # closed by the server, nothing answered
                    assert 0.25 <= time.monotonic() - opened < 5


def test_a_request_that_arrived_may_wait_for_its_answer_past_the_read_timeout() -> None:
    store = MemoryStore()
    with ServerThread(create_app(store), read_timeout=0.2) as server:
        rollout = asyncio.run(store.enqueue_rollout("t"))
        with httpx.Client(timeout=10) as client:
            answer = client.post(server.url + "/api/rollouts/wait", json={"rollout_ids": [rollout.rollout_id],
                                                                          "timeout": 0.6})
            assert answer.status_code == 200 and answer.json() == []  # a long-poll, answered after 0.6 s
            assert client.get(server.url + "/api/stats").status_code == 200  # and its connection still serves


def test_bodies_too_large_or_nested_too_deep_are_refused_in_each_servers_error_shape(served: Served) -> None:
    deep = b'{"model": "policy", "messages": [{"role": "user", "content": ' + b"[" * 5000 + b"]" * 5000 + b"}]}"
    answer = httpx.post(served.url + "/v1/chat/completions", content=deep, headers={"content-type": "application/json"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "json_too_deep"
    with ServerThread(create_app(MemoryStore(), max_body_bytes=1000)) as server:
        nested = httpx.post(server.url + "/v1/traces", content=b"[" * 500 + b"]" * 500,
                            headers={"content-type": "application/json"})
        assert nested.status_code == 400 and nested.json()["error"] == "ValidationError"
        large = httpx.post(server.url + "/api/rollouts", content=b"x" * 2000)
        assert large.status_code == 413 and large.json()["error"] == "BodyTooLarge"


def test_json_depth_is_measured_without_parsing_and_without_being_fooled_by_strings() -> None:
    assert not json_too_deep(b'{"a": [1, 2, {"b": [3]}]}', 4)
    assert json_too_deep(b'{"a": [1, 2, {"b": [3]}]}', 3)
    assert not json_too_deep(b'["' + b"[" * 500 + b'"]', 5)  # brackets inside a string
    assert not json_too_deep(b'["\\"[[[[[[", [], [], [], [], [], []]', 3)  # an escaped quote does not end it
    assert json_too_deep(b"[" * 101 + b"]" * 101, 100) and not json_too_deep(b"[" * 100 + b"]" * 100, 100)
    assert not json_too_deep(b"[" + b"[1]," * 10_000 + b"[]]", 100)  # many brackets, shallow


def test_an_llm_resource_refuses_a_key_and_keeps_where_to_find_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="api_key_env") as refused:
        LLM(base_url="http://x/v1", model="m", api_key="sk-live-abcdef123456")
    assert "sk-live" not in str(refused.value)
    llm = LLM(base_url="http://x/v1", model="m", api_key_env="MY_ENDPOINT_KEY")
    monkeypatch.setenv("MY_ENDPOINT_KEY", "sk-from-the-runners-env")
    assert llm.api_key == "sk-from-the-runners-env" and "sk-" not in llm.model_dump_json()
    monkeypatch.setenv("AGENTGRAD_TOKEN", "gateway-token")
    assert LLM(base_url="http://gw/v1", model="m", proxied=True).api_key == "gateway-token"
    assert LLM(base_url="http://x/v1", model="m").api_key == "agentgrad"
    assert LLM.model_validate({"base_url": "http://x/v1", "model": "m", "api_key": "agentgrad"}).api_key_env is None
