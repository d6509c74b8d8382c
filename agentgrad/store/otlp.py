"""OTLP/HTTP trace ingest (`POST /v1/traces`, protobuf or JSON): any OpenTelemetry exporter reports here.

A span lands in the attempt named by its `agentgrad.rollout_id` / `agentgrad.attempt_id`
attributes, looked up on the span first and on its resource second; with a rollout id alone it
lands in that rollout's latest attempt, and with neither it is kept as a span outside any
rollout. Spans whose rollout or attempt is unknown are rejected and counted in the answer's
`partial_success`, as the OTLP specification asks; the others are stored.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from agentgrad.semconv import ATTEMPT_ID, ROLLOUT_ID
from agentgrad.store.base import Store
from agentgrad.store.errors import StoreError
from agentgrad.store.http_errors import BodyTooLarge, error_response, exception_response
from agentgrad.types import Span, SpanEvent, SpanStatus

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}


class OtlpError(ValueError):
    """The request is not an OTLP trace export we can read."""


def value_of(value: AnyValue) -> Any:
    """An OTLP attribute value as plain JSON data (bytes as base64 text)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value_of(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, kind)


def attributes_of(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {pair.key: value_of(pair.value) for pair in pairs}


def _hex_ids_to_base64(data: Any) -> None:
    """OTLP/JSON writes trace and span ids in hex, where protobuf's JSON mapping expects base64."""
    if not isinstance(data, dict):
        raise OtlpError("an OTLP/JSON trace export is an object with 'resourceSpans'")
    for resource_spans in _list(data, "resourceSpans", "resource_spans"):
        for scope_spans in _list(resource_spans, "scopeSpans", "scope_spans"):
            for span in _list(scope_spans, "spans"):
                for item in (span, *_list(span, "links")):
                    for key in item:
                        if key in ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"):
                            try:
                                item[key] = base64.b64encode(bytes.fromhex(item[key])).decode()
                            except (TypeError, ValueError):
                                raise OtlpError(f"{key} must be a hex string, got {item[key]!r}") from None


def _list(container: Any, *keys: str) -> list[Any]:
    for key in keys:
        if isinstance(container, dict) and key in container:
            value = container[key]
            if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
                raise OtlpError(f"{key} must be a list of objects")
            return value
    return []


def decode(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    export = ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        try:
            export.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpError(f"the body is not an OTLP protobuf trace export: {exc}") from None
        return export
    if content_type != JSON:
        raise OtlpError(f"send OTLP traces as {PROTOBUF} or {JSON}, not {content_type or 'no content type'!r}")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OtlpError(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise OtlpError("the body is JSON nested too deeply to be an OTLP trace export") from None
    _hex_ids_to_base64(data)
    try:
        json_format.ParseDict(data, export, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise OtlpError(f"the body is not an OTLP/JSON trace export: {exc}") from None
    return export


def to_spans(export: ExportTraceServiceRequest) -> list[Span]:
    """Our spans, with the rollout and attempt their attributes name (attempt may still be None)."""
    spans = []
    for resource_spans in export.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attributes = attributes_of(span.attributes)
                rollout_id = attributes.get(ROLLOUT_ID, resource.get(ROLLOUT_ID))
                attempt_id = attributes.get(ATTEMPT_ID, resource.get(ATTEMPT_ID))
                spans.append(
                    Span(
                        rollout_id=str(rollout_id) if rollout_id is not None else None,
                        attempt_id=str(attempt_id) if attempt_id is not None else None,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex() or None,
                        name=span.name,
                        start_time=span.start_time_unix_nano / 1e9,
                        end_time=span.end_time_unix_nano / 1e9 if span.end_time_unix_nano else None,
                        attributes=attributes,
                        events=[
                            SpanEvent(name=e.name, time=e.time_unix_nano / 1e9, attributes=attributes_of(e.attributes))
                            for e in span.events
                        ],
                        status=SpanStatus(
                            code=STATUS_CODES.get(span.status.code, "UNSET"), description=span.status.message or None
                        ),
                    )
                )
    return spans


async def store_spans(store: Store, spans: list[Span]) -> tuple[int, list[str]]:
    """Store what can be stored, one group per attempt; returns (rejected count, reasons)."""
    groups: dict[tuple[str | None, str | None], list[Span]] = {}
    for span in spans:
        groups.setdefault((span.rollout_id, span.attempt_id), []).append(span)
    rejected, reasons = 0, []
    for (rollout_id, attempt_id), group in groups.items():
        try:
            if rollout_id is not None and attempt_id is None:
                attempt_id = (await store.get_rollout(rollout_id)).latest_attempt_id
                group = [span.model_copy(update={"attempt_id": attempt_id}) for span in group]
            await store.add_spans(group)
        except StoreError as exc:
            rejected += len(group)
            reasons.append(str(exc))
    return rejected, reasons


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise OtlpError(f"unsupported content-encoding {encoding!r}; use gzip or none")
    try:
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header, detected
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise OtlpError(f"the body is not valid {encoding}: {exc}") from None
    if len(data) > limit:
        raise BodyTooLarge(limit)
    return data


async def otlp_traces(request: Request) -> Response:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        body = _decompress(
            await request.body(), request.headers.get("content-encoding", "").lower(), request.app.state.max_body_bytes
        )
        spans = to_spans(decode(body, content_type))
        rejected, reasons = await store_spans(request.app.state.store, spans)
    except OtlpError as exc:
        return error_response(400, "OtlpError", str(exc))
    except Exception as exc:
        return exception_response(exc)
    if spans and rejected == len(spans):
        return error_response(400, "OtlpError", f"no span was stored: {'; '.join(reasons[:5])}")
    return _answer(content_type, rejected, "; ".join(reasons[:5]))


def _answer(content_type: str, rejected: int, message: str) -> Response:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTracePartialSuccess,
        ExportTraceServiceResponse,
    )

    partial = ExportTracePartialSuccess(rejected_spans=rejected, error_message=message) if rejected else None
    answer = ExportTraceServiceResponse(partial_success=partial)
    if content_type == PROTOBUF:
        return Response(answer.SerializeToString(), media_type=PROTOBUF)
    body: dict[str, Any] = {}
    if rejected:
        body["partialSuccess"] = {"rejectedSpans": str(rejected), "errorMessage": message}
    return Response(json.dumps(body), media_type=JSON)
