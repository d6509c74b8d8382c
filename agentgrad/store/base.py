"""The store interface: the single source of truth that algorithms, runners and the gateway share.

Every backend (memory, SQLite, HTTP client) implements `Store` and passes the same contract
suite (`tests/store/test_contract.py`). The state machine (status transitions, what an
attempt's end does to its rollout, span sequencing, heartbeats) is `transitions`, which every
backend calls; waiting lives here, once.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from agentgrad.store.errors import InvalidTransitionError, NotFoundError, StoreError
from agentgrad.store.idempotency import Answer, Replays
from agentgrad.store.transitions import HEALTH_CHECK_SECONDS, Clock, as_requests
from agentgrad.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    Metric,
    NamedResources,
    ResourcesSnapshot,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Run,
    Span,
    StoreStats,
    Worker,
    WorkerStatus,
    now,
)

__all__ = ["HEALTH_CHECK_SECONDS", "InvalidTransitionError", "NotFoundError", "Store", "StoreError", "as_requests"]

WAIT_POLL_SECONDS = 0.05
"""How often `wait_for_rollouts` looks again when no in-process notification arrives (other processes)."""


class Store(ABC):
    """Rollouts, attempts, spans, resources, workers and metrics, behind one async interface.

    Backends are safe to share between threads; the SQLite backend is also safe to share
    between processes on one file. `clock` (seconds since the epoch; the wall clock by default)
    stamps every record and drives timeouts, heartbeats and requeues: tests pass one they move.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or now
        self._replays = Replays()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event, frozenset[str]]] = set()
        self._waiters_lock = threading.Lock()

    # ------------------------------------------------------------------ rollouts and attempts

    async def enqueue_rollout(
        self,
        input: Any,
        *,
        mode: str | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        request = RolloutRequest(
            input=input,
            mode=mode,
            resources_id=resources_id,
            config=config or RolloutConfig(),
            metadata=metadata or {},
        )
        return (await self.enqueue_rollouts([request]))[0]

    @abstractmethod
    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest | dict[str, Any]]) -> list[Rollout]:
        """Queue new rollouts, in order; they are dequeued first in, first out."""

    @abstractmethod
    async def dequeue_rollout(self, worker_id: str | None = None) -> AttemptedRollout | None:
        """Claim the oldest waiting rollout and open an attempt for it; None if none waits.

        Exactly one caller gets each rollout, however many threads or processes ask.
        """

    @abstractmethod
    async def start_rollout(
        self,
        input: Any,
        *,
        mode: str | None = None,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        worker_id: str | None = None,
    ) -> AttemptedRollout:
        """Create a rollout already running with its first attempt (dev runs, no queue)."""

    @abstractmethod
    async def get_rollout(self, rollout_id: str) -> Rollout:
        """The rollout, or NotFoundError."""

    @abstractmethod
    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus | str] | None = None,
        mode: str | None = None,
        rollout_ids: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        """Rollouts in enqueue order, filtered and paginated."""

    @abstractmethod
    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout, first to last."""

    @abstractmethod
    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        *,
        status: AttemptStatus | str | None = None,
        reward: float | None = None,
        error: str | None = None,
    ) -> Attempt:
        """End an attempt (or record its reward); its rollout then succeeds, requeues or fails.

        An attempt that succeeds without an explicit reward takes the last reward span it wrote.
        """

    @abstractmethod
    async def update_rollout(
        self,
        rollout_id: str,
        *,
        status: RolloutStatus | str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        """Cancel a rollout or merge keys into its metadata."""

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Wait until every given rollout is finished or `timeout` seconds pass.

        Returns the finished ones, in the order asked. Wakes as soon as the last one finishes
        in this process, and within `WAIT_POLL_SECONDS` when it finishes in another. The timeout
        runs on the store's clock, like every other time the store keeps (a test moves it).
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else self.clock() + timeout
        event = asyncio.Event()
        waiter = (loop, event, frozenset(rollout_ids))
        with self._waiters_lock:
            self._waiters.add(waiter)
        try:
            while True:
                event.clear()
                await self.check_attempts()
                finished = await self._finished_rollouts(rollout_ids)
                if len(finished) == len(set(rollout_ids)):
                    break
                remaining = None if deadline is None else deadline - self.clock()
                if remaining is not None and remaining <= 0:
                    break
                poll = await self._poll_seconds()
                pause = poll if remaining is None else min(poll, remaining)
                try:
                    await asyncio.wait_for(event.wait(), pause)
                except TimeoutError:
                    pass
        finally:
            with self._waiters_lock:
                self._waiters.discard(waiter)
        by_id = {rollout.rollout_id: rollout for rollout in finished}
        return [by_id[rid] for rid in dict.fromkeys(rollout_ids) if rid in by_id]

    async def _finished_rollouts(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        rollouts = await self.query_rollouts(rollout_ids=rollout_ids)
        return [rollout for rollout in rollouts if rollout.status.finished]

    async def _poll_seconds(self) -> float:
        """How long a `wait_for_rollouts` sleeps between looks when nothing wakes it."""
        return WAIT_POLL_SECONDS

    def _notify_finished(self, rollout_ids: Iterable[str]) -> None:
        """Wake each `wait_for_rollouts` in this process that waits on one of `rollout_ids`, called when they finish."""
        finished = set(rollout_ids)
        with self._waiters_lock:
            waiters = [w for w in self._waiters if not finished.isdisjoint(w[2])]
        for loop, event, _ in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed
                pass

    @abstractmethod
    async def check_attempts(self, force: bool = False) -> None:
        """Mark attempts past `timeout_seconds` or silent for `unresponsive_seconds`, requeue or fail
        their rollouts. Runs at most every `HEALTH_CHECK_SECONDS` unless forced."""

    # ------------------------------------------------------------------ spans

    async def add_span(self, span: Span) -> Span:
        return (await self.add_spans([span]))[0]

    @abstractmethod
    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans, giving each the next sequence id of its rollout; each counts as a heartbeat."""

    @abstractmethod
    async def query_spans(
        self, rollout_id: str | None, attempt_id: str | None = None, *, all_attempts: bool = False
    ) -> list[Span]:
        """Spans by sequence id: of the latest attempt, of `attempt_id`, or of every attempt.

        `rollout_id=None` reads the spans recorded outside any rollout.
        """

    @abstractmethod
    async def query_spans_of(self, rollout_ids: Sequence[str]) -> dict[str, list[Span]]:
        """The spans of each rollout's latest attempt, by sequence id, keyed by rollout id: one read for a
        step's rollouts instead of one each. An unknown id is a `NotFoundError`, as in `query_spans`."""

    # ------------------------------------------------------------------ resources

    @abstractmethod
    async def add_resources(
        self, resources: NamedResources, metadata: dict[str, Any] | None = None
    ) -> ResourcesSnapshot:
        """Store a new version of the resources; it becomes the latest."""

    @abstractmethod
    async def update_resources(self, resources_id: str, metadata: dict[str, Any]) -> ResourcesSnapshot:
        """Merge keys into a snapshot's metadata (a score found later, say)."""

    @abstractmethod
    async def get_resources(self, resources_id: str) -> ResourcesSnapshot:
        """The snapshot, or NotFoundError."""

    @abstractmethod
    async def get_latest_resources(self) -> ResourcesSnapshot | None:
        """The newest snapshot, or None before any was added."""

    @abstractmethod
    async def query_resources(self) -> list[ResourcesSnapshot]:
        """Every snapshot, oldest first."""

    # ------------------------------------------------------------------ workers, metrics, stats

    @abstractmethod
    async def heartbeat(
        self,
        worker_id: str,
        *,
        status: WorkerStatus | str | None = None,
        active_attempts: Sequence[tuple[str, str]] | None = None,
        info: dict[str, Any] | None = None,
    ) -> Worker:
        """A worker is alive; `active_attempts` (rollout id, attempt id) are alive with it."""

    @abstractmethod
    async def query_workers(self) -> list[Worker]:
        """Every worker that ever sent a heartbeat."""

    @abstractmethod
    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        """Append points to training curves."""

    @abstractmethod
    async def query_metrics(
        self, name: str | None = None, prefix: str | None = None, run_id: str | None = None
    ) -> list[Metric]:
        """Points by name (exact) or name prefix, of one run when `run_id` is given, in step then time order."""

    async def latest_metrics(self) -> list[Metric]:
        """The newest point (by time) of each metric name: what a monitoring scrape exports. Backends with an index
        answer it without reading every point."""
        latest: dict[str, Metric] = {}
        for point in await self.query_metrics():
            if point.name not in latest or point.time >= latest[point.name].time:
                latest[point.name] = point
        return list(latest.values())

    # ------------------------------------------------------------------ runs

    @abstractmethod
    async def put_run(self, run: Run) -> Run:
        """Record a run, or replace the record of the run with its id (a run is written when it starts and ends)."""

    @abstractmethod
    async def get_run(self, run_id: str) -> Run:
        """The run, or NotFoundError."""

    @abstractmethod
    async def query_runs(self) -> list[Run]:
        """Every run, by start time."""

    @abstractmethod
    async def stats(self) -> StoreStats:
        """Counts by status, for dashboards and progress lines."""

    async def run_once(self, key: str, work: Callable[[], Awaitable[Answer]]) -> Answer:
        """Answer a write (`work`, HTTP status and body) at most once per idempotency key; a retry with the
        key gets the first answer. Kept in memory here; `SqliteStore` commits it with the change."""
        return await self._replays.run(key, work)

    async def close(self) -> None:  # noqa: B027 (a no-op by default: a backend without resources need not define it)
        """Release the backend's resources; the store is unusable afterwards."""

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
