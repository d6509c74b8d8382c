"""The store server: every `Store` operation over HTTP under `/api/`, plus OTLP ingest at `/v1/traces`.

`create_app(store)` is an ASGI app; other routes (the gateway, a dashboard) join it through
`extra_routes`, served by Starlette. A call to a store operation is answered directly, without
Starlette's router and middleware stack: per call, that stack cost as much CPU as the store's
own work. Paths that match no operation (404) or not its method (405, with `Allow`) fall through
to Starlette, which has the same routes.

Bad input never changes anything and always gets a 4xx whose JSON body says what was wrong
(`http_errors`). The host, cross-site, token and body checks (`agentgrad.serving.guard.Guard`) wrap the
whole app as one ASGI layer, the one the gateway and the engine run behind too. Inside it, every
request is counted for Prometheus and `GET /metrics` answers (`agentgrad.serving.metrics`, `store/metrics.py`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl

from pydantic import TypeAdapter
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from agentgrad.dashboard import dashboard_routes
from agentgrad.serving import ServerThread
from agentgrad.serving.guard import Guard, check_exposure, read_body, store_errors
from agentgrad.serving.metrics import ROUTE_KEY, ServerMetrics, instrument
from agentgrad.store.api import JSON, OPERATIONS, Operation, arguments, openapi_schema
from agentgrad.store.base import Store
from agentgrad.store.http_errors import error_response, exception_answer
from agentgrad.store.idempotency import Answer
from agentgrad.store.metrics import store_snapshot
from agentgrad.store.otlp import otlp_traces

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest request body accepted (413 above): room for big batches of spans with token ids."""

UVICORN_OPTIONS: dict[str, Any] = {
    "timeout_graceful_shutdown": 5,  # then long-polls are cut; their clients ask again elsewhere or later
    "proxy_headers": False,
    "server_header": False,
    "date_header": False,
}


class _Handler:
    """One operation: validates its input, calls the store method it names, serializes the result.

    A write with an idempotency key runs through `store.run_once`, so its retries get the first answer,
    unless the store recognizes a repeat of this very body by itself (`Operation.repeat_safe`)."""

    def __init__(self, operation: Operation) -> None:
        self.operation = operation
        self.result = TypeAdapter(operation.response)

    async def __call__(self, store: Store, body: bytes, query: str, key: str | None, path: dict[str, str]) -> Answer:
        operation = self.operation
        try:
            if operation.body is not None:
                argument: Any = operation.body.model_validate_json(body or b"{}", strict=True)
            elif operation.query is not None:
                argument = operation.query.model_validate(dict(parse_qsl(query, keep_blank_values=True)))
            else:
                argument = None
        except Exception as exc:
            return exception_answer(exc)
        if key is not None and operation.once and not (operation.repeat_safe and operation.repeat_safe(argument)):
            try:
                return await store.run_once(f"{operation.name}:{key}", lambda: self._answer(store, argument, path))
            except Exception as exc:  # keeping the answer failed (a full disk, say): nothing was applied
                return exception_answer(exc)
        return await self._answer(store, argument, path)

    async def _answer(self, store: Store, argument: Any, path: dict[str, str]) -> Answer:
        operation = self.operation
        try:
            result = await getattr(store, operation.name)(**arguments(operation, argument, path))
            if operation.reply is not None:
                result = operation.reply(result)
        except Exception as exc:
            return exception_answer(exc)
        return 200, self.result.dump_json(result)

    async def endpoint(self, request: Request) -> Response:
        """The same, as a Starlette endpoint."""
        key = request.headers.get("idempotency-key")
        status, body = await self(
            request.app.state.store, await request.body(), request.url.query, key, request.path_params
        )
        return Response(body, status_code=status, media_type=JSON)


