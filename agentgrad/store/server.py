"""The store server: every `Store` operation over HTTP under `/api/`, plus OTLP ingest at `/v1/traces`.

`create_app(store)` is an ASGI app; other routes (the gateway, a dashboard) join it through
`extra_routes`, served by Starlette. A call to a store operation is answered directly, without
Starlette's router and middleware stack: per call, that stack cost as much CPU as the store's
own work. Paths that match no operation (404) or not its method (405, with `Allow`) fall through
to Starlette, which has the same routes.

Bad input never changes anything and always gets a 4xx whose JSON body says what was wrong:
`{"error": "NotFoundError", "detail": "no rollout with id 'ro-x'"}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl

from pydantic import TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from agentgrad.guard import Guard, check_exposure, store_errors
from agentgrad.serving import ServerThread
from agentgrad.store.api import JSON, OPERATIONS, Operation, openapi_schema
from agentgrad.store.base import InvalidTransitionError, NotFoundError, Store, StoreError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest request body accepted (413 above): room for big batches of spans with token ids."""

REPLAY_ENTRIES = 4096
"""Answers remembered by idempotency key, so a client's retry of a write is not applied twice."""

UVICORN_OPTIONS: dict[str, Any] = {
    "timeout_keep_alive": 75,  # clients drop idle connections after 30 s, before the server does
    "timeout_graceful_shutdown": 5,  # then long-polls are cut; their clients ask again elsewhere or later
    "proxy_headers": False,
    "server_header": False,
    "date_header": False,
}

Answer = tuple[int, bytes]


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than the server's limit of {limit} bytes; send smaller batches")


def problem(status: int, error: str, detail: str) -> Answer:
    return status, json.dumps({"error": error, "detail": detail}).encode()


def error_response(status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


def validation_message(exc: ValidationError) -> str:
    """`spans.0.name: Field required; ...`: where each problem is and what it is."""
    parts = []
    for error in exc.errors(include_url=False)[:10]:
        where = ".".join(str(part) for part in error["loc"])
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts)


def exception_answer(exc: BaseException) -> Answer:
    """The 4xx a store exception means; anything unexpected is a logged 500."""
    if isinstance(exc, BodyTooLarge):
        return problem(413, "BodyTooLarge", str(exc))
    if isinstance(exc, ValidationError):
        return problem(422, "ValidationError", validation_message(exc))
    if isinstance(exc, NotFoundError):
        return problem(404, "NotFoundError", str(exc))
    if isinstance(exc, InvalidTransitionError):
        return problem(409, "InvalidTransitionError", str(exc))
    if isinstance(exc, StoreError):
        return problem(400, "StoreError", str(exc))
    if isinstance(exc, (ValueError, OverflowError)):  # bad enum values and numbers a backend cannot hold
        return problem(422, "ValueError", str(exc))
    log.error("store server failed", exc_info=exc)
    return problem(500, "InternalError", f"{type(exc).__name__}: {exc}")


def exception_response(exc: BaseException) -> Response:
    status, body = exception_answer(exc)
    return Response(body, status_code=status, media_type=JSON)


class _Replays:
    """Answers of recent writes by idempotency key: a retried write gets the first answer back."""

    def __init__(self, size: int = REPLAY_ENTRIES) -> None:
        self._size = size
        self._done: OrderedDict[str, Answer] = OrderedDict()
        self._running: dict[str, asyncio.Future[Answer]] = {}

    async def run(self, key: str, work: Callable[[], Awaitable[Answer]]) -> Answer:
        if key in self._done:
            return self._done[key]
        if key in self._running:  # the first try is still being answered
            return await asyncio.shield(self._running[key])
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            answer = await work()
            if answer[0] < 500:
                self._done[key] = answer
                if len(self._done) > self._size:
                    self._done.popitem(last=False)
            future.set_result(answer)
            return answer
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: nobody may be waiting
            raise
        finally:
            del self._running[key]


class _Handler:
    """One operation: validates its input, calls the store, serializes the result."""

    def __init__(self, operation: Operation, replays: _Replays) -> None:
        self.operation = operation
        self.replays = replays
        self.result = TypeAdapter(operation.response)

    async def __call__(self, store: Store, body: bytes, query: str, key: str | None, path: dict[str, str]) -> Answer:
        if key is not None and self.operation.body is not None:
            return await self.replays.run(key, lambda: self._answer(store, body, query, path))
        return await self._answer(store, body, query, path)

    async def _answer(self, store: Store, body: bytes, query: str, path: dict[str, str]) -> Answer:
        operation = self.operation
        try:
            if operation.body is not None:
                argument: Any = operation.body.model_validate_json(body or b"{}", strict=True)
            elif operation.query is not None:
                argument = operation.query.model_validate(dict(parse_qsl(query, keep_blank_values=True)))
            else:
                argument = None
            result = await operation.call(store, argument, **path)
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
                body = await _read_body(receive)
                if body is None:
                    return  # the client went away
                key = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"idempotency-key"), None)
                query = scope["query_string"].decode("latin-1")
                status, payload = await handler(self.state.store, body, query, key, params)
                await send({"type": "http.response.start", "status": status, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
                await send({"type": "http.response.body", "body": payload})
                return
        await self.app(scope, receive, send)


async def _read_body(receive: Receive) -> bytes | None:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


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
) -> Guard:
    """The store server as an ASGI app, behind the guard (`agentgrad.guard`): the API under `/api/`, OTLP ingest, the dashboard at `/`.
    With `token`, every request for data needs `Authorization: Bearer <token>`. `extra_routes`
    (the gateway, say) are served after the API's; `on_shutdown` coroutines (the gateway's `aclose`)
    run when the server stops. `app.state.store` is the store it serves."""
    from agentgrad.dashboard import dashboard_routes
    from agentgrad.store.otlp import otlp_traces

    replays = _Replays()
    handlers = [_Handler(operation, replays) for operation in OPERATIONS]
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
    app = Guard(_Dispatch(starlette, handlers), token=token, public=_is_public, errors=store_errors,
                max_body_bytes=max_body_bytes)
    app.state = starlette.state  # type: ignore[attr-defined]
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
) -> ServerThread:
    """The store server, ready to run in a background thread: `with store_server(store) as server:`
    (or `.start()`); `server.url` says where."""
    check_exposure(host, token)
    app = create_app(store, token=token, extra_routes=extra_routes)
    return ServerThread(app, host=host, port=port, **UVICORN_OPTIONS)
