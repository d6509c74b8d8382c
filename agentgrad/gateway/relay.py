"""The answer's way back to the agent: relayed whole or event by event, stripped of what the gateway added, then
recorded; and the gateway's own refusals in each API's error shape.

`app.Gateway` routes a call and `forwarding.forward` sends it upstream; what comes back goes through here. Every
outcome, an answer, a stream, an error, is recorded once, after the agent got it: a `Recorder` counts the answers on
their way (so `Gateway.flush` can wait for them) and queues each call's span for the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

import orjson

import agentgrad.gateway.messages as messages
from agentgrad import semconv as sc
from agentgrad.gateway.checks import answer_problem
from agentgrad.gateway.recording import Call, GatewaySink, StreamAssembler, call_span, response_attributes
from agentgrad.gateway.responses import ResponsesStream
from agentgrad.gateway.secrets import StreamRedactor
from agentgrad.gateway.sse import Event
from agentgrad.gateway.tool_runs import ToolRuns
from agentgrad.gateway.upstreams import RAW_TURN_FIELDS, Added, Deadline, GatewayError
from agentgrad.redact import redact_known_bytes
from agentgrad.semconv import MESSAGES_API, RESPONSES_API

log = logging.getLogger(__name__)

VERSION_KEY = sc.VERSION_HEADER.encode()
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
NO_CLIENT_RETRY = (b"x-should-retry", b"false")  # the gateway already retried; the openai client obeys this


class Recorder:
    """Counts the answers on their way to agents and queues each call's span once its answer is through; `metrics`
    (`gateway.metrics.GatewayMetrics`) counts each call for Prometheus at the same moment."""

    def __init__(self, sink: GatewaySink, metrics: Any = None) -> None:
        self.sink = sink
        self.metrics = metrics
        self.tool_runs = ToolRuns()
        self.pending = 0
        self._idle = asyncio.Event()

    def begin(self) -> None:
        """An answer is about to be sent: `drain` waits for its span."""
        self.pending += 1

    def record(self, call: Call, answered: dict[str, Any], error: GatewayError | None, retries: int) -> None:
        """Build the call's span and queue it for the store (after the client got its answer), with the spans of the
        tool runs whose results its request carries (`tool_runs`)."""
        call.recorded = True
        try:
            span = call_span(call, answered, error, retries)
            self.sink.put(span)
            for run in self.tool_runs.observe(call, span):
                self.sink.put(run)
            if self.metrics is not None:
                self.metrics.record(call, answered, error, retries, span.attributes[sc.LATENCY_MS] / 1000)
        except Exception:
            log.exception("could not record a call to %s", call.request.get("model"))
        finally:
            self.pending -= 1
            if not self.pending:
                self._idle.set()

    async def drain(self) -> None:
        """Return once every answer begun so far is recorded, and the spans written to the store."""
        while self.pending:
            self._idle.clear()
            await self._idle.wait()
        await self.sink.flush()


async def relay_answer(
    send: Any, call: Call, payload: bytes, added: Added, version: str | None, retries: int, recorder: Recorder
) -> None:
    """A whole (non-streamed) answer: checked, stripped of what the gateway added, sent, then recorded."""
    payload = redact_known_bytes(payload)  # an upstream echoing its key: the agent and the span get [redacted]
    try:
        answer = orjson.loads(payload)
        if not isinstance(answer, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        text = payload[:200].decode("utf-8", "replace")
        await fail(
            send,
            call,
            GatewayError(
                502,
                f"upstream {call.upstream.name!r} answered with invalid JSON ({exc}): {text!r}",  # type: ignore[union-attr]
                "upstream_error",
                "bad_upstream_response",
                retries,
            ),
            recorder,
        )
        return
    problem = answer_problem(call.api, answer)
    if problem is not None:
        message = f"upstream {call.upstream.name!r} answered with a malformed response: {problem}"  # type: ignore[union-attr]
        error = GatewayError(502, message, "upstream_error", "bad_upstream_response", retries)
        return await fail(send, call, error, recorder)
    answered = response_attributes(call.api, answer, version, call)  # before stripping
    if added:
        added.strip(answer)
        payload = orjson.dumps(answer)
    recorder.begin()
    try:
        await send_json(send, 200, payload, version)
    finally:
        recorder.record(call, answered, None, retries)


async def relay_stream(
    send: Any,
    call: Call,
    response: Any,
    added: Added,
    version: str | None,
    retries: int,
    deadline: Deadline,
    recorder: Recorder,
) -> None:
    """A stream, event by event, recorded as it passes; a break or a stall ends it with an error event."""
    import aiohttp

    headers = SSE_HEADERS if version is None else [*SSE_HEADERS, (VERSION_KEY, version.encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    assembler: StreamAssembler | ResponsesStream | messages.MessagesStream = (
        ResponsesStream()
        if call.api == RESPONSES_API
        else messages.MessagesStream()
        if call.api == MESSAGES_API
        else StreamAssembler(call.api)
    )
    error: GatewayError | None = None
    pending = b""
    redactor = StreamRedactor(call.api) if StreamRedactor.needed() else None  # a key streamed in pieces
    try:
        async with asyncio.timeout_at(deadline.ends):  # the call's deadline: a trickling stream ends too
            async for data in response.content.iter_any():
                if b"\r" in data:
                    data = data.replace(b"\r\n", b"\n")
                events = (pending + data).split(b"\n\n")
                pending = events.pop()
                relayed = [relay_event(redact_known_bytes(event), assembler, added, call) for event in events]
                out = b"".join(relayed if redactor is None else [redactor.push(event) for event in relayed])
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        if redactor is not None and (out := redactor.flush()):
            await send({"type": "http.response.body", "body": out, "more_body": True})
    except (TimeoutError, aiohttp.ClientError, BadChunk) as exc:
        if redactor is not None and (out := redactor.flush()):
            await send({"type": "http.response.body", "body": out, "more_body": True})
        name = call.upstream.name if call.upstream else "?"
        if isinstance(exc, asyncio.TimeoutError):
            error = deadline.error(call.upstream, call.upstream.urls[call.api], exc, retries)  # type: ignore[union-attr,arg-type]
        elif isinstance(exc, BadChunk):
            message = f"upstream {name!r} sent a malformed stream chunk: {exc}"
            error = GatewayError(502, message, "upstream_error", "bad_upstream_response", retries)
        else:
            message = f"upstream {name!r} broke off the stream: {type(exc).__name__}: {exc}"
            error = GatewayError(502, message, "upstream_error", "stream_interrupted", retries)
        event = messages.error_event(error) if call.api == MESSAGES_API else b"data: " + error.body() + b"\n\n"
        await send({"type": "http.response.body", "body": event, "more_body": True})
    answered = response_attributes(call.api, assembler.result(), version, call)
    recorder.begin()
    try:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        recorder.record(call, answered, error, retries)


async def fail(send: Any, call: Call, error: GatewayError, recorder: Recorder) -> None:
    """The call cannot succeed: the agent gets the error (told not to retry: the gateway did), and it is recorded."""
    recorder.begin()
    try:
        await send_error(send, error, extra=[NO_CLIENT_RETRY], api=call.api)
    finally:
        recorder.record(call, {}, error, error.retries)


class BadChunk(ValueError):
    """A stream chunk the gateway cannot relay or record: the stream ends with a 502 error event."""


def relay_event(
    event: bytes, assembler: StreamAssembler | ResponsesStream | messages.MessagesStream, added: Added, call: Call
) -> bytes:
    """One SSE event on its way to the client: parsed for the record, stripped of what the gateway added."""
    if isinstance(assembler, messages.MessagesStream):
        relayed = messages.relay_event(event, assembler, added)
        if call.first_token is None and assembler.generating:
            call.first_token = time.perf_counter()
        return relayed
    if isinstance(assembler, ResponsesStream):
        return relay_responses_event(event, assembler, added, call)
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
    problem = answer_problem(call.api, chunk, chunk=True)
    if problem is not None:
        raise BadChunk(problem)
    if call.first_token is None and chunk.get("choices"):
        call.first_token = time.perf_counter()
    assembler.add(chunk)
    if not added:
        return event + b"\n\n"
    if not added.strip(chunk):
        return b""
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def relay_responses_event(event: bytes, assembler: ResponsesStream, added: Added, call: Call) -> bytes:
    """A Responses stream event (`event: <type>` and `data: <json>` lines): recorded; token ids the gateway
    asked for are stripped from the final event's response."""
    if not event:
        return b""
    parsed = Event.parse(event)
    data = parsed.data
    if not isinstance(data, dict):
        return event + b"\n\n"
    if call.first_token is None and str(data.get("type", "")).endswith(".delta"):
        call.first_token = time.perf_counter()
    assembler.add(data)
    response = data.get("response")
    if added and isinstance(response, dict) and any(k in response for k in ("token_ids", *RAW_TURN_FIELDS)):
        added.strip(response)
        return parsed.encode()
    return event + b"\n\n"


async def send_json(
    send: Any, status: int, body: bytes, version: str | None = None, extra: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *extra]
    if version is not None:
        headers.append((VERSION_KEY, version.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(
    send: Any, error: GatewayError, extra: Iterable[tuple[bytes, bytes]] = (), api: str | None = None
) -> None:
    body = messages.error_body(error) if api == MESSAGES_API else error.body()  # each API's own error shape
    await send_json(send, error.status, body, extra=extra)


async def reject(send: Any, status: int, message: str, code: str | None = None, api: str | None = None) -> None:
    """Refuse a request the gateway cannot make sense of (it never reaches an upstream)."""
    await send_error(send, GatewayError(status, message, "invalid_request_error", code), api=api)
