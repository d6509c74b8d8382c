"""`MemoryStore`: everything in dictionaries behind one lock. For tests and throwaway runs."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import agentgrad.store.transitions as t
from agentgrad.store.local import SWEEP_SECONDS, AttemptChange, LocalStore, RolloutChange, RolloutQuery, WorkerChange
from agentgrad.store.transitions import Clock
from agentgrad.types import (
    Attempt,
    AttemptedRollout,
    Metric,
    NamedResources,
    ResourcesSnapshot,
    Rollout,
    RolloutStatus,
    Run,
    Span,
    StoreStats,
    Worker,
)


class MemoryStore(LocalStore):
    def __init__(self, clock: Clock | None = None, *, sweep_seconds: float | None = SWEEP_SECONDS) -> None:
        super().__init__(clock)
        self._lock = threading.RLock()
        self._rollouts: dict[str, Rollout] = {}
        self._queue: deque[str] = deque()
        self._attempts: dict[str, list[Attempt]] = {}
        self._spans: dict[str | None, list[Span]] = {}
        self._span_count = 0
        self._span_ids: dict[str | None, dict[str, int]] = {}
        self._resources: list[ResourcesSnapshot] = []
        self._workers: dict[str, Worker] = {}
        self._metrics: list[Metric] = []
        self._runs: dict[str, Run] = {}
        self._start_sweeper(sweep_seconds)

    # ------------------------------------------------------------------ rollouts and attempts

    def _add(self, rollout: Rollout) -> None:
        self._rollouts[rollout.rollout_id] = rollout
        self._attempts[rollout.rollout_id] = []

    async def _queue_rollouts(self, rollouts: list[Rollout]) -> None:
        with self._lock:
            for rollout in rollouts:
                self._add(rollout.model_copy())
                self._queue.append(rollout.rollout_id)

    def _open_attempt(self, rollout: Rollout, worker_id: str | None) -> AttemptedRollout:
        claimed = t.open_attempt(rollout, worker_id, self.clock())
        self._attempts[rollout.rollout_id].append(claimed.attempt)
        return claimed.model_copy(update={"attempt": claimed.attempt.model_copy()})

    async def dequeue_rollout(self, worker_id: str | None = None) -> AttemptedRollout | None:
        await self.check_attempts()
        with self._lock:
            while self._queue:
                rollout = self._rollouts[self._queue.popleft()]
                if rollout.status in t.WAITING:
                    return self._open_attempt(rollout, worker_id)
        return None

    async def _start_rollout(self, rollout: Rollout, worker_id: str | None) -> AttemptedRollout:
        with self._lock:
            self._add(rollout)
            return self._open_attempt(rollout, worker_id)

    def _rollout(self, rollout_id: str) -> Rollout:
        try:
            return self._rollouts[rollout_id]
        except KeyError:
            raise t.no_rollout(rollout_id) from None

    def _attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        for attempt in self._attempts.get(self._rollout(rollout_id).rollout_id, []):
            if attempt.attempt_id == attempt_id:
                return attempt
        raise t.no_attempt(rollout_id, attempt_id)

    async def get_rollout(self, rollout_id: str) -> Rollout:
        with self._lock:
            return self._rollout(rollout_id).model_copy()

    async def _query_rollouts(self, query: RolloutQuery) -> list[Rollout]:
        wanted = None if query.statuses is None else set(query.statuses)
        with self._lock:
            if query.rollout_ids is not None:
                candidates = [self._rollouts[rid] for rid in query.rollout_ids if rid in self._rollouts]
                candidates.sort(key=lambda r: r.enqueue_time)
            else:
                candidates = list(self._rollouts.values())
            selected = [
                r
                for r in candidates
                if (wanted is None or r.status in wanted) and (query.mode is None or r.mode == query.mode)
            ]
            end = None if query.limit is None else query.offset + query.limit
            return [r.model_copy() for r in selected[query.offset : end]]

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        with self._lock:
            self._rollout(rollout_id)
            return [a.model_copy() for a in self._attempts[rollout_id]]

    def _moved_on(self, rollout: Rollout, before: RolloutStatus) -> None:
        """Requeue or announce a rollout whose status just changed."""
        if rollout.status is before:
            return
        if rollout.status is RolloutStatus.REQUEUING:
            self._queue.append(rollout.rollout_id)
        elif rollout.status.finished:
            self._notify_finished([rollout.rollout_id])

    async def _change_attempt(self, rollout_id: str, attempt_id: str, change: AttemptChange) -> Attempt:
        with self._lock:
            rollout = self._rollout(rollout_id)
            attempt = self._attempt(rollout_id, attempt_id)
            before = rollout.status
            change(rollout, attempt)  # checks everything before it changes anything
            self._moved_on(rollout, before)
            return attempt.model_copy()

    async def _change_rollout(self, rollout_id: str, change: RolloutChange) -> Rollout:
        with self._lock:
            rollout = self._rollout(rollout_id)
            before = rollout.status
            change(rollout)
            self._moved_on(rollout, before)
            return rollout.model_copy()

    async def _expire_attempts(self, at: float) -> None:
        with self._lock:
            for rollout in self._rollouts.values():
                if rollout.status is RolloutStatus.RUNNING:
                    attempt = self._attempts[rollout.rollout_id][-1]
                    expired = t.expiry(rollout.config, attempt, at)
                    if expired is not None:
                        t.end_attempt(rollout, attempt, expired, at)
                        self._moved_on(rollout, RolloutStatus.RUNNING)

    # ------------------------------------------------------------------ spans

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        stored: list[Span] = list(spans)
        at = self.clock()
        t.check_spans(spans)
        with self._lock:
            groups = t.by_rollout(spans)
            for rollout_id, indices in groups.items():  # validate all before storing any
                if rollout_id is not None:
                    for i in indices:
                        self._attempt(rollout_id, spans[i].attempt_id)  # type: ignore[arg-type]
            for rollout_id, indices in groups.items():
                bucket = self._spans.setdefault(rollout_id, [])
                known = self._span_ids.setdefault(rollout_id, {})
                written, fresh = t.sequence_spans([spans[i] for i in indices], len(bucket) + 1, known)
                for i, span in zip(indices, written):
                    stored[i] = span
                bucket.extend(fresh)
                self._span_count += len(fresh)
                if rollout_id is not None:
                    for span in fresh:
                        t.record_span(self._attempt(rollout_id, span.attempt_id), span, at)  # type: ignore[arg-type]
        return stored

    async def query_spans(
        self, rollout_id: str | None, attempt_id: str | None = None, *, all_attempts: bool = False
    ) -> list[Span]:
        with self._lock:
            if rollout_id is not None:
                rollout = self._rollout(rollout_id)
                if attempt_id is not None:
                    self._attempt(rollout_id, attempt_id)
                elif not all_attempts:
                    attempt_id = rollout.latest_attempt_id
            spans = self._spans.get(rollout_id, [])
            if rollout_id is not None and not all_attempts:
                spans = [span for span in spans if span.attempt_id == attempt_id]
            return list(spans)

    async def query_spans_of(self, rollout_ids: Sequence[str]) -> dict[str, list[Span]]:
        with self._lock:
            latest = {rid: self._rollout(rid).latest_attempt_id for rid in rollout_ids}
            return {
                rid: [span for span in self._spans.get(rid, []) if span.attempt_id == attempt_id]
                for rid, attempt_id in latest.items()
            }

    # ------------------------------------------------------------------ resources

    async def add_resources(
        self, resources: NamedResources, metadata: dict[str, Any] | None = None
    ) -> ResourcesSnapshot:
        with self._lock:
            snapshot = t.new_snapshot(len(self._resources) + 1, resources, metadata, self.clock())
            snapshot = ResourcesSnapshot.model_validate(snapshot.model_dump())  # validate and detach
            self._resources.append(snapshot)
            return snapshot.model_copy()

    def _snapshot(self, resources_id: str) -> ResourcesSnapshot:
        for snapshot in self._resources:
            if snapshot.resources_id == resources_id:
                return snapshot
        raise t.no_resources(resources_id)

    async def update_resources(self, resources_id: str, metadata: dict[str, Any]) -> ResourcesSnapshot:
        with self._lock:
            snapshot = self._snapshot(resources_id)
            snapshot.metadata = {**snapshot.metadata, **metadata}
            return snapshot.model_copy()

    async def get_resources(self, resources_id: str) -> ResourcesSnapshot:
        with self._lock:
            return self._snapshot(resources_id).model_copy()

    async def get_latest_resources(self) -> ResourcesSnapshot | None:
        with self._lock:
            return self._resources[-1].model_copy() if self._resources else None

    async def query_resources(self) -> list[ResourcesSnapshot]:
        with self._lock:
            return [snapshot.model_copy() for snapshot in self._resources]

    # ------------------------------------------------------------------ workers, metrics, stats

    async def _heartbeat(
        self, worker_id: str, change: WorkerChange, active_attempts: list[tuple[str, str]], at: float
    ) -> Worker:
        with self._lock:
            alive = [self._attempt(rollout_id, attempt_id) for rollout_id, attempt_id in active_attempts]
            worker = self._workers[worker_id] = change(self._workers.get(worker_id))
            for attempt in alive:
                attempt.last_heartbeat_time = at
            return worker.model_copy()

    async def query_workers(self) -> list[Worker]:
        with self._lock:
            return [worker.model_copy() for worker in self._workers.values()]

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        with self._lock:
            self._metrics.extend(metric.model_copy() for metric in metrics)

    async def query_metrics(
        self, name: str | None = None, prefix: str | None = None, run_id: str | None = None
    ) -> list[Metric]:
        with self._lock:
            selected = [
                m
                for m in self._metrics
                if (name is None or m.name == name)
                and (prefix is None or m.name.startswith(prefix))
                and (run_id is None or m.run_id == run_id)
            ]
        return sorted(selected, key=lambda m: (m.step, m.time))

    async def put_run(self, run: Run) -> Run:
        with self._lock:
            self._runs[run.run_id] = run.model_copy(deep=True)
            return run.model_copy(deep=True)

    async def get_run(self, run_id: str) -> Run:
        with self._lock:
            if run_id not in self._runs:
                raise t.no_run(run_id)
            return self._runs[run_id].model_copy(deep=True)

    async def query_runs(self) -> list[Run]:
        with self._lock:
            return sorted((r.model_copy(deep=True) for r in self._runs.values()), key=lambda r: r.start_time)

    async def stats(self) -> StoreStats:
        with self._lock:
            rollouts: dict[str, int] = {}
            for rollout in self._rollouts.values():
                rollouts[rollout.status.value] = rollouts.get(rollout.status.value, 0) + 1
            attempts: dict[str, int] = {}
            for attempt_list in self._attempts.values():
                for attempt in attempt_list:
                    attempts[attempt.status.value] = attempts.get(attempt.status.value, 0) + 1
            return StoreStats(
                rollouts=rollouts,
                attempts=attempts,
                spans=self._span_count,
                workers=len(self._workers),
                resources=len(self._resources),
                requeues=sum(
                    max(r.num_attempts - 1, 0) + (r.status == RolloutStatus.REQUEUING) for r in self._rollouts.values()
                ),
            )
