"""The store server as an HTTP client meets it: tokens, limits, bad input, retries, room for other routes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentgrad.serving import ServerThread
from agentgrad.serving.guard import check_exposure
from agentgrad.store import InvalidTransitionError, MemoryStore, NotFoundError, SqliteStore, StoreError
from agentgrad.store.api import OPERATIONS
from agentgrad.store.client import StoreClient, StoreUnreachable
from agentgrad.store.http11 import ConnectionPool
from agentgrad.store.server import create_app, store_server
from agentgrad.types import Span
from tests.helpers import free_port


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[SqliteStore, ServerThread]]:  # type: ignore[no-untyped-def]
    store = SqliteStore(tmp_path / "store.db")
    with ServerThread(create_app(store, max_body_bytes=10_000)) as server:
        yield store, server


def test_a_token_is_required_on_every_route_but_health() -> None:
    with store_server(MemoryStore(), token="s3cret") as server:
        assert httpx.get(server.url + "/api/health").status_code == 200
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"}):
            denied = httpx.get(server.url + "/api/stats", headers=headers)
            assert denied.status_code == 401 and "Bearer" in denied.json()["detail"]
        assert httpx.post(server.url + "/api/rollouts", json={"requests": [{"input": 1}]}).status_code == 401
        assert httpx.get(server.url + "/api/stats", headers={"authorization": "Bearer s3cret"}).status_code == 200

        async def use() -> None:
            with pytest.raises(StoreError, match="refused the token"):
                await StoreClient(server.url).stats()
            client = StoreClient(server.url, token="s3cret")
            await client.enqueue_rollout("t")
            assert (await client.stats()).rollouts == {"queuing": 1}
            await client.close()

        asyncio.run(use())


def test_serving_beyond_loopback_needs_a_token() -> None:
    for host in ("0.0.0.0", "192.168.1.4", "::", "example.org"):
        with pytest.raises(ValueError, match="without a token"):
            check_exposure(host, None)
        check_exposure(host, "token")
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_exposure(host, None)
    with pytest.raises(ValueError, match="without a token"):
        store_server(MemoryStore(), host="0.0.0.0")


def test_malformed_requests_get_a_4xx_that_says_what_was_wrong_and_change_nothing(served) -> None:  # type: ignore[no-untyped-def]
    store, server = served
    started = asyncio.run(store.start_rollout("t"))
    rid, aid = started.rollout_id, started.attempt.attempt_id
    before = asyncio.run(store.stats())
    api = server.url + "/api"
    cases = [
        (httpx.post(api + "/rollouts", content=b"{not json"), 422, "Invalid JSON"),
        (httpx.post(api + "/rollouts", json={"requests": "many"}), 422, "requests"),
        (httpx.post(api + "/rollouts", json={"requests": [{"input": 1, "config": {"max_attempts": 0}}]}), 422,
         "max_attempts"),
        (httpx.post(api + "/rollouts", json={"requests": [{"input": 1}], "extra": 1}), 422, "extra: Extra inputs"),
        (httpx.post(api + "/rollouts", json=[1, 2]), 422, "Input should be an object"),
        (httpx.patch(f"{api}/rollouts/{rid}/attempts/{aid}", json={"status": "exploded"}), 422, "status"),
        (httpx.patch(f"{api}/rollouts/{rid}/attempts/{aid}", json={"reward": "lots"}), 422, "reward"),
        (httpx.patch(f"{api}/rollouts/{rid}/attempts/{aid}", json={"status": "running"}), 409, "already running"),
        (httpx.patch(f"{api}/rollouts/{rid}", json={"status": "succeeded"}), 409, "only 'cancelled'"),
        (httpx.patch(f"{api}/rollouts/{rid}/attempts/at-nope", json={"status": "failed"}), 404, "at-nope"),
        (httpx.get(api + "/rollouts/ro-nope"), 404, "ro-nope"),
        (httpx.post(api + "/spans", json={"spans": [{"name": "x", "rollout_id": rid, "attempt_id": "at-x"}]}), 404,
         "at-x"),
        (httpx.post(api + "/spans", json={"spans": [{"name": "x", "rollout_id": rid}]}), 400, "attempt_id"),
        (httpx.get(api + "/spans", params={"rollout_id": rid, "all_attempts": "perhaps"}), 422, "all_attempts"),
        (httpx.get(api + "/metrics", params={"colour": "red"}), 422, "colour"),
        (httpx.post(api + "/rollouts/query", json={"limit": -1}), 422, "limit"),
        (httpx.post(api + "/rollouts/query", json={"offset": 10**30}), 422, "offset"),
        (httpx.post(api + "/metrics", json={"metrics": [{"name": "m", "step": 10**30, "value": 1}]}), 422, ""),
        (httpx.post(api + "/spans", content=b"x" * 20_000), 413, "limit of 10000 bytes"),
        (httpx.get(server.url + "/nowhere"), 404, "under /api/"),
        (httpx.delete(api + "/stats"), 405, "DELETE"),
    ]
    for response, status, fragment in cases:
        assert response.status_code == status, (response.request.url, response.text)
        body = response.json()
        assert set(body) == {"error", "detail"} and fragment in body["detail"], body
    assert asyncio.run(store.stats()) == before
    assert asyncio.run(store.get_rollout(rid)).status.value == "running"


def test_a_chunked_body_over_the_limit_is_refused_while_it_arrives(served) -> None:  # type: ignore[no-untyped-def]
    store, server = served

    def chunks() -> Iterator[bytes]:
        yield b'{"requests": ['
        for _ in range(1000):
            yield b'{"input": "xxxxxxxxxxxxxxxx"},'
        yield b'{"input": 0}]}'

    response = httpx.post(server.url + "/api/rollouts", content=chunks())
    assert response.status_code == 413 and "limit of 10000 bytes" in response.json()["detail"]
    assert asyncio.run(store.stats()).rollouts == {}


def test_a_retried_write_with_the_same_idempotency_key_is_applied_once(served) -> None:  # type: ignore[no-untyped-def]
    store, server = served
    asyncio.run(store.enqueue_rollouts([{"input": 1}, {"input": 2}]))
    headers = {"idempotency-key": "k-1"}
    first = httpx.post(server.url + "/api/rollouts/dequeue", json={"worker_id": "w"}, headers=headers)
    again = httpx.post(server.url + "/api/rollouts/dequeue", json={"worker_id": "w"}, headers=headers)
    assert first.json() == again.json() and first.json()["input"] == 1
    assert asyncio.run(store.stats()).rollouts == {"queuing": 1, "running": 1}


def test_a_retried_span_write_is_applied_once_with_or_without_span_ids(served) -> None:  # type: ignore[no-untyped-def]
    """Spans that all carry an id are recognized by the store itself, so their write keeps no stored answer;
    a batch with a span without one is answered from the answer stored with it."""
    store, server = served
    started = asyncio.run(store.start_rollout("t"))
    rid, aid = started.rollout_id, started.attempt.attempt_id
    with_ids = [{"rollout_id": rid, "attempt_id": aid, "span_id": f"{i:016x}", "name": f"s{i}"} for i in range(3)]
    without = [{"rollout_id": rid, "attempt_id": aid, "name": "anonymous"}, *with_ids[:1]]
    for spans, key, sequence_ids in ((with_ids, "k-ids", [1, 2, 3]), (without, "k-mixed", [4, 1])):
        first = httpx.post(server.url + "/api/spans", json={"spans": spans}, headers={"idempotency-key": key})
        again = httpx.post(server.url + "/api/spans", json={"spans": spans}, headers={"idempotency-key": key})
        assert first.json() == again.json() == {"sequence_ids": sequence_ids}
    assert [s.name for s in asyncio.run(store.query_spans(rid))] == ["s0", "s1", "s2", "anonymous"]
    stored_answers = [row[0] for row in store._transactions.read("SELECT key FROM replies")]
    assert stored_answers == ["add_spans:k-mixed"]


def test_every_store_operation_is_in_the_openapi_schema(served) -> None:  # type: ignore[no-untyped-def]
    _, server = served
    schema = httpx.get(server.url + "/api/openapi.json").json()
    operations = {op["operationId"] for path in schema["paths"].values() for op in path.values()}
    assert {op.name for op in OPERATIONS} | {"health", "otlp_traces"} == operations
    assert schema["openapi"].startswith("3.1") and "Span" in schema["components"]["schemas"]


def test_other_routes_are_served_next_to_the_api() -> None:
    async def models(request: Request) -> Response:
        return JSONResponse({"data": [{"id": "m"}]})

    app = create_app(MemoryStore(), token="t", extra_routes=[Route("/v1/models", models)])
    with ServerThread(app) as server:
        assert httpx.get(server.url + "/v1/models").status_code == 401  # the token guards them too
        answer = httpx.get(server.url + "/v1/models", headers={"authorization": "Bearer t"})
        assert answer.json() == {"data": [{"id": "m"}]}


def test_the_client_waits_for_a_server_that_is_not_up_yet() -> None:
    port = free_port()
    store = MemoryStore()

    async def call() -> None:
        client = StoreClient(f"http://127.0.0.1:{port}", retry_seconds=20)
        task = asyncio.create_task(client.enqueue_rollout("late"))
        await asyncio.sleep(0.3)
        assert not task.done()  # still retrying
        server = await asyncio.to_thread(lambda: ServerThread(create_app(store), port=port).start())
        try:
            rollout = await asyncio.wait_for(task, 10)
            assert (await store.get_rollout(rollout.rollout_id)).input == "late"
        finally:
            await asyncio.to_thread(server.stop)

    asyncio.run(call())


def test_5xx_answers_are_retried_4xx_answers_are_not() -> None:
    hits = {"stats": 0, "rollout": 0}

    async def flaky_stats(request: Request) -> Response:
        hits["stats"] += 1
        if hits["stats"] < 3:
            return JSONResponse({"error": "Busy", "detail": "try later"}, status_code=503)
        stats = {"rollouts": {}, "attempts": {}, "spans": 0, "workers": 0, "resources": 0}
        return Response(json.dumps(stats), media_type="application/json")

    async def missing(request: Request) -> Response:
        hits["rollout"] += 1
        return JSONResponse({"error": "NotFoundError", "detail": "no rollout with id 'ro-x'"}, status_code=404)

    app = Starlette(routes=[Route("/api/stats", flaky_stats), Route("/api/rollouts/{rollout_id}", missing)])
    with ServerThread(app) as server:

        async def call() -> None:
            client = StoreClient(server.url)
            assert (await client.stats()).spans == 0
            with pytest.raises(NotFoundError, match="ro-x"):
                await client.get_rollout("ro-x")

        asyncio.run(call())
    assert hits == {"stats": 3, "rollout": 1}


def test_a_server_that_stays_down_is_reported_after_the_retry_window() -> None:
    async def call() -> None:
        client = StoreClient(f"http://127.0.0.1:{free_port()}", retry_seconds=0.5)
        with pytest.raises(StoreUnreachable, match="failed for"):
            await client.stats()

    asyncio.run(call())


def test_the_client_raises_what_local_stores_raise() -> None:
    with store_server(MemoryStore()) as server:

        async def call() -> None:
            client = StoreClient(server.url)
            started = await client.start_rollout("t")
            await client.update_attempt(started.rollout_id, started.attempt.attempt_id, status="succeeded")
            with pytest.raises(InvalidTransitionError, match="already succeeded"):
                await client.update_rollout(started.rollout_id, status="cancelled")
            with pytest.raises(NotFoundError):
                await client.get_resources("res-404")

        asyncio.run(call())


def test_the_client_keeps_its_connection_alive_between_calls() -> None:
    ports = []

    async def stats(request: Request) -> Response:
        assert request.client is not None
        ports.append(request.client.port)
        return Response(b'{"rollouts": {}, "attempts": {}, "spans": 0, "workers": 0, "resources": 0}',
                        media_type="application/json")

    with ServerThread(Starlette(routes=[Route("/api/stats", stats)])) as server:

        async def calls() -> None:
            client = StoreClient(server.url)
            for _ in range(5):
                await client.stats()

        asyncio.run(calls())
    assert len(ports) == 5 and len(set(ports)) == 1


def test_waiting_for_rollouts_is_one_long_poll_not_a_stream_of_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = ConnectionPool.request

    async def counted(self, method, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(path)
        return await original(self, method, path, *args, **kwargs)

    monkeypatch.setattr(ConnectionPool, "request", counted)
    store = MemoryStore()
    with store_server(store) as server:

        async def wait() -> None:
            client = StoreClient(server.url)
            started = await store.start_rollout("t")
            finisher = asyncio.get_running_loop().call_later(
                0.8, lambda: asyncio.ensure_future(
                    store.update_attempt(started.rollout_id, started.attempt.attempt_id, status="succeeded")))
            (done,) = await client.wait_for_rollouts([started.rollout_id], timeout=10)
            finisher.cancel()
            assert done.status.value == "succeeded"

        asyncio.run(wait())
    assert calls == ["/api/rollouts/wait"]


def test_concurrent_one_span_writes_share_requests_and_each_caller_gets_its_own_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    paths: list[str] = []
    original = ConnectionPool.request

    async def counted(self, method, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        paths.append(path)
        return await original(self, method, path, *args, **kwargs)

    monkeypatch.setattr(ConnectionPool, "request", counted)
    store = MemoryStore()
    with store_server(store) as server:

        async def write() -> None:
            client = StoreClient(server.url)
            started = await client.start_rollout("t")
            rid, aid = started.rollout_id, started.attempt.attempt_id
            spans = [Span(rollout_id=rid, attempt_id=aid, name=f"s{i}") for i in range(40)]
            stored = await asyncio.gather(*(client.add_span(span) for span in spans))
            assert sorted(s.sequence_id for s in stored) == list(range(1, 41))
            assert {s.name: s.sequence_id for s in stored} == {s.name: s.sequence_id for s in await store.query_spans(rid)}
            # a bad span among good ones fails its own call only
            calls = [client.add_span(Span(rollout_id=rid, attempt_id=aid, name="good-1")),
                     client.add_span(Span(rollout_id=rid, attempt_id="at-nope", name="bad")),
                     client.add_span(Span(rollout_id=rid, attempt_id=aid, name="good-2"))]
            good_1, bad, good_2 = await asyncio.gather(*calls, return_exceptions=True)
            assert isinstance(bad, NotFoundError) and "at-nope" in str(bad)
            assert good_1.name == "good-1" and good_2.name == "good-2"  # type: ignore[union-attr]
            assert [s.name for s in await store.query_spans(rid)][-2:] == ["good-1", "good-2"]
            await client.close()

        asyncio.run(write())
    span_requests = [p for p in paths if p == "/api/spans"]
    assert len(span_requests) < 40 / 4  # coalesced: most writes rode along with another's request


def test_a_retried_write_after_a_restart_on_the_same_file_gets_its_first_answer(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "store.db"
    asyncio.run(SqliteStore(path).enqueue_rollouts([{"input": 1}, {"input": 2}]))
    headers = {"idempotency-key": "k-dequeue"}
    with ServerThread(create_app(SqliteStore(path))) as server:
        first = httpx.post(server.url + "/api/rollouts/dequeue", json={"worker_id": "w"}, headers=headers).json()
        aid, rid = first["attempt"]["attempt_id"], first["rollout_id"]
        done = httpx.patch(f"{server.url}/api/rollouts/{rid}/attempts/{aid}", json={"status": "succeeded"},
                           headers={"idempotency-key": "k-done"})
        assert done.status_code == 200
    with ServerThread(create_app(SqliteStore(path))) as server:  # a new process would see the same file
        again = httpx.post(server.url + "/api/rollouts/dequeue", json={"worker_id": "w"}, headers=headers)
        assert again.json() == first  # the same claim, not the next rollout
        redone = httpx.patch(f"{server.url}/api/rollouts/{rid}/attempts/{aid}", json={"status": "succeeded"},
                             headers={"idempotency-key": "k-done"})
        assert redone.status_code == 200 and redone.json() == done.json()  # not a 409
        for _ in range(2):
            httpx.post(server.url + "/api/rollouts", json={"requests": [{"input": 3}]}, headers={"idempotency-key": "k-q"})
            httpx.post(server.url + "/api/metrics", json={"metrics": [{"name": "m", "step": 0, "value": 1.0}]},
                       headers={"idempotency-key": "k-m"})
    restarted = SqliteStore(path)
    assert asyncio.run(restarted.stats()).rollouts == {"queuing": 2, "succeeded": 1}  # enqueued once
    assert len(asyncio.run(restarted.query_metrics("m"))) == 1  # stored once


def test_a_reward_that_is_no_number_is_a_4xx_that_says_so(served) -> None:  # type: ignore[no-untyped-def]
    store, server = served
    started = asyncio.run(store.start_rollout("t"))
    url = f"{server.url}/api/rollouts/{started.rollout_id}/attempts/{started.attempt.attempt_id}"
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        answer = httpx.patch(url, content=b'{"status": "succeeded", "reward": ' + literal + b"}",
                             headers={"content-type": "application/json"})
        assert answer.status_code == 400 and "not a finite number" in answer.json()["detail"], answer.text
    assert asyncio.run(store.get_rollout(started.rollout_id)).status.value == "running"


def test_the_operation_table_covers_every_store_method_with_its_own_parameter_names() -> None:
    import inspect

    from agentgrad.store import Store
    from agentgrad.store.api import BY_NAME

    public = {name for name, member in inspect.getmembers(Store, inspect.iscoroutinefunction)
              if not name.startswith("_") and name not in ("close", "run_once", "enqueue_rollout", "add_span")}
    assert public == set(BY_NAME)
    for name, operation in BY_NAME.items():
        parameters = set(inspect.signature(getattr(Store, name)).parameters) - {"self"}
        model = operation.body or operation.query
        sent = set(operation.path_params) | (set(model.model_fields) if model else set())
        assert sent == parameters, name


def test_a_metric_value_json_cannot_carry_is_a_4xx_naming_it(served) -> None:  # type: ignore[no-untyped-def]
    store, server = served
    answer = httpx.post(server.url + "/api/metrics", content=b'{"metrics": [{"name": "m", "step": 0, "value": 1}, '
                        b'{"name": "train/loss", "step": 3, "value": NaN}]}', headers={"content-type": "application/json"})
    assert answer.status_code == 422 and "metrics[1].value ('train/loss' at step 3) is nan" in answer.json()["detail"]
    assert asyncio.run(store.query_metrics()) == []
