"""The store server: every `Store` operation over HTTP under `/api/`, plus OTLP ingest at `/v1/traces`.

`create_app(store)` is a Starlette app; other routes (the gateway, a dashboard) join it through
`extra_routes`. Starlette rather than FastAPI because FastAPI's per-request machinery doubled
the server's cost per call; the OpenAPI schema is generated from the same pydantic models
(`agentgrad.store.api`) that validate the requests.

Bad input never changes anything and always gets a 4xx whose JSON body says what was wrong:
`{"error": "NotFoundError", "detail": "no rollout with id 'ro-x'"}`.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentgrad.serving import ServerThread
from agentgrad.store.api import OPERATIONS, Operation
from agentgrad.store.base import InvalidTransitionError, NotFoundError, Store, StoreError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
"""Largest request body accepted (413 above): room for big batches of spans with token ids."""

REPLAY_ENTRIES = 4096
"""Answers remembered by idempotency key, so a client's retry of a write is not applied twice."""

KEEP_ALIVE_SECONDS = 75
"""How long the server keeps an idle client connection (clients drop theirs after 30 s)."""

JSON = "application/json"


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than the server's limit of {limit} bytes; send smaller batches")


def error_response(status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


def validation_message(exc: ValidationError) -> str:
    """`body.spans.0.name: Field required; ...`: where each problem is and what it is."""
    parts = []
    for error in exc.errors(include_url=False)[:10]:
        where = ".".join(str(part) for part in error["loc"])
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts)


def exception_response(exc: BaseException) -> Response:
    """The 4xx a store exception means; anything unexpected is a logged 500."""
    if isinstance(exc, BodyTooLarge):
        return error_response(413, "BodyTooLarge", str(exc))
    if isinstance(exc, ValidationError):
        return error_response(422, "ValidationError", validation_message(exc))
    if isinstance(exc, NotFoundError):
        return error_response(404, "NotFoundError", str(exc))
    if isinstance(exc, InvalidTransitionError):
        return error_response(409, "InvalidTransitionError", str(exc))
    if isinstance(exc, StoreError):
        return error_response(400, "StoreError", str(exc))
    if isinstance(exc, (ValueError, OverflowError)):  # bad enum values and numbers a backend cannot hold
        return error_response(422, "ValueError", str(exc))
    log.error("store server failed", exc_info=exc)
    return error_response(500, "InternalError", f"{type(exc).__name__}: {exc}")


class _Replays:
    """Answers of recent writes by idempotency key: a retried write gets the first answer back."""

    def __init__(self, size: int = REPLAY_ENTRIES) -> None:
        self._size = size
        self._done: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._running: dict[str, asyncio.Future[tuple[int, bytes]]] = {}

    async def run(self, key: str, work: Callable[[], Awaitable[Response]]) -> Response:
        if key in self._done:
            status, body = self._done[key]
            return Response(body, status_code=status, media_type=JSON)
        if key in self._running:  # the first try is still being answered
            status, body = await asyncio.shield(self._running[key])
            return Response(body, status_code=status, media_type=JSON)
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            response = await work()
            outcome = (response.status_code, bytes(response.body))
            if response.status_code < 500:
                self._done[key] = outcome
                if len(self._done) > self._size:
                    self._done.popitem(last=False)
            future.set_result(outcome)
            return response
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: nobody may be waiting
            raise
        finally:
            del self._running[key]


def _endpoint(operation: Operation, replays: _Replays) -> Callable[[Request], Awaitable[Response]]:
    response_type = TypeAdapter(operation.response)

    async def answer(request: Request) -> Response:
        try:
            if operation.body is not None:
                argument: Any = operation.body.model_validate_json((await request.body()) or b"{}", strict=True)
            elif operation.query is not None:
                argument = operation.query.model_validate(dict(request.query_params))
            else:
                argument = None
            result = await operation.call(request.app.state.store, argument, **request.path_params)
        except Exception as exc:
            return exception_response(exc)
        return Response(response_type.dump_json(result), media_type=JSON)

    async def endpoint(request: Request) -> Response:
        key = request.headers.get("idempotency-key") if operation.body is not None else None
        if key is None:
            return await answer(request)
        return await replays.run(key, lambda: answer(request))

    return endpoint


def _by_method(endpoints: dict[str, Callable[[Request], Awaitable[Response]]]) -> Callable[[Request], Awaitable[Response]]:
    """One route per path, so a 405 lists every method the path has in `Allow`."""

    async def endpoint(request: Request) -> Response:
        return await endpoints[request.method](request)

    return endpoint


