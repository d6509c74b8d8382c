"""OTLP/HTTP ingest: spans from any OpenTelemetry SDK land in the attempt their attributes name."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from agentgrad.semconv import ATTEMPT_ID as ATTEMPT_ID_ATTR
from agentgrad.semconv import ROLLOUT_ID as ROLLOUT_ID_ATTR
from agentgrad.serving import ServerThread
from agentgrad.store import SqliteStore
from agentgrad.store.server import create_app


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[SqliteStore, ServerThread]]:  # type: ignore[no-untyped-def]
    store = SqliteStore(tmp_path / "store.db")
    with ServerThread(create_app(store, token="tok")) as server:
        yield store, server


def otel_provider(url: str, resource: dict[str, str], compression: Compression = Compression.NoCompression) -> TracerProvider:
    exporter = OTLPSpanExporter(
        endpoint=url + "/v1/traces", headers={"authorization": "Bearer tok"}, compression=compression
    )
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_spans_from_the_otel_sdk_exporter_land_in_the_attempt_named_by_the_resource(served, compression) -> None:  # type: ignore[no-untyped-def]
    store, server = served
    started = asyncio.run(store.start_rollout("task"))
    ids = {ROLLOUT_ID_ATTR: started.rollout_id, ATTEMPT_ID_ATTR: started.attempt.attempt_id}
    provider = otel_provider(server.url, {"service.name": "my-agent", **ids}, compression)
    tracer = provider.get_tracer("some.framework")
    with tracer.start_as_current_span("agent.run") as root:
        with tracer.start_as_current_span("chat gpt-x", attributes={"gen_ai.operation.name": "chat",
                                                                      "gen_ai.usage.input_tokens": 12,
                                                                      "gen_ai.request.stop": ["\n", "END"]}) as llm:
            llm.add_event("gen_ai.choice", {"index": 0})
            llm.set_status(Status(StatusCode.ERROR, "rate limited"))
        root.set_attribute("agentgrad.reward", 0.5)
    provider.shutdown()

    spans = asyncio.run(store.query_spans(started.rollout_id))
    assert [s.name for s in spans] == ["chat gpt-x", "agent.run"] and [s.sequence_id for s in spans] == [1, 2]
    llm_span, root_span = spans
    assert llm_span.attributes["gen_ai.usage.input_tokens"] == 12
    assert llm_span.attributes["gen_ai.request.stop"] == ["\n", "END"]
    assert llm_span.parent_id == root_span.span_id and llm_span.trace_id == root_span.trace_id
    assert len(llm_span.trace_id) == 32 and len(llm_span.span_id) == 16
    assert llm_span.events[0].name == "gen_ai.choice" and llm_span.events[0].attributes == {"index": 0}
    assert llm_span.status.code == "ERROR" and llm_span.status.description == "rate limited"
    assert root_span.end_time is not None and root_span.end_time >= llm_span.end_time  # type: ignore[operator]
    # the reward reported through OTLP is the attempt's reward, as for spans written directly
    asyncio.run(store.update_attempt(started.rollout_id, started.attempt.attempt_id, status="succeeded"))
    assert asyncio.run(store.get_rollout(started.rollout_id)).reward == 0.5


def test_span_attributes_win_over_the_resource_and_a_rollout_id_alone_means_its_latest_attempt(served) -> None:  # type: ignore[no-untyped-def]
    store, server = served
    first, second = asyncio.run(store.start_rollout("a")), asyncio.run(store.start_rollout("b"))
    provider = otel_provider(server.url, {})
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("in-second", attributes={ROLLOUT_ID_ATTR: second.rollout_id}):
        pass
    with tracer.start_as_current_span("outside"):
        pass
    provider.shutdown()
    provider = otel_provider(server.url, {ROLLOUT_ID_ATTR: first.rollout_id, ATTEMPT_ID_ATTR: first.attempt.attempt_id})
    with provider.get_tracer("t").start_as_current_span(
        "moved", attributes={ROLLOUT_ID_ATTR: second.rollout_id, ATTEMPT_ID_ATTR: second.attempt.attempt_id}
    ):
        pass
    provider.shutdown()
    assert [s.name for s in asyncio.run(store.query_spans(second.rollout_id))] == ["in-second", "moved"]
    assert asyncio.run(store.query_spans(first.rollout_id)) == []
    assert [s.name for s in asyncio.run(store.query_spans(None))] == ["outside"]


def otlp_json(rollout_id: str, attempt_id: str | None, name: str = "tool.call") -> dict:
    attributes = [{"key": ROLLOUT_ID_ATTR, "value": {"stringValue": rollout_id}},
                  {"key": "n", "value": {"intValue": "7"}},
                  {"key": "tags", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"boolValue": True}]}}},
                  {"key": "nested", "value": {"kvlistValue": {"values": [{"key": "x", "value": {"doubleValue": 1.5}}]}}}]
    if attempt_id:
        attributes.append({"key": ATTEMPT_ID_ATTR, "value": {"stringValue": attempt_id}})
    span = {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": name,
            "startTimeUnixNano": "1544712660000000000", "endTimeUnixNano": 1544712661000000000,
            "attributes": attributes, "status": {"code": 1}}
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "s"}, "spans": [span]}]}]}


def test_otlp_json_with_hex_ids_is_accepted(served) -> None:  # type: ignore[no-untyped-def]
    store, server = served
    started = asyncio.run(store.start_rollout("t"))
    body = gzip.compress(json.dumps(otlp_json(started.rollout_id, started.attempt.attempt_id)).encode())
    answer = httpx.post(server.url + "/v1/traces", content=body, headers={
        "content-type": "application/json", "content-encoding": "gzip", "authorization": "Bearer tok"})
    assert answer.status_code == 200 and answer.json() == {}
    (span,) = asyncio.run(store.query_spans(started.rollout_id))
    assert span.trace_id == "5b8efff798038103d269b633813fc60c" and span.span_id == "eee19b7ec3c1b174"
    assert span.attributes["n"] == 7 and span.attributes["tags"] == ["a", True] and span.attributes["nested"] == {"x": 1.5}
    assert (span.start_time, span.end_time, span.status.code) == (1544712660.0, 1544712661.0, "OK")


def test_spans_for_unknown_rollouts_are_rejected_and_counted_the_rest_stored(served) -> None:  # type: ignore[no-untyped-def]
    store, server = served
    started = asyncio.run(store.start_rollout("t"))
    good, bad = otlp_json(started.rollout_id, None, "good"), otlp_json("ro-ghost", None, "bad")
    mixed = {"resourceSpans": good["resourceSpans"] + bad["resourceSpans"]}
    headers = {"authorization": "Bearer tok"}
    answer = httpx.post(server.url + "/v1/traces", json=mixed, headers=headers)
    assert answer.status_code == 200
    assert answer.json()["partialSuccess"]["rejectedSpans"] == "1" and "ro-ghost" in answer.text
    assert [s.name for s in asyncio.run(store.query_spans(started.rollout_id))] == ["good"]

    only_bad = httpx.post(server.url + "/v1/traces", json=bad, headers=headers)
    assert only_bad.status_code == 400 and "ro-ghost" in only_bad.json()["detail"]


@pytest.mark.parametrize(
    ("content", "content_type", "fragment"),
    [
        (b"\xff\x00garbage", "application/x-protobuf", "not an OTLP protobuf"),
        (b"{nope", "application/json", "not JSON"),
        (b'{"resourceSpans": 3}', "application/json", "resourceSpans must be a list"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', "application/json", "hex"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": 5}]}]}]}', "application/json", "OTLP/JSON"),
        (b"{}", "application/xml", "application/x-protobuf"),  # text/plain is refused earlier, as cross-site: 403
    ],
)
def test_unreadable_exports_are_a_400_that_says_why(served, content, content_type, fragment) -> None:  # type: ignore[no-untyped-def]
    store, server = served
    answer = httpx.post(server.url + "/v1/traces", content=content,
                        headers={"content-type": content_type, "authorization": "Bearer tok"})
    assert answer.status_code == 400 and fragment in answer.json()["detail"], answer.text
    assert asyncio.run(store.stats()).spans == 0


def test_json_nested_thousands_of_levels_deep_is_a_4xx_not_a_crash(served) -> None:  # type: ignore[no-untyped-def]
    store, server = served
    for depth in (1_000, 100_000):
        body = b'{"resourceSpans": ' + b"[" * depth + b"]" * depth + b"}"
        answer = httpx.post(server.url + "/v1/traces", content=body,
                            headers={"content-type": "application/json", "authorization": "Bearer tok"})
        assert answer.status_code == 400 and "nested too deeply" in answer.json()["detail"], answer.text
    assert asyncio.run(store.stats()).spans == 0
