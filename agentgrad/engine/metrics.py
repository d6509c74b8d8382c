"""What the engine server exports to Prometheus: its batch, tokens, KV cache and prefix cache, read when scraped.

Counters are the engine's own (`Engine.stats`, kept by its generation thread); rates are Prometheus's to compute:
tokens/s is `rate(agentgrad_engine_generated_tokens_total[1m])`, the mean batch size
`rate(agentgrad_engine_decode_rows_total[1m]) / rate(agentgrad_engine_decode_steps_total[1m])`, the prefix cache's
share of prompt tokens `rate(agentgrad_engine_prefix_cache_tokens_total[5m]) / rate(agentgrad_engine_prompt_tokens_total[5m])`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agentgrad.engine.engine import TRIM_EVERY_REQUESTS, Engine
from agentgrad.engine.kv_cache import KV_POOL

COUNTERS = {
    "generated_tokens": "Tokens generated",
    "prompt_tokens": "Prompt tokens of the requests served",
    "prefill_tokens": "Prompt tokens computed (the rest came from the prefix cache)",
    "prefix_cache_tokens": "Prompt tokens whose keys and values came from the prefix cache",
    "requests": "Requests (rows of a request with n > 1 count once)",
    "cancelled": "Requests cancelled before they finished (the client went away)",
    "decode_steps": "Decode steps run",
    "decode_rows": "Rows generating, summed over decode steps (over decode_steps: the mean batch size)",
    "memory_trims": f"Times freed heap memory went back to the system while serving (every {TRIM_EVERY_REQUESTS} requests)",
}


class EngineCollector:
    """The engine's figures as metric families (`ServerMetrics.add`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        stats = dict(engine.stats)
        for name, documentation in COUNTERS.items():
            yield CounterMetricFamily(f"agentgrad_engine_{name}", documentation, value=stats.get(name, 0))
        gauges = (
            ("batch_rows", "Rows the running batch generates now", engine.running_rows),
            ("max_batch_rows", "Most rows a batch holds", engine.max_batch_size),
            ("waiting_requests", "Requests waiting to join the batch", engine.waiting_requests),
            ("kv_cache_bytes", "Keys and values the running batch holds", engine.kv_bytes),
            ("kv_pool_bytes", "Retired KV buffers kept for reuse", KV_POOL.bytes),
            ("prefix_cache_bytes", "Keys and values kept in the prefix cache", engine.prefix_cache.bytes),
            ("prefix_cache_max_bytes", "The prefix cache's bound", engine.prefix_cache.max_bytes),
            ("prefix_cache_entries", "Finished sequences in the prefix cache", len(engine.prefix_cache)),
            ("weights_version", "Weights version served (bumped by each publish)", engine.version),
        )
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(f"agentgrad_engine_{name}", documentation, value=value)
