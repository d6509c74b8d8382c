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

Standalone: `agentgrad gateway`, or `ServerThread(Gateway(store, backends))`. On a store
server: `routes=[*store_routes, *gateway.routes()]` or `Mount("/gateway", gateway)`; mounted
apps get no lifespan events, so the host calls `await gateway.aclose()` when it shuts down.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from agentgrad import llm_spans
from agentgrad.llm_spans import CHAT, TEXT_COMPLETION
from agentgrad.store import NotFoundError, Store
from agentgrad.tracer import SpanSink
from agentgrad.types import ATTEMPT_ID_ATTR, LLM, ROLLOUT_ID_ATTR, Span, SpanStatus

log = logging.getLogger(__name__)

ROLLOUT_HEADER = "x-agentgrad-rollout-id"
ATTEMPT_HEADER = "x-agentgrad-attempt-id"
MAX_BODY_BYTES = 32 * 2**20
"""Larger request bodies get a 413."""
MAX_RETRIES = 3
"""Retries of an upstream 408/429/5xx or connection error, after the first try."""
RETRY_BACKOFF_SECONDS = 0.25
"""First pause between tries; doubles each time, with jitter; an upstream `Retry-After` is honoured."""
MAX_RETRY_WAIT_SECONDS = 20.0
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
UPSTREAM_TIMEOUT_SECONDS = 600.0
"""Longest silence from an upstream (between two stream chunks, or before an answer)."""
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
class Backend:
    """An OpenAI-compatible upstream: the local engine, a vLLM server, or a hosted API.

    `url` is its base URL (ending in `/v1`). `api_key_env` names an environment variable read
    when the gateway is built, so the key lives only in the gateway's process. `model` renames
    the model upstream. `token_ids=False` for upstreams that reject vLLM's `return_token_ids`
    (OpenAI itself), `logprobs=False` for models that cannot return logprobs.
    """

    url: str
    api_key: str | None = field(default=None, repr=False)
    api_key_env: str | None = None
    model: str | None = None
    system: str = "openai"
    token_ids: bool = True
    logprobs: bool = True
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    timeout_s: float = UPSTREAM_TIMEOUT_SECONDS


