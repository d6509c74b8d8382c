"""`MemoryStore`: everything in dictionaries behind one lock. For tests and throwaway runs."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from agentgrad.semconv import REWARD
from agentgrad.store.base import (
    HEALTH_CHECK_SECONDS,
    NotFoundError,
    Store,
    StoreError,
    as_requests,
    attempt_outcome,
    check_attempt_update,
    check_rollout_update,
    new_attempt_id,
    new_rollout_id,
)
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
    Span,
    StoreStats,
    Worker,
    WorkerStatus,
    now,
)


class MemoryStore(Store):
    def __init__(self) -> None:
        super().__init__()
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
        self._last_check = 0.0

    # ------------------------------------------------------------------ rollouts and attempts

    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest | dict[str, Any]]) -> list[Rollout]:
        created = [
            Rollout(rollout_id=new_rollout_id(), **request.model_dump(exclude={"config"}), config=request.config)
            for request in as_requests(requests)
        ]
        with self._lock:
            for rollout in created:
                self._rollouts[rollout.rollout_id] = rollout
                self._attempts[rollout.rollout_id] = []
                self._queue.append(rollout.rollout_id)
        return [rollout.model_copy() for rollout in created]

    def _open_attempt(self, rollout: Rollout, worker_id: str | None) -> AttemptedRollout:
        attempt = Attempt(
            rollout_id=rollout.rollout_id,
            attempt_id=new_attempt_id(),
            sequence=rollout.num_attempts + 1,
            worker_id=worker_id,
        )
        self._attempts[rollout.rollout_id].append(attempt)
        rollout.status = RolloutStatus.RUNNING
        rollout.num_attempts = attempt.sequence
        rollout.latest_attempt_id = attempt.attempt_id
        rollout.start_time = rollout.start_time or attempt.start_time
        return AttemptedRollout(**rollout.__dict__, attempt=attempt.model_copy())

    async def dequeue_rollout(self, worker_id: str | None = None) -> AttemptedRollout | None:
        await self.check_attempts()
        with self._lock:
            while self._queue:
                rollout = self._rollouts[self._queue.popleft()]
                if rollout.status in (RolloutStatus.QUEUING, RolloutStatus.REQUEUING):
                    return self._open_attempt(rollout, worker_id)
        return None

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
        rollout = Rollout(
            rollout_id=new_rollout_id(),
            input=input,
            mode=mode,
            resources_id=resources_id,
            config=config or RolloutConfig(),
            metadata=metadata or {},
        )
        with self._lock:
            self._rollouts[rollout.rollout_id] = rollout
            self._attempts[rollout.rollout_id] = []
            return self._open_attempt(rollout, worker_id)

    def _rollout(self, rollout_id: str) -> Rollout:
        try:
            return self._rollouts[rollout_id]
        except KeyError:
            raise NotFoundError(f"no rollout with id {rollout_id!r}") from None

    def _attempt(self, rollout_id: str, attempt_id: str) -> Attempt:
        for attempt in self._attempts.get(self._rollout(rollout_id).rollout_id, []):
            if attempt.attempt_id == attempt_id:
                return attempt
        raise NotFoundError(f"rollout {rollout_id!r} has no attempt {attempt_id!r}")

    async def get_rollout(self, rollout_id: str) -> Rollout:
        with self._lock:
            return self._rollout(rollout_id).model_copy()

    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus | str] | None = None,
        mode: str | None = None,
        rollout_ids: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        wanted = None if status is None else {RolloutStatus(s) for s in status}
        with self._lock:
            if rollout_ids is not None:
                candidates = [self._rollouts[rid] for rid in dict.fromkeys(rollout_ids) if rid in self._rollouts]
                candidates.sort(key=lambda r: r.enqueue_time)
            else:
                candidates = list(self._rollouts.values())
            selected = [
                r
                for r in candidates
                if (wanted is None or r.status in wanted) and (mode is None or r.mode == mode)
            ]
            end = None if limit is None else offset + limit
            return [r.model_copy() for r in selected[offset:end]]

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        with self._lock:
            self._rollout(rollout_id)
            return [a.model_copy() for a in self._attempts[rollout_id]]

    def _end_attempt(self, rollout: Rollout, attempt: Attempt, status: AttemptStatus, at: float) -> None:
        attempt.status = status
        attempt.end_time = at
        if rollout.status is not RolloutStatus.RUNNING or rollout.latest_attempt_id != attempt.attempt_id:
            return  # cancelled meanwhile: the rollout keeps its status
        rollout.status = attempt_outcome(rollout, status)
        if rollout.status is RolloutStatus.REQUEUING:
            self._queue.append(rollout.rollout_id)
            return
        rollout.end_time = at
        if status is AttemptStatus.SUCCEEDED:
            rollout.reward = attempt.reward
        self._notify_finished()

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        *,
        status: AttemptStatus | str | None = None,
        reward: float | None = None,
        error: str | None = None,
    ) -> Attempt:
        status = None if status is None else AttemptStatus(status)
        with self._lock:
            rollout = self._rollout(rollout_id)
            attempt = self._attempt(rollout_id, attempt_id)
            check_attempt_update(rollout, attempt, status)
            if reward is not None:
                attempt.reward = float(reward)
            if error is not None:
                attempt.error = error
            if status is not None:
                self._end_attempt(rollout, attempt, status, now())
            return attempt.model_copy()

    async def update_rollout(
        self,
        rollout_id: str,
        *,
        status: RolloutStatus | str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        status = None if status is None else RolloutStatus(status)
        with self._lock:
            rollout = self._rollout(rollout_id)
            check_rollout_update(rollout, status)
            if metadata:
                rollout.metadata = {**rollout.metadata, **metadata}
            if status is not None:
                rollout.status = status
                rollout.end_time = now()
                self._notify_finished()
            return rollout.model_copy()

    async def check_attempts(self, force: bool = False) -> None:
        at = now()
        with self._lock:
            if not force and at - self._last_check < HEALTH_CHECK_SECONDS:
                return
            self._last_check = at
            for rollout in self._rollouts.values():
                if rollout.status is not RolloutStatus.RUNNING:
                    continue
                attempt = self._attempts[rollout.rollout_id][-1]
                config = rollout.config
                if config.timeout_seconds is not None and at - attempt.start_time > config.timeout_seconds:
                    self._end_attempt(rollout, attempt, AttemptStatus.TIMEOUT, at)
                elif (
                    config.unresponsive_seconds is not None
                    and at - attempt.last_heartbeat_time > config.unresponsive_seconds
                ):
                    self._end_attempt(rollout, attempt, AttemptStatus.UNRESPONSIVE, at)

    # ------------------------------------------------------------------ spans

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        stored: list[Span] = []
        at = now()
        with self._lock:
            for span in spans:  # validate all before storing any
                if span.rollout_id is not None:
                    if span.attempt_id is None:
                        raise StoreError(f"span {span.name!r} names rollout {span.rollout_id!r} but no attempt_id")
                    self._attempt(span.rollout_id, span.attempt_id)
            for span in spans:
                bucket = self._spans.setdefault(span.rollout_id, [])
                known = self._span_ids.setdefault(span.rollout_id, {})
                if span.span_id in known:  # written before: a retry
                    stored.append(span.model_copy(update={"sequence_id": known[span.span_id]}))
                    continue
                span = span.model_copy(update={"sequence_id": len(bucket) + 1})
                if span.span_id:
                    known[span.span_id] = span.sequence_id
                bucket.append(span)
                stored.append(span)
                if span.rollout_id is not None:
                    attempt = self._attempt(span.rollout_id, span.attempt_id)  # type: ignore[arg-type]
                    attempt.last_heartbeat_time = at
                    reward = span.attributes.get(REWARD)
                    if isinstance(reward, (int, float)) and attempt.status is AttemptStatus.RUNNING:
                        attempt.reward = float(reward)
                self._span_count += 1
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

    # ------------------------------------------------------------------ resources

    async def add_resources(
        self, resources: NamedResources, metadata: dict[str, Any] | None = None
    ) -> ResourcesSnapshot:
        with self._lock:
            version = len(self._resources) + 1
            snapshot = ResourcesSnapshot(
                resources_id=f"res-{version}", version=version, resources=resources, metadata=metadata or {}
            )
            snapshot = ResourcesSnapshot.model_validate(snapshot.model_dump())  # validate and detach
            self._resources.append(snapshot)
            return snapshot.model_copy()

    def _snapshot(self, resources_id: str) -> ResourcesSnapshot:
        for snapshot in self._resources:
            if snapshot.resources_id == resources_id:
                return snapshot
        raise NotFoundError(f"no resources with id {resources_id!r}")

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

    async def heartbeat(
        self,
        worker_id: str,
        *,
        status: WorkerStatus | str | None = None,
        active_attempts: Sequence[tuple[str, str]] | None = None,
        info: dict[str, Any] | None = None,
    ) -> Worker:
        at = now()
        with self._lock:
            for rollout_id, attempt_id in active_attempts or ():
                self._attempt(rollout_id, attempt_id)
            worker = self._workers.setdefault(worker_id, Worker(worker_id=worker_id))
            worker.last_heartbeat_time = at
            if status is not None:
                worker.status = WorkerStatus(status)
            if active_attempts is not None:
                worker.active_attempts = [attempt_id for _, attempt_id in active_attempts]
                for rollout_id, attempt_id in active_attempts:
                    self._attempt(rollout_id, attempt_id).last_heartbeat_time = at
            if info:
                worker.info = {**worker.info, **info}
            return worker.model_copy()

    async def query_workers(self) -> list[Worker]:
        with self._lock:
            return [worker.model_copy() for worker in self._workers.values()]

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        with self._lock:
            self._metrics.extend(metric.model_copy() for metric in metrics)

    async def query_metrics(self, name: str | None = None, prefix: str | None = None) -> list[Metric]:
        with self._lock:
            selected = [
                m
                for m in self._metrics
                if (name is None or m.name == name) and (prefix is None or m.name.startswith(prefix))
            ]
        return sorted(selected, key=lambda m: (m.step, m.time))

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
            )
