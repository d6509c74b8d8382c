"""An upstream that dies, hangs or sheds load: the agent gets an OpenAI-style 502/504 fast, within one
deadline per call, every such call is a span with its error, and a request nobody waits for any more
is cancelled upstream. The fake upstream signals what it saw with events: no test sleeps to hope."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator

import httpx
import pytest

from agentgrad.gateway import Backend, Gateway
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from agentgrad.types import Span
from tests.conftest import UPSTREAM_KEY, Served, Upstream

USER = [{"role": "user", "content": "hi"}]
FIRST_BYTE_S, TOTAL_S = 0.5, 1.5


@pytest.fixture
def quick(upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """A gateway whose deadlines are short enough for a test: 0.5 s of silence, 1.5 s in all."""
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    store = MemoryStore()
    gateway = Gateway(store, {"policy": Backend(upstream.url, api_key_env="FAKE_UPSTREAM_KEY", system="vllm")},
                      retry_backoff_s=0.001, first_byte_timeout_s=FIRST_BYTE_S, timeout_s=TOTAL_S)
    with ServerThread(gateway) as server:
        yield Served(gateway, server.url, store)


async def the_span(served: Served, rollout_id: str) -> Span:
    await served.gateway.flush()
    (span,) = await served.store.query_spans(rollout_id)
    return span


async def route(served: Served) -> tuple[str, str]:
    rollout = await served.store.start_rollout("task")
    return rollout.rollout_id, f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"


async def test_an_upstream_dying_after_its_headers_on_a_plain_call_is_a_json_502_with_a_span(
    quick: Served, upstream: Upstream
) -> None:
    rollout_id, base = await route(quick)
    upstream.fake.fault = "die after headers"
    answer = httpx.post(base + "/chat/completions", json={"model": "policy", "messages": USER})
    assert answer.status_code == 502 and answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert error["code"] == "upstream_interrupted" and "broke off its answer" in error["message"]
    span = await the_span(quick, rollout_id)
    assert span.status.code == "ERROR" and span.attributes["http.response.status_code"] == 502
    assert len(upstream.fake.requests) == 1  # a cut answer is not retried: the upstream may have run it


@pytest.mark.parametrize("fault", ["hang before headers", "hang after headers"])
async def test_a_hung_upstream_is_a_504_within_the_deadline_and_its_request_is_cancelled(
    quick: Served, upstream: Upstream, fault: str
) -> None:
    rollout_id, base = await route(quick)
    upstream.fake.fault = fault
    began = time.perf_counter()
    answer = httpx.post(base + "/chat/completions", json={"model": "policy", "messages": USER}, timeout=30)
    took = time.perf_counter() - began
    assert answer.status_code == 504 and answer.json()["error"]["code"] == "upstream_timeout"
    assert "first-byte timeout" in answer.json()["error"]["message"]
    assert FIRST_BYTE_S <= took < FIRST_BYTE_S + 2.0, took  # was 600 s, then 3 retries
    assert upstream.fake.hung_up.wait(5)  # the gateway closed the upstream connection
    assert len(upstream.fake.requests) == 1  # a timeout is not retried
    span = await the_span(quick, rollout_id)
    assert span.attributes["http.response.status_code"] == 504 and span.attributes["error.type"] == "upstream_timeout"


async def test_a_stream_that_trickles_past_the_total_deadline_ends_with_a_504_event_and_a_span(
    upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    store = MemoryStore()
    gateway = Gateway(store, {"policy": Backend(upstream.url, api_key_env="FAKE_UPSTREAM_KEY")},
                      first_byte_timeout_s=30, timeout_s=1.0)
    rollout = await store.start_rollout("task")
    upstream.fake.fault = "hang mid-stream"
    with ServerThread(gateway) as server:
        base = f"{server.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"
        began = time.perf_counter()
        with httpx.stream("POST", base + "/chat/completions", timeout=30,
                          json={"model": "policy", "messages": USER, "stream": True}) as s:
            events = [line for line in s.iter_lines() if line.startswith("data:")]
        took = time.perf_counter() - began
        assert upstream.fake.hung_up.wait(5)
        await gateway.flush()
    assert 1.0 <= took < 3.0, took
    assert json.loads(events[0].removeprefix("data:"))["choices"][0]["delta"]["content"] == "par"  # relayed as it came
    last = json.loads(events[-1].removeprefix("data:"))
    assert last["error"]["code"] == "upstream_timeout" and "total timeout" in last["error"]["message"]
    (span,) = await store.query_spans(rollout.rollout_id)
    assert span.attributes["http.response.status_code"] == 504


async def test_an_agent_that_hangs_up_cancels_the_upstream_request_and_the_call_is_recorded(
    served: Served, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    rollout_id, base = await route(served)  # the default deadlines: minutes
    upstream.fake.fault = "hang before headers"

    async def call() -> None:
        async with httpx.AsyncClient() as client:
            await client.post(base + "/chat/completions", json={"model": "policy", "messages": USER})

    agent = asyncio.ensure_future(call())
    assert await asyncio.to_thread(upstream.fake.arrived.wait, 5)
    agent.cancel()  # the agent gives up: its connection closes
    with pytest.raises(asyncio.CancelledError):
        await agent
    assert await asyncio.to_thread(upstream.fake.hung_up.wait, 5)
    span = await the_span(served, rollout_id)
    assert span.attributes["error.type"] == "client_disconnected"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []  # no traceback


async def test_a_retry_after_past_the_deadline_is_relayed_at_once_rather_than_waited_for(
    quick: Served, upstream: Upstream
) -> None:
    _, base = await route(quick)
    upstream.fake.fail_next(429, headers={"retry-after": "10"})  # within the 20 s cap, past the 1.5 s deadline
    began = time.perf_counter()
    answer = httpx.post(base + "/chat/completions", json={"model": "policy", "messages": USER})
    assert answer.status_code == 429 and time.perf_counter() - began < 1.0
    assert len(upstream.fake.requests) == 1
    upstream.fake.fail_next(503, headers={"retry-after": "0.1"})  # within the deadline: retried, then a success
    assert httpx.post(base + "/chat/completions", json={"model": "policy", "messages": USER}).status_code == 200
    assert len(upstream.fake.requests) == 3


async def test_an_upstream_500_is_relayed_without_a_retry(quick: Served, upstream: Upstream) -> None:
    _, base = await route(quick)
    upstream.fake.fail_next(500)  # the upstream may have run the request: only 429/502/503 say it did not
    answer = httpx.post(base + "/chat/completions", json={"model": "policy", "messages": USER})
    assert answer.status_code == 500 and len(upstream.fake.requests) == 1


def test_the_gateway_command_takes_the_deadlines_and_the_retries() -> None:
    from agentgrad.cli.main import build_parser
    from agentgrad.cli.servers import gateway_from_args

    args = build_parser().parse_args(["gateway", "--store", "memory", "--default", "http://127.0.0.1:9/v1",
                                      "--connect-timeout", "3", "--first-byte-timeout", "20", "--timeout", "90",
                                      "--retries", "1"])
    gateway = gateway_from_args(args, MemoryStore(), None, close_store=False)
    assert gateway.timeouts == (3.0, 20.0, 90.0) and gateway.max_retries == 1
    serve = build_parser().parse_args(["serve", "--store", "memory", "--timeout", "45"])
    assert serve.timeout == 45.0
    with pytest.raises(ValueError, match="timeout_s is a number of seconds above 0"):
        Gateway(MemoryStore(), default="http://127.0.0.1:9/v1", timeout_s=0)
