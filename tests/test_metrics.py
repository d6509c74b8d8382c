"""Prometheus metrics on the store server and the gateway: every figure present and moving with what the servers
do, requests labelled by route template, `/metrics` behind the token like every route (the engine's:
tests/engine/test_metrics.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from agentgrad.gateway import Backend, Gateway, RateLimit
from agentgrad.gateway.ab import ABSplit
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore, SqliteStore
from agentgrad.store.server import create_app
from agentgrad.types import Metric, RolloutConfig
from tests.fake_upstream import FakeUpstream
from tests.helpers import ManualClock
from tests.prometheus import scrape, total, value

HELLO = [{"role": "user", "content": "hi"}]


def test_the_store_exports_its_queue_attempts_requeues_and_the_newest_training_figures(tmp_path: Path) -> None:
    clock = ManualClock()
    store = SqliteStore(tmp_path / "store.db", clock=clock)
    with ServerThread(create_app(store)) as server:
        before = scrape(server.url)
        assert value(before, "agentgrad_store_queue_depth") == 0
        assert value(before, "process_resident_memory_bytes") > 0

        async def work() -> None:
            config = RolloutConfig(timeout_seconds=10, max_attempts=2)
            for _ in range(3):
                await store.enqueue_rollout("t", config=config)
            await store.dequeue_rollout()
            await store.dequeue_rollout()
            clock.advance(10.001)
            await store.check_attempts(force=True)  # both time out and go back to the queue
            await store.dequeue_rollout()
            await store.add_metrics(
                [Metric(name="train/reward_mean", step=s, value=s / 4, run_id="r1", time=s) for s in range(3)]
                + [Metric(name="train/loss", step=2, value=0.25, run_id="r1", time=3)]
            )

        asyncio.run(work())
        after = scrape(server.url)
    assert (
        value(after, "agentgrad_store_queue_depth") == 2
    )  # both timed out wait again (the third claim took the other)
    assert value(after, "agentgrad_store_attempts_running") == 1
    assert value(after, "agentgrad_store_attempts_ended_total", status="timeout") == 2
    assert value(after, "agentgrad_store_attempts_ended_total", status="unresponsive") == 0
    assert value(after, "agentgrad_store_requeues_total") == 2
    assert value(after, "agentgrad_store_rollouts", status="requeuing") == 2
    assert value(after, "agentgrad_run_metric", name="train/reward_mean", run="r1") == 0.5
    assert value(after, "agentgrad_run_metric", name="train/loss", run="r1") == 0.25
    assert value(after, "agentgrad_run_step", run="r1") == 2


def test_store_requests_are_counted_by_route_template_and_status_and_metrics_need_the_token() -> None:
    with ServerThread(create_app(MemoryStore(), token="s3cret")) as server:
        auth = {"authorization": "Bearer s3cret"}
        assert httpx.get(server.url + "/metrics").status_code == 401
        for rollout_id in ("ro-1", "ro-2", "ro-3"):  # unknown: 404s, all under one route label
            assert httpx.get(f"{server.url}/api/rollouts/{rollout_id}", headers=auth).status_code == 404
        assert httpx.get(server.url + "/api/health").status_code == 200
        assert httpx.get(server.url + "/no/such/page", headers=auth).status_code == 404
        samples = scrape(server.url, "s3cret")
    route = {"server": "store", "route": "/api/rollouts/{rollout_id}", "method": "GET", "status": "404"}
    assert value(samples, "agentgrad_http_requests_total", **route) == 3
    assert (
        value(samples, "agentgrad_http_requests_total", server="store", route="/api/health", method="GET", status="200")
        == 1
    )
    assert (
        value(samples, "agentgrad_http_requests_total", server="store", route="other", method="GET", status="404") == 1
    )
    assert value(samples, "agentgrad_http_request_duration_seconds_count", server="store", route=route["route"]) == 3
    assert not any("ro-1" in str(labels) for _, labels in samples)  # raw paths never become labels


@pytest.fixture
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    """A fake OpenAI-compatible upstream on loopback, and its `/v1` URL."""
    fake = FakeUpstream()
    with ServerThread(fake.app) as server:
        yield fake, server.url + "/v1"


def test_the_gateway_counts_calls_tokens_errors_retries_deadlines_and_arms_per_upstream(
    upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = upstream
    split = ABSplit("ab-model", {"a": Backend(url, system="vllm"), "b": Backend(url, system="vllm")})
    gateway = Gateway(
        MemoryStore(),
        {"policy": Backend(url, system="vllm"), "slow": Backend(url, timeout_s=0.5), "ab-model": split},
        retry_backoff_s=0.01,
    )
    with ServerThread(gateway) as served:
        client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
        before = scrape(served.url)
        for _ in range(3):
            client.chat.completions.create(model="policy", messages=HELLO)
        fake.fail_next(503)  # retried once, then answered
        client.chat.completions.create(model="policy", messages=HELLO)
        for rollout in range(6):
            headers = {"x-agentgrad-rollout-id": f"ro-{rollout}", "x-agentgrad-attempt-id": "at-1"}
            client.chat.completions.create(model="ab-model", messages=HELLO, extra_headers=headers)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="nobody-serves-this", messages=HELLO)
        fake.fault = "hang before headers"
        with pytest.raises(openai.APIStatusError) as cut:
            client.chat.completions.create(model="slow", messages=HELLO)
        fake.fault = None
        assert cut.value.status_code == 504
        after = scrape(served.url)
    assert value(before, "agentgrad_gateway_calls_total", upstream="policy", api="chat.completions", status="200") == 0
    assert value(after, "agentgrad_gateway_calls_total", upstream="policy", api="chat.completions", status="200") == 4
    assert value(after, "agentgrad_gateway_retries_total", upstream="policy") == 1
    prompt = value(after, "agentgrad_gateway_tokens_total", upstream="policy", kind="input")
    assert prompt == 4 * len("<user>hi")  # the fake's token ids are the prompt's bytes
    assert value(after, "agentgrad_gateway_tokens_total", upstream="policy", kind="output") > 0
    assert value(after, "agentgrad_gateway_errors_total", upstream="none", code="model_not_found") == 1
    assert value(after, "agentgrad_gateway_errors_total", upstream="slow", code="upstream_timeout") == 1
    assert value(after, "agentgrad_gateway_deadlines_total", upstream="slow") == 1
    arms = {arm: value(after, "agentgrad_gateway_ab_calls_total", model="ab-model", arm=arm) for arm in "ab"}
    assert arms == {arm: sum(split.arm_of(f"ro-{r}") == arm for r in range(6)) for arm in "ab"}
    assert value(after, "agentgrad_gateway_call_duration_seconds_count", upstream="policy") == 4
    route = {"server": "gateway", "route": "/v1/chat/completions", "method": "POST"}
    assert value(after, "agentgrad_http_requests_total", **route, status="200") == 10
    assert value(after, "agentgrad_gateway_route_table_generation") == 1
    assert value(after, "agentgrad_gateway_route_table", id=gateway.table.id) == 1
    assert value(after, "agentgrad_gateway_calls_in_flight") == 0


def test_a_call_in_flight_shows_and_a_rate_limited_upstream_counts_its_refusals(
    upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = upstream
    fake.stream_gate = threading.Event()
    limited = Backend(url, rate_limit=RateLimit(requests_per_minute=1, max_queued=0))
    gateway = Gateway(MemoryStore(), {"policy": Backend(url, system="vllm"), "limited": limited})
    with ServerThread(gateway) as served:
        client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
        stream = client.chat.completions.create(model="policy", messages=HELLO, stream=True)
        next(iter(stream))  # the first chunk is through; the rest waits for the gate
        assert value(scrape(served.url), "agentgrad_gateway_calls_in_flight") == 1
        fake.stream_gate.set()
        list(stream)
        client.chat.completions.create(model="limited", messages=HELLO)
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="limited", messages=HELLO)
        after = scrape(served.url)
    assert value(after, "agentgrad_gateway_calls_in_flight") == 0
    assert value(after, "agentgrad_gateway_errors_total", upstream="limited", code="rate_limited") == 1
    assert value(after, "agentgrad_gateway_calls_total", upstream="policy", api="chat.completions", status="200") == 1


def test_the_gateways_metrics_need_its_token_and_a_store_server_hosting_it_exports_both() -> None:
    store = MemoryStore()
    with ServerThread(Gateway(store, default=Backend("http://127.0.0.1:9/v1"), token="gw")) as served:
        assert httpx.get(served.url + "/metrics").status_code == 401
        assert httpx.get(served.url + "/health").json() == {"status": "ok"}  # a probe needs no token
        assert total(scrape(served.url, "gw"), "agentgrad_gateway_route_table_generation") == 1
    gateway = Gateway(store, default=Backend("http://127.0.0.1:9/v1"))
    app = create_app(
        store, token="s3", extra_routes=gateway.routes(), on_shutdown=[gateway.aclose], metrics=gateway.metrics
    )
    with ServerThread(app) as server:
        auth = {"authorization": "Bearer s3"}
        assert httpx.get(server.url + "/v1/models", headers=auth).status_code == 200
        samples = scrape(server.url, "s3")
    assert value(samples, "agentgrad_gateway_route_table_generation") == 1
    assert value(samples, "agentgrad_store_queue_depth") == 0
    assert (
        value(samples, "agentgrad_http_requests_total", server="store", route="/v1/models", method="GET", status="200")
        == 1
    )
    assert total(samples, "agentgrad_http_requests_total", server="gateway") == 0  # counted once, by the host
