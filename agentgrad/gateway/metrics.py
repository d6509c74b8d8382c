"""What the gateway exports to Prometheus: calls, tokens, errors, retries and deadlines per upstream, A/B arms, and
the route table serving.

Counted once per call, where its span is made (`relay.Recorder.record`): a few dictionary updates on the gateway's
event loop (`agentgrad.serving.metrics.Counts`), which the scrape, on the same loop, turns into metric families. Labels
are the configuration's names (upstreams, split models and arms), never what a caller sends: a model nothing
routes counts under `upstream="none"`, an upstream's own error code under `code="upstream_error"`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agentgrad import semconv as sc
from agentgrad.gateway.recording import Call
from agentgrad.gateway.upstreams import GatewayError
from agentgrad.serving.metrics import LATENCY_BUCKETS, Buckets, Counts

GATEWAY_CODES = frozenset(
    {
        "bad_upstream_response",
        "client_disconnected",
        "invalid_request",
        "model_not_found",
        "rate_limited",
        "stream_interrupted",
        "upstream_interrupted",
        "upstream_timeout",
        "upstream_unreachable",
    }
)
"""Error codes the gateway itself gives a call; any other (an upstream's own) counts as `upstream_error`."""
DEADLINE_CODE = "upstream_timeout"
NO_UPSTREAM = "none"


class GatewayMetrics:
    """The gateway's counts (see the module's docstring); `record` takes each call once, `collect` exports them."""

    def __init__(self, table: Callable[[], Any]) -> None:
        self._table = table  # the route table serving now: its id and generation
        self.calls = Counts(
            "agentgrad_gateway_calls_total",
            "Model calls answered, by upstream, API and status",
            ("upstream", "api", "status"),
        )
        self.latency = Buckets(
            "agentgrad_gateway_call_duration_seconds",
            "Time from a call's arrival to its last byte, by upstream",
            ("upstream",),
            LATENCY_BUCKETS,
        )
        self.tokens = Counts(
            "agentgrad_gateway_tokens_total", "Tokens the upstreams report, by upstream and kind", ("upstream", "kind")
        )
        self.errors = Counts(
            "agentgrad_gateway_errors_total", "Calls that ended in an error, by upstream and code", ("upstream", "code")
        )
        self.retries = Counts("agentgrad_gateway_retries_total", "Retries of upstream requests", ("upstream",))
        self.deadlines = Counts(
            "agentgrad_gateway_deadlines_total", "Calls cut by their deadline (a 504), by upstream", ("upstream",)
        )
        self.arms = Counts(
            "agentgrad_gateway_ab_calls_total", "Calls of A/B-split models, by model and arm", ("model", "arm")
        )
        self.swaps = Counts(
            "agentgrad_gateway_route_table_swaps_total",
            "Route tables set on the live gateway, by outcome",
            ("outcome",),
        )
        self.in_flight = 0
        self.cache_hits = 0

    def record(
        self, call: Call, answered: dict[str, Any], error: GatewayError | None, retries: int, seconds: float
    ) -> None:
        """Count one call, as its span is made."""
        upstream = call.upstream.name if call.upstream is not None else NO_UPSTREAM
        self.calls.add((upstream, call.api, str(error.status if error is not None else 200)))
        self.latency.observe((upstream,), seconds)
        input_tokens, output_tokens = answered.get(sc.GEN_AI_INPUT_TOKENS), answered.get(sc.GEN_AI_OUTPUT_TOKENS)
        if isinstance(input_tokens, int):
            self.tokens.add((upstream, "input"), input_tokens)
        if isinstance(output_tokens, int):
            self.tokens.add((upstream, "output"), output_tokens)
        if error is not None:
            code = error.code if error.code in GATEWAY_CODES else "upstream_error"
            self.errors.add((upstream, code))
            if error.code == DEADLINE_CODE:
                self.deadlines.add((upstream,))
        if retries:
            self.retries.add((upstream,), retries)
        if call.arm is not None:
            self.arms.add((str(call.request.get("model")), call.arm))
        if call.sampling.get(sc.CACHE_HIT):
            self.cache_hits += 1

    def collect(self) -> Iterator[Metric]:
        for counts in (self.calls, self.latency, self.tokens, self.errors, self.retries, self.deadlines, self.arms):
            yield from counts.collect()
        yield from self.swaps.collect()
        yield GaugeMetricFamily("agentgrad_gateway_calls_in_flight", "Calls being answered now", value=self.in_flight)
        yield CounterMetricFamily(
            "agentgrad_gateway_cache_hits", "Calls answered from the response cache", value=self.cache_hits
        )
        table = self._table()
        yield GaugeMetricFamily(
            "agentgrad_gateway_route_table_generation",
            "Route tables this gateway has served (1: the one it started with)",
            value=table.generation,
        )
        info = GaugeMetricFamily("agentgrad_gateway_route_table", "The route table serving now (1)", labels=["id"])
        info.add_metric([table.id], 1)
        yield info
