"""Prometheus metrics for every agentgrad server: `GET /metrics` in the text format monitoring systems scrape.

Each server (store, gateway, engine) owns a `ServerMetrics`: a `prometheus_client` registry holding the
process's own figures (memory, CPU, open files; GPU memory where torch holds a GPU), its HTTP requests by
route, method and status with their latency (`instrument`), and what the server adds (`add`): collectors that
read the server's state when scraped, or an async `Snapshot` the `/metrics` handler awaits first (the store's
counts come from a query).

Counting on a hot path costs a dictionary update (`Counts`, `Buckets`), not a `prometheus_client` metric
object's lock and label lookup (four times the CPU, which the gateway's 2 % budget would not cover); the library
turns the tallies into metric families at scrape time. Tallies are updated and read on the server's event loop
thread, so they need no lock.

`/metrics` is guarded like every other route (`agentgrad.serving.guard`): with a token, scrapers send it
(Prometheus: `authorization: {credentials_file: ...}`).
"""

from __future__ import annotations

import bisect
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

METRICS_PATH = "/metrics"
ROUTE_KEY = "agentgrad.route"
"""Where an app that routes by itself (the store's operations, the gateway) puts the route template of a request
in its ASGI scope, for the request's labels; Starlette's router leaves its matched `route` there already."""
OTHER_ROUTE = "other"
"""The route label of a request no route matched (a 404): its raw path would let callers mint label values."""
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds: a store call takes about a millisecond, a model call up to minutes, a long poll 30 s."""

Snapshot = Callable[[], Awaitable[Iterable[Metric]]]
"""Metric families a server computes when scraped, asynchronously (the store's counts: a query)."""


class Counts:
    """A counter family: a count (or a sum, `add`) per tuple of label values."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def add(self, key: tuple[str, ...], amount: float = 1) -> None:
        self.values[key] = self.values.get(key, 0) + amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, value in list(self.values.items()):
            family.add_metric(key, value)
        yield family


class Buckets:
    """A histogram family: observations per tuple of label values, counted into `bounds` (and summed)."""

    def __init__(
        self, name: str, documentation: str, labels: Sequence[str], bounds: Sequence[float] = LATENCY_BUCKETS
    ) -> None:
        self.name, self.documentation, self.labels, self.bounds = name, documentation, list(labels), tuple(bounds)
        self.values: dict[tuple[str, ...], list[float]] = {}  # per bucket (the last: +Inf), then the sum

    def observe(self, key: tuple[str, ...], value: float) -> None:
        counts = self.values.get(key)
        if counts is None:
            counts = self.values[key] = [0.0] * (len(self.bounds) + 2)
        counts[bisect.bisect_left(self.bounds, value)] += 1
        counts[-1] += value

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, counts in list(self.values.items()):
            cumulative, buckets = 0.0, []
            for bound, count in zip((*self.bounds, float("inf")), counts):
                cumulative += count
                buckets.append((_bound(bound), cumulative))
            family.add_metric(key, buckets, counts[-1])
        yield family


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(value)


class GpuMemory:
    """GPU memory torch has allocated and reserved, per device; nothing where this process holds no GPU (torch not
    imported, or CUDA never initialized: reading it must not be what starts a CUDA context)."""

    def collect(self) -> Iterator[Metric]:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return
        allocated = GaugeMetricFamily(
            "agentgrad_gpu_memory_allocated_bytes", "GPU memory held by tensors", labels=["device"]
        )
        reserved = GaugeMetricFamily(
            "agentgrad_gpu_memory_reserved_bytes", "GPU memory reserved by torch's caching allocator", labels=["device"]
        )
        for index in range(torch.cuda.device_count()):
            allocated.add_metric([str(index)], torch.cuda.memory_allocated(index))
            reserved.add_metric([str(index)], torch.cuda.memory_reserved(index))
        yield allocated
        yield reserved


class _Families:
    """What one scrape exposes: the registry's collectors and the families the snapshots just computed."""

    def __init__(self, registry: CollectorRegistry, computed: list[Metric]) -> None:
        self.registry, self.computed = registry, computed

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()
        yield from self.computed


class ServerMetrics:
    """One server's metrics: a registry with the process's figures and its HTTP requests, plus what `add` joins."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        self.registry.register(GpuMemory())
        self.requests = Counts(
            "agentgrad_http_requests_total",
            "HTTP requests answered, by server, route, method and status",
            ("server", "route", "method", "status"),
        )
        self.latency = Buckets(
            "agentgrad_http_request_duration_seconds",
            "Time from a request's arrival to the last byte of its answer, by server and route",
            ("server", "route"),
        )
        self.registry.register(self.requests)
        self.registry.register(self.latency)
        self.snapshots: list[Snapshot] = []

    def add(self, collector: Any) -> None:
        """Join a collector (anything with `collect()` yielding metric families) or an async `Snapshot`."""
        if hasattr(collector, "collect"):
            self.registry.register(collector)
        else:
            self.snapshots.append(collector)

    def observe(self, server: str, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.add((server, route, method, str(status)))
        self.latency.observe((server, route), seconds)

    async def exposition(self) -> bytes:
        """The text a scrape gets: every family, the snapshots' computed now."""
        computed: list[Metric] = []
        for snapshot in self.snapshots:
            computed.extend(await snapshot())
        return generate_latest(_Families(self.registry, computed))

    async def serve(self, send: Any) -> None:
        """Answer a `GET /metrics` (an ASGI `send`)."""
        body = await self.exposition()
        headers = [(b"content-type", CONTENT_TYPE_PLAIN_0_0_4.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def route_label(scope: dict[str, Any]) -> str:
    """A request's route template (`/api/rollouts/{rollout_id}`), never its raw path."""
    route = scope.get(ROUTE_KEY)
    if route is not None:
        return str(route)
    matched = scope.get("route")
    return str(getattr(matched, "path", OTHER_ROUTE)) if matched is not None else OTHER_ROUTE


def instrument(app: Any, metrics: ServerMetrics, server: str) -> Callable[..., Awaitable[None]]:
    """`app` counting its HTTP requests into `metrics` (as `server`) and answering `GET /metrics` itself.

    Put it inside the guard (`Guard(instrument(app, ...))`): `/metrics` then needs the token like any route."""

    async def instrumented(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if scope["path"] == METRICS_PATH and scope["method"] == "GET":
            started = time.perf_counter()
            await metrics.serve(send)
            metrics.observe(server, METRICS_PATH, "GET", 200, time.perf_counter() - started)
            return
        await counted(scope, send, metrics, server, lambda sending: app(scope, receive, sending))

    return instrumented


async def counted(
    scope: dict[str, Any],
    send: Any,
    metrics: ServerMetrics,
    server: str,
    serve: Callable[[Any], Awaitable[None]],
) -> None:
    """Answer one request (`serve`, given the `send` to answer with), then count it: its route, method, status
    and time to its last byte."""
    started = time.perf_counter()
    status = 500  # what the server answers when the app raises before it starts a response

    async def sending(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    try:
        await serve(sending)
    finally:
        metrics.observe(server, route_label(scope), scope["method"], status, time.perf_counter() - started)
