"""The gateway: an OpenAI-compatible proxy that records every model call as a span in the store.

Agents call `/v1/chat/completions`, `/v1/completions` or `/v1/models`, under
`/rollouts/{rollout_id}/attempts/{attempt_id}` (what `LLM.for_attempt` hands them) or at the
root with the `x-agentgrad-rollout-id` / `x-agentgrad-attempt-id` headers. The headers win
when both are given: they are set per call, the path only when the client was built. Calls
with neither are recorded outside any rollout.

The gateway asks the upstream for token ids and logprobs (vLLM's `return_token_ids`,
`logprobs`), records them, and strips what it added, so the client gets the response it
asked for. Spans are built after the last byte went to the client and written in background
batches. The hot path is a bare ASGI app: no framework routing, orjson, one pooled aiohttp
session.

`POST …/v1/agentgrad/flush` returns once every call answered so far is in the store: the
runner calls it on each proxied LLM's route before it closes an attempt.

Standalone: `agentgrad gateway`, or `ServerThread(Gateway(store, backends))`. On a store
server: `routes=[*store_routes, *gateway.routes()]` or `Mount("/gateway", gateway)`; mounted
apps get no lifespan events, so the host calls `await gateway.aclose()` when it shuts down.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from agentgrad import llm_spans
from agentgrad.backends import (
    MAX_RETRIES,
    RETRY_BACKOFF_SECONDS,
    Added,
    Backend,
    GatewayError,
    Upstream,
    parse_backend,
    post_with_retries,
)
from agentgrad.llm_spans import CHAT, TEXT_COMPLETION
from agentgrad.serving import bearer_ok, expected_authorization
from agentgrad.store import NotFoundError, Store
from agentgrad.tracer import SpanSink
from agentgrad.types import ATTEMPT_ID_ATTR, ROLLOUT_ID_ATTR, Span, SpanStatus

__all__ = ["ATTEMPT_HEADER", "ROLLOUT_HEADER", "Backend", "Gateway", "GatewayError", "flush_gateways", "parse_backend"]

log = logging.getLogger(__name__)

ROLLOUT_HEADER = "x-agentgrad-rollout-id"
ATTEMPT_HEADER = "x-agentgrad-attempt-id"
MAX_BODY_BYTES = 32 * 2**20
"""Larger request bodies get a 413."""
MAX_UPSTREAM_CONNECTIONS = 1024
FLUSH_SECONDS = 10.0
SPAN_LINGER_SECONDS = 0.005
"""How long the span writer waits to gather a batch: one store write per few calls, not one per call."""

_ROUTE = re.compile(
    r"(?:/rollouts/(?P<rollout>[^/]+)/attempts/(?P<attempt>[^/]+))?"
    r"/v1/(?P<endpoint>chat/completions|completions|models|agentgrad/flush)/?"
)
_OPERATIONS = {"chat/completions": CHAT, "completions": TEXT_COMPLETION}
_ROLLOUT_KEY, _ATTEMPT_KEY = ROLLOUT_HEADER.encode(), ATTEMPT_HEADER.encode()
_VERSION_KEY = llm_spans.MODEL_VERSION_HEADER.encode()
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_NO_CLIENT_RETRY = (b"x-should-retry", b"false")  # the gateway already retried; the openai client obeys this


@dataclass
class _Call:
    """One proxied call, from the request to its span."""

    operation: str
    request: dict[str, Any]
    upstream: Upstream | None
    rollout_id: str | None
    attempt_id: str | None
    traceparent: bytes | None
    started: float = field(default_factory=time.perf_counter)
    start_time: float = field(default_factory=time.time)
    first_token: float | None = None


class _GatewaySink(SpanSink):
    """Batches gateway spans; a span naming an unknown rollout or attempt is kept outside any rollout."""

    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(store, loop)
        self._warned: set[tuple[str | None, str | None]] = set()

    async def _drain(self) -> None:
        await asyncio.sleep(SPAN_LINGER_SECONDS)
        await super()._drain()

    async def write(self, batch: list[Span]) -> None:
        try:
            await self.store.add_spans(batch)
            return
        except NotFoundError:
            pass
        except Exception:
            log.exception("gateway could not write %d span(s) to the store", len(batch))
            return
        for span in batch:  # one bad route must not cost the other spans of its batch
            try:
                await self.store.add_span(span)
            except NotFoundError as exc:
                if (span.rollout_id, span.attempt_id) not in self._warned:
                    self._warned.add((span.rollout_id, span.attempt_id))
                    log.warning(
                        "calls routed to %s/%s are recorded outside any rollout: %s",
                        span.rollout_id,
                        span.attempt_id,
                        exc,
                    )
                span.attributes.update({ROLLOUT_ID_ATTR: span.rollout_id, ATTEMPT_ID_ATTR: span.attempt_id})
                await super().write([span.model_copy(update={"rollout_id": None, "attempt_id": None})])
            except Exception:
                log.exception("gateway could not write span %r to the store", span.name)


class Gateway:
    """An ASGI app proxying OpenAI-compatible calls to `backends` (model name → upstream) and recording them.

    `default` serves models missing from the table; without it they get a 404 naming the known
    ones. `routers` (model → `agentgrad.replicas.ReplicaPool`) pick a replica per call and name
    the weights version it runs. With `token`, callers must send `Authorization: Bearer <token>`
    (their API key).
    """

    def __init__(
        self,
        store: Store,
        backends: Mapping[str, Backend | str] | None = None,
        *,
        default: Backend | str | None = None,
        token: str | None = None,
        max_retries: int = MAX_RETRIES,
        retry_backoff_s: float = RETRY_BACKOFF_SECONDS,
        close_store: bool = False,
        routers: Mapping[str, Any] | None = None,
    ) -> None:
        if not backends and default is None and not routers:
            raise ValueError("a gateway needs backends={model: Backend(url)} or default=Backend(url)")
        self.store = store
        self._upstreams = {
            name: Upstream.of(name, b if isinstance(b, Backend) else Backend(b)) for name, b in (backends or {}).items()
        }
        self._default = (
            None
            if default is None
            else Upstream.of("default", default if isinstance(default, Backend) else Backend(default))
        )
        self.token = token
        self._auth = expected_authorization(token)
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self._close_store = close_store
        self._routers = dict(routers or {})
        self._models_body = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {"id": n, "object": "model", "created": 0, "owned_by": u.backend.system}
                    for n, u in self._upstreams.items()
                ]
                + [{"id": n, "object": "model", "created": 0, "owned_by": r.system} for n, r in self._routers.items()],
            }
        )
        self._session: Any = None
        self._sink: _GatewaySink | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._recording = 0
        self._recorded = asyncio.Event()

    @property
    def models(self) -> list[str]:
        return [*self._upstreams, *self._routers]

    def routes(self) -> list[Any]:
        """Starlette routes serving the gateway at the root of a host app (a store server)."""
        from starlette.routing import Route

        return [
            Route("/v1/{path:path}", self),
            Route("/rollouts/{rollout_id}/attempts/{attempt_id}/v1/{path:path}", self),
        ]

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Open the upstream connection pool and the span writer on the running loop (done on first use)."""
        if self._session is not None:
            return
        import aiohttp

        self._loop = asyncio.get_running_loop()
        self._sink = _GatewaySink(self.store, self._loop)
        self._recorded = asyncio.Event()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=MAX_UPSTREAM_CONNECTIONS, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=None, connect=30),
            skip_auto_headers=("User-Agent",),
        )

    async def flush(self) -> None:
        """Return once every call answered so far is in the store. Safe from any event loop."""
        if self._loop is None or self._sink is None:
            return
        if asyncio.get_running_loop() is not self._loop:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.flush(), self._loop))
            return
        while self._recording:
            self._recorded.clear()
            await self._recorded.wait()
        await self._sink.flush()

    async def aclose(self) -> None:
        """Write the spans still buffered and close the connection pool (and the store, if owned)."""
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.aclose(), self._loop))
            return
        if self._session is not None:
            await self.flush()
            await self._session.close()
            self._session = None
        if self._close_store:
            await self.store.close()

    # ------------------------------------------------------------------ ASGI

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        match = _ROUTE.fullmatch(path)
        if match is None:
            return await _reject(
                send,
                404,
                f"no gateway route {path!r}; use /v1/chat/completions, /v1/completions or /v1/models, "
                "optionally under /rollouts/{rollout_id}/attempts/{attempt_id}",
                "not_found",
            )
        headers = dict(scope["headers"])
        if not bearer_ok(headers, self._auth):  # constant-time comparison
            message = "this gateway needs `Authorization: Bearer <token>`: use the gateway's token as the API key"
            return await _reject(send, 401, message, "invalid_api_key")
        endpoint, method = match["endpoint"], scope["method"]
        expected = "GET" if endpoint == "models" else "POST"
        if method != expected:
            return await _reject(send, 405, f"{path} takes {expected}, not {method}", "method_not_allowed")
        await self.start()
        if endpoint == "models":
            await _send_json(send, 200, self._models_body)
        elif endpoint == "agentgrad/flush":
            await self.flush()
            await _send_json(send, 200, b'{"flushed":true}')
        else:
            await self._proxy(_OPERATIONS[endpoint], match, headers, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _proxy(
        self, operation: str, match: re.Match[str], headers: dict[bytes, bytes], receive: Any, send: Any
    ) -> None:
        started, start_time = time.perf_counter(), time.time()
        rollout, attempt = headers.get(_ROLLOUT_KEY), headers.get(_ATTEMPT_KEY)
        if (rollout is None) != (attempt is None):
            return await _reject(send, 400, f"send both {ROLLOUT_HEADER} and {ATTEMPT_HEADER}, or neither")
        if rollout is not None:
            rollout_id, attempt_id = rollout.decode("latin-1"), attempt.decode("latin-1")  # type: ignore[union-attr]
        else:
            rollout_id, attempt_id = match["rollout"], match["attempt"]
        try:
            body = await _read_body(receive)
        except ConnectionError:
            return
        except ValueError as exc:
            return await _reject(send, 413, str(exc), "request_too_large")
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return await _reject(send, 400, f"request body is not valid JSON: {exc}")
        if not isinstance(request, dict) or not isinstance(request.get("model"), str):
            return await _reject(send, 400, "request body must be a JSON object with a 'model' string", "invalid_model")
        model = request["model"]
        router = self._routers.get(model)
        lease = await router.acquire(rollout_id) if router is not None else None
        upstream = lease.upstream if lease is not None else (self._upstreams.get(model) or self._default)
        try:
            call = _Call(
                operation, request, upstream, rollout_id, attempt_id, headers.get(b"traceparent"), started, start_time
            )
            if upstream is None:
                await self._fail(
                    send,
                    call,
                    GatewayError(
                        404,
                        f"model {model!r} is not served by this gateway; known models: {sorted(self._upstreams)}",
                        "invalid_request_error",
                        "model_not_found",
                    ),
                )
                return
            outgoing, added = upstream.prepare(request, operation)
            try:
                response, retries = await post_with_retries(
                    self._session,
                    upstream,
                    operation,
                    outgoing,
                    max_retries=self.max_retries,
                    backoff_s=self.retry_backoff_s,
                )
            except GatewayError as error:
                await self._fail(send, call, error)
                return
            try:
                version = response.headers.get(llm_spans.MODEL_VERSION_HEADER) or (str(lease.version) if lease else None)
                if response.status >= 400:
                    error = GatewayError.from_response(upstream, response.status, await response.read())
                    error.retries = retries
                    await self._fail(send, call, error)
                elif request.get("stream") and response.content_type == "text/event-stream":
                    await self._relay_stream(send, call, response, added, version, retries)
                else:
                    await self._relay(send, call, await response.read(), added, version, retries)
            finally:
                response.release()
        finally:
            if lease is not None:
                router.release(lease)

    async def _relay(
        self, send: Any, call: _Call, payload: bytes, added: Added, version: str | None, retries: int
    ) -> None:
        try:
            answer = orjson.loads(payload)
            if not isinstance(answer, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            text = payload[:200].decode("utf-8", "replace")
            await self._fail(
                send,
                call,
                GatewayError(
                    502,
                    f"upstream {call.upstream.name!r} answered with invalid JSON ({exc}): {text!r}",  # type: ignore[union-attr]
                    "upstream_error",
                    "bad_upstream_response",
                    retries,
                ),
            )
            return
        response_attributes = llm_spans.response_attributes(call.operation, answer, version)  # before stripping
        if added:
            added.strip(answer)
            payload = orjson.dumps(answer)
        self._recording += 1
        try:
            await _send_json(send, 200, payload, version)
        finally:
            self._record(call, response_attributes, None, retries)

    async def _relay_stream(
        self, send: Any, call: _Call, response: Any, added: Added, version: str | None, retries: int
    ) -> None:
        import aiohttp

        headers = _SSE_HEADERS if version is None else [*_SSE_HEADERS, (_VERSION_KEY, version.encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        assembler = llm_spans.StreamAssembler(call.operation)
        error: GatewayError | None = None
        pending = b""
        try:
            async for data in response.content.iter_any():
                if b"\r" in data:
                    data = data.replace(b"\r\n", b"\n")
                events = (pending + data).split(b"\n\n")
                pending = events.pop()
                out = b"".join([_relay_event(event, assembler, added, call) for event in events])
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            name = call.upstream.name if call.upstream else "?"
            message = f"upstream {name!r} broke off the stream: {type(exc).__name__}: {exc}"
            error = GatewayError(502, message, "upstream_error", "stream_interrupted", retries)
            await send({"type": "http.response.body", "body": b"data: " + error.body() + b"\n\n", "more_body": True})
        response_attributes = llm_spans.response_attributes(call.operation, assembler.result(), version)
        self._recording += 1
        try:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self._record(call, response_attributes, error, retries)

    async def _fail(self, send: Any, call: _Call, error: GatewayError) -> None:
        self._recording += 1
        try:
            await _send_error(send, error, extra=[_NO_CLIENT_RETRY])
        finally:
            self._record(call, {}, error, error.retries)

    def _record(
        self, call: _Call, response_attributes: dict[str, Any], error: GatewayError | None, retries: int
    ) -> None:
        """Build the call's span and queue it for the store (after the client got its answer)."""
        try:
            elapsed = time.perf_counter() - call.started
            system = call.upstream.backend.system if call.upstream else "openai"
            attributes = llm_spans.request_attributes(call.operation, call.request, system)
            if call.upstream is not None:
                attributes["server.address"], attributes["server.port"] = call.upstream.address, call.upstream.port
            attributes.update(response_attributes)
            attributes[llm_spans.LATENCY_MS] = round(elapsed * 1000, 3)
            if call.first_token is not None:
                attributes[llm_spans.TIME_TO_FIRST_TOKEN_MS] = round((call.first_token - call.started) * 1000, 3)
            if retries:
                attributes["agentgrad.llm.retries"] = retries
            status = SpanStatus(code="OK")
            if error is not None:
                attributes["error.type"] = error.code or str(error.status)
                attributes["http.response.status_code"] = error.status
                status = SpanStatus(code="ERROR", description=error.message)
            trace_id, parent_id = _parse_traceparent(call.traceparent)
            span = Span.model_construct(  # every field is built here, of the right type: no validation pass
                rollout_id=call.rollout_id,
                attempt_id=call.attempt_id,
                sequence_id=0,
                trace_id=trace_id or f"{random.getrandbits(128):032x}",
                span_id=f"{random.getrandbits(64):016x}",
                parent_id=parent_id,
                name=f"{call.operation} {call.request.get('model')}",
                start_time=call.start_time,
                end_time=call.start_time + elapsed,
                attributes=attributes,
                events=[],
                status=status,
            )
            self._sink.put(span)  # type: ignore[union-attr]
        except Exception:
            log.exception("could not record a call to %s", call.request.get("model"))
        finally:
            self._recording -= 1
            if not self._recording:
                self._recorded.set()


def _relay_event(event: bytes, assembler: llm_spans.StreamAssembler, added: Added, call: _Call) -> bytes:
    """One SSE event on its way to the client: parsed for the record, stripped of what the gateway added."""
    if not event.startswith(b"data:"):
        return event + b"\n\n" if event else b""
    data = event[5:].strip()
    if data == b"[DONE]":
        return event + b"\n\n"
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return event + b"\n\n"
    if not isinstance(chunk, dict):
        return event + b"\n\n"
    if call.first_token is None and chunk.get("choices"):
        call.first_token = time.perf_counter()
    assembler.add(chunk)
    if not added:
        return event + b"\n\n"
    if not added.strip(chunk):
        return b""
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _parse_traceparent(value: bytes | None) -> tuple[str | None, str | None]:
    """W3C `traceparent` (00-<trace id>-<parent span id>-<flags>): nests the call under the agent's span."""
    if value is None:
        return None, None
    parts = value.decode("latin-1").split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
        return parts[1], parts[2]
    return None, None


async def _read_body(receive: Any) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ValueError(f"request body over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _send_json(
    send: Any, status: int, body: bytes, version: str | None = None, extra: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode()), *extra]
    if version is not None:
        headers.append((_VERSION_KEY, version.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Any, error: GatewayError, extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await _send_json(send, error.status, error.body(), extra=extra)


async def _reject(send: Any, status: int, message: str, code: str | None = None) -> None:
    """Refuse a request the gateway cannot make sense of (it never reaches an upstream)."""
    await _send_error(send, GatewayError(status, message, "invalid_request_error", code))


# ----------------------------------------------------------------------------- runner side


async def flush_gateways(base_urls: Iterable[str], client: Any) -> None:
    """Ask the gateways at these routes (`…/v1`) to store every call answered so far.

    The runner calls this before it closes an attempt, so an algorithm that reads the spans of
    a finished rollout finds its last model call too. `client` is an `httpx.AsyncClient`.
    """
    for url in sorted({base.rstrip("/") + "/agentgrad/flush" for base in base_urls}):
        try:
            response = await client.post(url, timeout=FLUSH_SECONDS)
            if response.status_code != 200:
                log.warning("gateway flush at %s answered %d: %s", url, response.status_code, response.text[:200])
        except Exception as exc:
            log.warning("could not flush the gateway at %s: %s", url, exc)