class _Dispatch:
    """Answers store operations directly; everything else goes to the Starlette app."""

    def __init__(self, app: Starlette, handlers: Sequence[_Handler]) -> None:
        self.app = app
        self.state = app.state
        self.static: dict[tuple[str, str], _Handler] = {}
        self.patterns: list[tuple[str, re.Pattern[str], _Handler]] = []
        for handler in handlers:
            path = handler.operation.path
            if "{" in path:
                regex = re.compile("^" + re.sub(r"{(\w+)}", r"(?P<\1>[^/]+)", path) + "$")
                self.patterns.append((handler.operation.method, regex, handler))
            else:
                self.static[(handler.operation.method, path)] = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/api/"):
            method, path = scope["method"], scope["path"]
            handler, params = self.static.get((method, path)), {}
            if handler is None:
                for verb, regex, candidate in self.patterns:
                    if verb == method and (match := regex.match(path)):
                        handler, params = candidate, match.groupdict()
                        break
            if handler is not None:
                scope[ROUTE_KEY] = handler.operation.path
                body = await read_body(receive)  # the guard in front holds it to its limit
                if body is None:
                    return  # the client went away
                key = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"idempotency-key"), None)
                query = scope["query_string"].decode("latin-1")
                status, payload = await handler(self.state.store, body, query, key, params)
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": payload})
                return
        await self.app(scope, receive, send)


def _is_public(path: str) -> bool:
    """Health and the dashboard's static page need no token (a browser cannot send one to open
    a page); every call for data does."""
    return path in ("/api/health", "/") or path.startswith("/dashboard/")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        detail = f"no route {request.method} {request.url.path}; the store API is under /api/ (see /api/openapi.json)"
    elif exc.status_code == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
    else:
        detail = str(exc.detail)
    return error_response(exc.status_code, "HTTPError", detail, headers=exc.headers)


async def _health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def create_app(
    store: Store,
    *,
    token: str | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
    on_shutdown: Sequence[Callable[[], Awaitable[None]]] = (),
    metrics: ServerMetrics | None = None,
) -> Guard:
    """The store server as an ASGI app, behind the guard (`agentgrad.serving.guard`): the API under `/api/`, OTLP ingest, the dashboard at `/`,
    Prometheus metrics at `/metrics`. With `token`, every request for data needs `Authorization: Bearer <token>`. `extra_routes`
    (the gateway, say) are served after the API's; `on_shutdown` coroutines (the gateway's `aclose`)
    run when the server stops; `metrics`: the registry to export into (a mounted gateway's, so one scrape reads
    both). `app.state.store` is the store it serves."""
    handlers = [_Handler(operation) for operation in OPERATIONS]
    schema: dict[str, Any] = {}

    async def openapi(request: Request) -> Response:
        if not schema:
            schema.update(openapi_schema())
        return JSONResponse(schema)

    by_path: dict[str, dict[str, _Handler]] = {}
    for handler in handlers:
        by_path.setdefault(handler.operation.path, {})[handler.operation.method] = handler
    routes: list[BaseRoute] = [Route("/api/health", _health), Route("/api/openapi.json", openapi)]
    for path, methods in by_path.items():  # one route per path, so a 405 lists all its methods in `Allow`
        routes.append(Route(path, _by_method(methods), methods=list(methods)))
    routes += [Route("/v1/traces", otlp_traces, methods=["POST"]), *extra_routes, *dashboard_routes()]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        for close in on_shutdown:
            await close()

    starlette = Starlette(routes=routes, exception_handlers={HTTPException: _http_error}, lifespan=lifespan)
    starlette.state.store = store
    starlette.state.max_body_bytes = max_body_bytes
    metrics = metrics or ServerMetrics()
    metrics.add(store_snapshot(lambda: starlette.state.store))
    app = Guard(
        instrument(_Dispatch(starlette, handlers), metrics, "store"),
        token=token,
        public=_is_public,
        errors=store_errors,
        max_body_bytes=max_body_bytes,
    )
    app.state = starlette.state  # type: ignore[attr-defined]
    starlette.state.metrics = metrics
    return app


def _by_method(handlers: dict[str, _Handler]) -> Any:
    async def endpoint(request: Request) -> Response:
        return await handlers[request.method].endpoint(request)

    return endpoint


def store_server(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    advertise: str | None = None,
) -> ServerThread:
    """The store server, ready to run in a background thread: `with store_server(store) as server:`
    (or `.start()`); `server.url` says where, at `advertise` when given (the address other hosts reach it by)."""
    check_exposure(host, token)
    app = create_app(store, token=token, extra_routes=extra_routes)
    return ServerThread(app, host=host, port=port, advertise=advertise, **UVICORN_OPTIONS)
