"""Calls the gateway cannot relay as they are: each gets a clear 4xx or 502 in OpenAI's shape, and is
still recorded as a failed span (no 500, no silent 200 without a record)."""

from __future__ import annotations

import json

import httpx
import pytest

from agentgrad.gateway import Backend, Gateway
from agentgrad.serving import ServerThread
from agentgrad.serving.guard import Guard
from agentgrad.store import MemoryStore
from agentgrad.types import Span
from tests.conftest import UPSTREAM_KEY, Served, Upstream

USER = [{"role": "user", "content": "hi"}]


async def failed_span(served: Served, rollout_id: str) -> Span:
    await served.gateway.flush()
    (span,) = await served.store.query_spans(rollout_id)
    assert span.status.code == "ERROR" and span.attributes["gen_ai.request.model"] == "policy"
    return span


async def route(served: Served) -> tuple[str, str]:
    rollout = await served.store.start_rollout("task")
    return rollout.rollout_id, f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"


async def test_a_stop_that_is_not_a_string_is_a_400_with_a_span_and_never_reaches_the_upstream(
    served: Served, upstream: Upstream
) -> None:
    rollout_id, base = await route(served)
    answer = httpx.post(base + "/chat/completions", json={"model": "policy", "messages": USER, "stop": 5})
    assert answer.status_code == 400 and "'stop' must be a string" in answer.json()["error"]["message"]
    span = await failed_span(served, rollout_id)
    assert span.attributes["http.response.status_code"] == 400 and "'stop'" in (span.status.description or "")
    assert upstream.fake.requests == []


async def test_an_upstream_whose_choices_are_not_objects_is_a_502_with_a_span(served: Served, upstream: Upstream) -> None:
    rollout_id, base = await route(served)
    upstream.fake.answers.append({"id": "x", "object": "chat.completion", "choices": [1, "two"]})
    answer = httpx.post(base + "/chat/completions", json={"model": "policy", "messages": USER})
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["code"] == "bad_upstream_response" and "choices[0] is int" in error["message"]
    span = await failed_span(served, rollout_id)
    assert span.attributes["http.response.status_code"] == 502 and span.attributes["error.type"] == "bad_upstream_response"


async def test_a_stream_with_a_malformed_chunk_ends_with_a_502_error_event_and_a_span(
    served: Served, upstream: Upstream
) -> None:
    rollout_id, base = await route(served)
    upstream.fake.bad_chunk = json.dumps({"id": "x", "choices": [{"index": 0, "delta": "not an object"}]})
    with httpx.stream("POST", base + "/chat/completions", json={"model": "policy", "messages": USER, "stream": True}) as s:
        events = [line for line in s.iter_lines() if line.startswith("data:")]
    last = json.loads(events[-1].removeprefix("data:"))
    assert last["error"]["code"] == "bad_upstream_response" and "delta is str" in last["error"]["message"]
    span = await failed_span(served, rollout_id)
    assert span.attributes["http.response.status_code"] == 502


async def test_a_request_too_deep_to_forward_is_a_400_with_a_span_even_without_the_guards_limit(
    upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore()
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    gateway = Gateway(store, {"policy": Backend(upstream.url, api_key_env="FAKE_UPSTREAM_KEY")})
    rollout = await store.start_rollout("task")
    nested: object = "deep"
    for _ in range(400):  # past what the gateway can re-encode (orjson stops at 254), within what it parses
        nested = [nested]
    body = {"model": "policy", "messages": [{"role": "user", "content": nested}]}
    with ServerThread(Guard(gateway, max_json_depth=1000)) as server:
        base = f"{server.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"
        answer = httpx.post(base + "/chat/completions", content=json.dumps(body), headers={"content-type": "application/json"})
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"
        await gateway.flush()
        (span,) = await store.query_spans(rollout.rollout_id)
        assert span.status.code == "ERROR" and span.attributes["http.response.status_code"] == 400
    assert upstream.fake.requests == []
