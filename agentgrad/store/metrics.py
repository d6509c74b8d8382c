"""What the store server exports to Prometheus when scraped: its queue, its attempts, and the training curves.

Read from the store at scrape time (`Store.stats`, `Store.latest_metrics`), so the figures are the store's own,
whichever process wrote them: the queue's depth, attempts running, attempts ended by status (timed out and
unresponsive among them), requeues, spans stored; and the newest point of every training curve an algorithm
logged (`train/reward_mean`, `train/loss`, `val/accuracy`, ...) with its step, labelled by curve name and run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from agentgrad.serving.metrics import Snapshot
from agentgrad.store.base import Store
from agentgrad.types import AttemptStatus, RolloutStatus
from agentgrad.types import Metric as Point

WAITING = (RolloutStatus.QUEUING.value, RolloutStatus.REQUEUING.value)
ENDED = tuple(s.value for s in AttemptStatus if s != AttemptStatus.RUNNING)


def store_snapshot(served: Callable[[], Store]) -> Snapshot:
    """The metric families of the store `served()` names (the server's, which a test may swap), when scraped."""

    async def snapshot() -> Iterable[Metric]:
        store = served()
        stats = await store.stats()
        rollouts = GaugeMetricFamily("agentgrad_store_rollouts", "Rollouts by status", labels=["status"])
        for status in RolloutStatus:
            rollouts.add_metric([status.value], stats.rollouts.get(status.value, 0))
        ended = CounterMetricFamily(
            "agentgrad_store_attempts_ended",
            "Attempts ended, by how (timeout, unresponsive: given up)",
            labels=["status"],
        )
        for status in ENDED:
            ended.add_metric([status], stats.attempts.get(status, 0))
        families: list[Metric] = [
            GaugeMetricFamily(
                "agentgrad_store_queue_depth",
                "Rollouts waiting for a runner (queuing or requeuing)",
                value=sum(stats.rollouts.get(s, 0) for s in WAITING),
            ),
            GaugeMetricFamily(
                "agentgrad_store_attempts_running",
                "Attempts running now",
                value=stats.attempts.get(AttemptStatus.RUNNING.value, 0),
            ),
            ended,
            CounterMetricFamily(
                "agentgrad_store_requeues",
                "Rollouts sent back to the queue after an attempt ended",
                value=stats.requeues,
            ),
            CounterMetricFamily("agentgrad_store_spans", "Spans stored", value=stats.spans),
            GaugeMetricFamily("agentgrad_store_workers", "Workers that have sent a heartbeat", value=stats.workers),
            rollouts,
        ]
        return families + _curves(await store.latest_metrics())

    return snapshot


def _curves(points: Iterable[Point]) -> list[Metric]:
    """The newest point of each training curve, and the newest step each run reached."""
    values = GaugeMetricFamily(
        "agentgrad_run_metric",
        "Newest value of each training curve (train/reward_mean, train/loss, val/accuracy, ...)",
        labels=["name", "run"],
    )
    steps = GaugeMetricFamily("agentgrad_run_step", "Newest step a run logged a curve at", labels=["run"])
    newest: dict[str, int] = {}
    for point in points:
        run = point.run_id or ""
        values.add_metric([point.name, run], point.value)
        newest[run] = max(newest.get(run, 0), point.step)
    for run, step in newest.items():
        steps.add_metric([run], step)
    return [values, steps]