def parse_backend(spec: str) -> tuple[str, Backend]:
    """`NAME=URL[,key_env=VAR][,model=M][,system=S][,token_ids=false][,logprobs=false]` (the CLI's `--backend`)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"--backend {spec!r}: expected NAME=URL[,key_env=VAR,...]")
    url, *options = rest.split(",")
    backend = Backend(url=url)
    for option in options:
        key, _, value = option.partition("=")
        if key in ("token_ids", "logprobs"):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--backend {name}: {key} is true or false, not {value!r}")
            setattr(backend, key, value.lower() in ("true", "1"))
        elif key in ("key_env", "model", "system"):
            setattr(backend, "api_key_env" if key == "key_env" else key, value)
        else:
            raise ValueError(f"--backend {name}: unknown option {key!r} (key_env, model, system, token_ids, logprobs)")
    return name, backend


@dataclass(frozen=True)
class _Upstream:
    """A backend ready to call: its resolved URLs and headers (the key stays in here)."""

    name: str
    backend: Backend
    urls: dict[str, str]
    headers: dict[str, str] = field(repr=False)
    address: str = ""
    port: int = 0

    @classmethod
    def of(cls, name: str, backend: Backend) -> _Upstream:
        key = backend.api_key
        if backend.api_key_env:
            key = os.environ.get(backend.api_key_env)
            if not key:
                raise ValueError(
                    f"backend {name!r} reads its API key from ${backend.api_key_env}, which is not set in the gateway's environment"
                )
        parts = urlsplit(backend.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"backend {name!r}: {backend.url!r} is not an http(s) URL like http://127.0.0.1:8000/v1")
        base = backend.url.rstrip("/")
        headers = {"content-type": "application/json", **backend.headers}
        if key:
            headers["authorization"] = f"Bearer {key}"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        urls = {endpoint: f"{base}/{endpoint}" for endpoint in _OPERATIONS}
        return cls(name, backend, urls, headers, parts.hostname, port)

    def prepare(self, request: dict[str, Any], operation: str) -> tuple[bytes, _Added]:
        """The body sent upstream: the client's request, asking also for token ids, logprobs and usage."""
        outgoing = dict(request)
        add_ids = self.backend.token_ids and not request.get("return_token_ids")
        asked_logprobs = request.get("logprobs")
        add_logprobs = self.backend.logprobs and (asked_logprobs is None or asked_logprobs is False)
        add_usage = False
        if add_ids:
            outgoing["return_token_ids"] = True
        if add_logprobs:  # completions take a count of top logprobs; 0 means only the sampled token's
            outgoing["logprobs"] = True if operation == CHAT else 0
        if request.get("stream"):
            options = request.get("stream_options")
            if not (isinstance(options, dict) and options.get("include_usage")):
                outgoing["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
                add_usage = True
        if self.backend.model:
            outgoing["model"] = self.backend.model
        return orjson.dumps(outgoing), _Added(add_ids, add_logprobs, add_usage)


@dataclass(frozen=True)
class _Added:
    """What the gateway asked for that the client did not: stripped from what goes back."""

    token_ids: bool
    logprobs: bool
    usage: bool

    def __bool__(self) -> bool:
        return self.token_ids or self.logprobs or self.usage

    def strip(self, answer: dict[str, Any]) -> bool:
        """Remove the added fields in place; False for a stream chunk that only carries added usage."""
        if self.usage:
            if not answer.get("choices") and answer.get("usage") is not None:
                return False
            answer.pop("usage", None)
        if self.token_ids:
            answer.pop("prompt_token_ids", None)
        for choice in answer.get("choices") or ():
            if self.token_ids:
                choice.pop("token_ids", None)
                choice.pop("prompt_token_ids", None)
            if self.logprobs and "logprobs" in choice:
                choice["logprobs"] = None
        return True


class UpstreamError(Exception):
    """A call that cannot succeed, with the status and OpenAI error body the agent gets back."""

    def __init__(self, status: int, message: str, type: str, code: str | None = None, retries: int = 0) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.retries = status, message, type, code, retries

    def body(self) -> bytes:
        return orjson.dumps({"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}})

    @classmethod
    def from_response(cls, upstream: _Upstream, status: int, payload: bytes) -> UpstreamError:
        """The upstream's own reason when it sent an OpenAI-shaped error, its raw body otherwise."""
        try:
            error = orjson.loads(payload)["error"]
            message, type, code = str(error.get("message")), str(error.get("type") or "upstream_error"), error.get("code")
        except Exception:
            text = payload[:500].decode("utf-8", "replace").strip()
            message, type, code = text or "(empty body)", "upstream_error", None
        if status in (401, 403):
            message = f"upstream {upstream.name!r} rejected the gateway's credentials ({status}): {message}"
        else:
            message = f"upstream {upstream.name!r} answered {status}: {message}"
        return cls(status, message, type, None if code is None else str(code))


@dataclass
class _Call:
    """One proxied call, from the request to its span."""

    operation: str
    request: dict[str, Any]
    upstream: _Upstream | None
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
                    log.warning("calls routed to %s/%s are recorded outside any rollout: %s", span.rollout_id, span.attempt_id, exc)
                span.attributes.update({ROLLOUT_ID_ATTR: span.rollout_id, ATTEMPT_ID_ATTR: span.attempt_id})
                await super().write([span.model_copy(update={"rollout_id": None, "attempt_id": None})])
            except Exception:
                log.exception("gateway could not write span %r to the store", span.name)


class Gateway:
    """An ASGI app proxying OpenAI-compatible calls to `backends` (model name → upstream) and recording them.

    `default` serves models missing from the table; without it they get a 404 naming the known
    ones. With `token`, callers must send `Authorization: Bearer <token>` (their API key).
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
    ) -> None:
        if not backends and default is None:
            raise ValueError("a gateway needs backends={model: Backend(url)} or default=Backend(url)")
        self.store = store
        self._upstreams = {
            name: _Upstream.of(name, b if isinstance(b, Backend) else Backend(b)) for name, b in (backends or {}).items()
        }
        self._default = None if default is None else _Upstream.of(
            "default", default if isinstance(default, Backend) else Backend(default)
        )
        self.token = token
        self._auth = None if token is None else f"Bearer {token}".encode()
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self._close_store = close_store
        self._models_body = orjson.dumps({
            "object": "list",
            "data": [{"id": n, "object": "model", "created": 0, "owned_by": u.backend.system} for n, u in self._upstreams.items()],
        })
        self._session: Any = None
        self._sink: _GatewaySink | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._recording = 0
        self._recorded = asyncio.Event()

    @property
    def models(self) -> list[str]:
        return list(self._upstreams)

    def routes(self) -> list[Any]:
        """Starlette routes serving the gateway at the root of a host app (a store server)."""
        from starlette.routing import Route

        return [Route("/v1/{path:path}", self), Route("/rollouts/{rollout_id}/attempts/{attempt_id}/v1/{path:path}", self)]

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
            path = path[len(root):]
        match = _ROUTE.fullmatch(path)
        if match is None:
            await _send_error(send, UpstreamError(
                404, f"no gateway route {path!r}; use /v1/chat/completions, /v1/completions or /v1/models, "
                "optionally under /rollouts/{rollout_id}/attempts/{attempt_id}", "invalid_request_error", "not_found"))
            return
        headers = dict(scope["headers"])
        if self._auth is not None and headers.get(b"authorization") != self._auth:
            await _send_error(send, UpstreamError(
                401, "this gateway needs `Authorization: Bearer <token>`: use the gateway's token as the API key",
                "invalid_request_error", "invalid_api_key"))
            return
        endpoint, method = match["endpoint"], scope["method"]
        expected = "GET" if endpoint == "models" else "POST"
        if method != expected:
            await _send_error(send, UpstreamError(
                405, f"{path} takes {expected}, not {method}", "invalid_request_error", "method_not_allowed"))
            return
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

    async def _proxy(self, operation: str, match: re.Match[str], headers: dict[bytes, bytes], receive: Any, send: Any) -> None:
        started, start_time = time.perf_counter(), time.time()
        rollout, attempt = headers.get(_ROLLOUT_KEY), headers.get(_ATTEMPT_KEY)
        if (rollout is None) != (attempt is None):
            await _send_error(send, UpstreamError(
                400, f"send both {ROLLOUT_HEADER} and {ATTEMPT_HEADER}, or neither", "invalid_request_error"))
            return
        if rollout is not None:
            rollout_id, attempt_id = rollout.decode("latin-1"), attempt.decode("latin-1")  # type: ignore[union-attr]
        else:
            rollout_id, attempt_id = match["rollout"], match["attempt"]
        try:
            body = await _read_body(receive)
        except ConnectionError:
            return
        except ValueError as exc:
            await _send_error(send, UpstreamError(413, str(exc), "invalid_request_error", "request_too_large"))
            return
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            await _send_error(send, UpstreamError(400, f"request body is not valid JSON: {exc}", "invalid_request_error"))
            return
        if not isinstance(request, dict) or not isinstance(request.get("model"), str):
            await _send_error(send, UpstreamError(
                400, "request body must be a JSON object with a 'model' string", "invalid_request_error", "invalid_model"))
            return
        model = request["model"]
        upstream = self._upstreams.get(model) or self._default
        call = _Call(operation, request, upstream, rollout_id, attempt_id, headers.get(b"traceparent"), started, start_time)
        if upstream is None:
            await self._fail(send, call, UpstreamError(
                404, f"model {model!r} is not served by this gateway; known models: {sorted(self._upstreams)}",
                "invalid_request_error", "model_not_found"))
            return
        outgoing, added = upstream.prepare(request, operation)
        try:
            response, retries = await self._post(upstream, operation, outgoing)
        except UpstreamError as error:
            await self._fail(send, call, error)
            return
        try:
            version = response.headers.get(llm_spans.MODEL_VERSION_HEADER)
            if response.status >= 400:
                error = UpstreamError.from_response(upstream, response.status, await response.read())
                error.retries = retries
                await self._fail(send, call, error)
            elif request.get("stream") and response.content_type == "text/event-stream":
                await self._relay_stream(send, call, response, added, version, retries)
            else:
                await self._relay(send, call, await response.read(), added, version, retries)
        finally:
            response.release()

    async def _post(self, upstream: _Upstream, operation: str, body: bytes) -> tuple[Any, int]:
        """POST with retries on 408/429/5xx and connection errors; the last answer is returned whatever it is."""
        import aiohttp

        url = upstream.urls["chat/completions" if operation == CHAT else "completions"]
        timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_read=upstream.backend.timeout_s)
        for attempt in range(self.max_retries + 1):
            retry_after = None
            try:
                response = await self._session.post(url, data=body, headers=upstream.headers, timeout=timeout)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                if isinstance(exc, asyncio.TimeoutError):
                    error = UpstreamError(504, f"upstream {upstream.name!r} at {url} did not answer within "
                                          f"{upstream.backend.timeout_s:g} s", "upstream_error", "upstream_timeout")
                else:
                    error = UpstreamError(502, f"upstream {upstream.name!r} at {url} is unreachable: "
                                          f"{type(exc).__name__}: {exc}", "upstream_error", "upstream_unreachable")
            else:
                if response.status not in RETRY_STATUSES or attempt == self.max_retries:
                    return response, attempt
                retry_after = response.headers.get("retry-after")
                error = UpstreamError.from_response(upstream, response.status, await response.read())
                response.release()
            if attempt == self.max_retries:
                error.retries = attempt
                raise error
            log.info("retrying %s (try %d of %d): %s", url, attempt + 2, self.max_retries + 1, error.message)
            await asyncio.sleep(self._backoff(attempt, retry_after))
        raise AssertionError("unreachable")

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        if retry_after is not None:
            try:
                return min(max(float(retry_after), 0.0), MAX_RETRY_WAIT_SECONDS)
            except ValueError:
                pass  # an HTTP date: fall back to our own backoff
        return min(self.retry_backoff_s * 2**attempt * (0.5 + random.random()), MAX_RETRY_WAIT_SECONDS)

    async def _relay(self, send: Any, call: _Call, payload: bytes, added: _Added, version: str | None, retries: int) -> None:
        try:
            answer = orjson.loads(payload)
            if not isinstance(answer, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            text = payload[:200].decode("utf-8", "replace")
            await self._fail(send, call, UpstreamError(
                502, f"upstream {call.upstream.name!r} answered with invalid JSON ({exc}): {text!r}",  # type: ignore[union-attr]
                "upstream_error", "bad_upstream_response", retries))
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

    async def _relay_stream(self, send: Any, call: _Call, response: Any, added: _Added, version: str | None, retries: int) -> None:
        import aiohttp

        headers = _SSE_HEADERS if version is None else [*_SSE_HEADERS, (_VERSION_KEY, version.encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        assembler = llm_spans.StreamAssembler(call.operation)
        error: UpstreamError | None = None
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
            error = UpstreamError(502, f"upstream {call.upstream.name!r} broke off the stream: "  # type: ignore[union-attr]
                                  f"{type(exc).__name__}: {exc}", "upstream_error", "stream_interrupted", retries)
            await send({"type": "http.response.body", "body": b"data: " + error.body() + b"\n\n", "more_body": True})
        response_attributes = llm_spans.response_attributes(call.operation, assembler.result(), version)
        self._recording += 1
        try:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self._record(call, response_attributes, error, retries)

    async def _fail(self, send: Any, call: _Call, error: UpstreamError) -> None:
        self._recording += 1
        try:
            await _send_error(send, error, extra=[_NO_CLIENT_RETRY])
        finally:
            self._record(call, {}, error, error.retries)

    def _record(self, call: _Call, response_attributes: dict[str, Any], error: UpstreamError | None, retries: int) -> None:
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


def _relay_event(event: bytes, assembler: llm_spans.StreamAssembler, added: _Added, call: _Call) -> bytes:
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


async def _send_json(send: Any, status: int, body: bytes, version: str | None = None, extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode()), *extra]
    if version is not None:
        headers.append((_VERSION_KEY, version.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Any, error: UpstreamError, extra: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await _send_json(send, error.status, error.body(), extra=extra)


# ----------------------------------------------------------------------------- runner side


async def flush_gateways(llms: Iterable[LLM], client: Any) -> None:
    """Ask the gateways behind these proxied LLMs to store every call answered so far.

    The runner calls this before it closes an attempt, so an algorithm that reads the spans of
    a finished rollout finds its last model call too. `client` is an `httpx.AsyncClient`.
    """
    for url in sorted({llm.base_url.rstrip("/") + "/agentgrad/flush" for llm in llms if llm.proxied}):
        try:
            response = await client.post(url, timeout=FLUSH_SECONDS)
            if response.status_code != 200:
                log.warning("gateway flush at %s answered %d: %s", url, response.status_code, response.text[:200])
        except Exception as exc:
            log.warning("could not flush the gateway at %s: %s", url, exc)