class _Guard:
    """Bearer-token check and request size limit, for every route of the app."""

    def __init__(self, app: ASGIApp, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.expected = None if token is None else f"Bearer {token}".encode()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if (
            self.expected is not None
            and scope["path"] != "/api/health"
            and not hmac.compare_digest(headers.get(b"authorization", b""), self.expected)
        ):
            response = error_response(
                401, "Unauthorized", "this server needs 'Authorization: Bearer <token>' with the token it was started with",
                headers={"www-authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > self.max_body_bytes:
                await exception_response(BodyTooLarge(self.max_body_bytes))(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        await self._counting(scope, receive, send)

    async def _counting(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A body without a declared length (chunked) is counted as it arrives."""
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                raise BodyTooLarge(self.max_body_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await exception_response(exc)(scope, receive, send)


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


def openapi_schema(operations: Sequence[Operation] = OPERATIONS) -> dict[str, Any]:
    """OpenAPI 3.1 for the store API, from the pydantic models that validate its requests."""
    components: dict[str, Any] = {
        "Error": {
            "type": "object",
            "properties": {"error": {"type": "string"}, "detail": {"type": "string"}},
            "required": ["error", "detail"],
        }
    }

    def schema_of(annotation: Any) -> dict[str, Any]:
        schema = TypeAdapter(annotation).json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        return schema

    errors = {"$ref": "#/components/schemas/Error"}
    paths: dict[str, Any] = {
        "/api/health": {"get": {"operationId": "health", "summary": "Is the server up?", "responses": {"200": {
            "description": "up", "content": {JSON: {"schema": {"type": "object"}}}}}}},
    }
    for operation in operations:
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in re.findall(r"{(\w+)}", operation.path)
        ]
        if operation.query is not None:
            query = schema_of(operation.query)
            for name, prop in query["properties"].items():
                parameters.append({"name": name, "in": "query", "required": name in query.get("required", ()), "schema": prop})
        entry: dict[str, Any] = {
            "operationId": operation.name,
            "summary": operation.summary,
            "parameters": parameters,
            "responses": {
                "200": {"description": operation.summary, "content": {JSON: {"schema": schema_of(operation.response)}}},
                "default": {"description": "what was wrong", "content": {JSON: {"schema": errors}}},
            },
        }
        if operation.body is not None:
            required = any(field.is_required() for field in operation.body.model_fields.values())
            entry["requestBody"] = {"required": required, "content": {JSON: {"schema": schema_of(operation.body)}}}
        paths.setdefault(operation.path, {})[operation.method.lower()] = entry
    paths["/v1/traces"] = {"post": {
        "operationId": "otlp_traces",
        "summary": "OTLP/HTTP trace export (protobuf or JSON); spans with agentgrad.rollout_id land in that rollout.",
        "requestBody": {"required": True, "content": {
            JSON: {"schema": {"type": "object"}},
            "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
        }},
        "responses": {
            "200": {"description": "accepted, maybe partially", "content": {
                JSON: {"schema": {"type": "object"}},
                "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
            }},
            "default": {"description": "what was wrong", "content": {JSON: {"schema": errors}}},
        },
    }}
    return {
        "openapi": "3.1.0",
        "info": {"title": "agentgrad store", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }


def create_app(
    store: Store,
    *,
    token: str | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """The store server as an ASGI app. With `token`, every request but `/api/health` needs
    `Authorization: Bearer <token>`. `extra_routes` (the gateway, say) are served after the API's."""
    from agentgrad.store.otlp import otlp_traces

    replays = _Replays()
    schema: dict[str, Any] = {}

    async def openapi(request: Request) -> Response:
        if not schema:
            schema.update(openapi_schema())
        return JSONResponse(schema)

    routes: list[BaseRoute] = [Route("/api/health", _health), Route("/api/openapi.json", openapi)]
    by_path: dict[str, dict[str, Callable[[Request], Awaitable[Response]]]] = {}
    for operation in OPERATIONS:
        by_path.setdefault(operation.path, {})[operation.method] = _endpoint(operation, replays)
    routes += [Route(path, _by_method(endpoints), methods=list(endpoints)) for path, endpoints in by_path.items()]
    routes += [Route("/v1/traces", otlp_traces, methods=["POST"]), *extra_routes]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    app.state.store = store
    app.state.max_body_bytes = max_body_bytes
    app.add_middleware(_Guard, token=token, max_body_bytes=max_body_bytes)
    return app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None) -> None:
    """Refuse to serve a store beyond this machine without a token: anyone reaching it could change it."""
    if token is None and not is_loopback(host):
        raise ValueError(
            f"refusing to serve the store on {host!r} without a token: anyone who can reach it could read and "
            "change it. Pass --token (or set AGENTGRAD_TOKEN), or bind to 127.0.0.1"
        )


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
    return ServerThread(app, host=host, port=port, timeout_keep_alive=KEEP_ALIVE_SECONDS)
