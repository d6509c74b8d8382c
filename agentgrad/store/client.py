"""`StoreClient`: the `Store` interface over HTTP, for runners in other processes and on other machines.

It raises what the local backends raise (`NotFoundError`, `InvalidTransitionError`,
`StoreError`, `ValueError`) with the server's message. Connection errors and 5xx answers are
retried with backoff for up to `retry_seconds`, so runners ride out a server restart; 4xx
answers never are. Each write carries an idempotency key, so a retry after a lost answer is
not applied twice by a server that saw the first try.

One client may be used from many threads, each with its own event loop: it keeps one
connection pool per loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

from pydantic import BaseModel, TypeAdapter

from agentgrad.store.api import (
    LONG_POLL_SECONDS,
    AddMetricsBody,
    AddResourcesBody,
    AddSpansBody,
    AddSpansReply,
    CheckAttemptsBody,
    DequeueBody,
    EnqueueBody,
    HeartbeatBody,
    QueryRolloutsBody,
    StartBody,
    UpdateAttemptBody,
    UpdateResourcesBody,
    UpdateRolloutBody,
    WaitBody,
)
from agentgrad.store.base import InvalidTransitionError, NotFoundError, Store, StoreError, as_requests
from agentgrad.store.http11 import ConnectionPool, TransportError
from agentgrad.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    Metric,
    NamedResources,
    ResourcesSnapshot,
    Rollout,
    RolloutConfig,
    RolloutStatus,
    Span,
    StoreStats,
    Worker,
    WorkerStatus,
)

log = logging.getLogger(__name__)

RETRY_SECONDS = 60.0
"""How long a call keeps retrying while the server is unreachable or answers 5xx."""
FIRST_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 2.0
REQUEST_TIMEOUT_SECONDS = 60.0
"""Longest wait for one answer (a long-poll gets `LONG_POLL_SECONDS` more)."""

TOKEN_ENV = "AGENTGRAD_TOKEN"

ERRORS: dict[str, type[Exception]] = {
    "NotFoundError": NotFoundError,
    "InvalidTransitionError": InvalidTransitionError,
    "StoreError": StoreError,
    "ValidationError": ValueError,
    "ValueError": ValueError,
}

_ROLLOUTS = TypeAdapter(list[Rollout])
_ATTEMPTS = TypeAdapter(list[Attempt])
_SPANS = TypeAdapter(list[Span])
_SNAPSHOTS = TypeAdapter(list[ResourcesSnapshot])
_WORKERS = TypeAdapter(list[Worker])
_METRICS = TypeAdapter(list[Metric])


class StoreUnreachable(ConnectionError):
    """The server could not be reached, or kept failing, for the whole retry window."""


class _ServerTrouble(Exception):
    """A 5xx answer: worth retrying."""


class StoreClient(Store):
    """A store served by `agentgrad serve` (or any `create_app` server) at `url`.

    `token` defaults to the `AGENTGRAD_TOKEN` environment variable.
    """

    def __init__(self, url: str, token: str | None = None, *, retry_seconds: float = RETRY_SECONDS) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.retry_seconds = retry_seconds
        self.token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        ConnectionPool(self.url)  # check the URL now rather than on first use
        self._pools: dict[asyncio.AbstractEventLoop, ConnectionPool] = {}
        self._pools_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"StoreClient({self.url!r})"

    def _pool(self) -> ConnectionPool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            with self._pools_lock:
                for closed in [other for other in self._pools if other.is_closed()]:
                    del self._pools[closed]  # its connections died with their loop
                pool = self._pools[loop] = ConnectionPool(self.url, self._headers)
        return pool

    async def close(self) -> None:
        """Close this event loop's connections (other loops' close with their loops)."""
        with self._pools_lock:
            pool = self._pools.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            pool.close()

    async def _call(
        self, method: str, path: str, body: BaseModel | None = None, *, timeout: float = REQUEST_TIMEOUT_SECONDS
    ) -> bytes:
        """One API call with retries; returns the answer's JSON or raises the store's exception."""
        payload = None if body is None else body.model_dump_json().encode()
        headers = None if method == "GET" else {"idempotency-key": uuid.uuid4().hex}
        pool = self._pool()
        deadline = time.monotonic() + self.retry_seconds
        backoff = FIRST_BACKOFF_SECONDS
        while True:
            try:
                response = await pool.request(method, path, payload, headers, timeout)
                if response.status < 500:
                    break
                raise _ServerTrouble(f"HTTP {response.status}: {response.body[:500]!r}")
            except (TransportError, asyncio.TimeoutError, _ServerTrouble) as exc:
                if time.monotonic() + backoff > deadline:
                    raise StoreUnreachable(f"store server at {self.url} failed for {self.retry_seconds:.0f} s: {exc}") from exc
                log.debug("store call %s %s failed (%s); retrying in %.2f s", method, path, exc, backoff)
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
        if response.status >= 400:
            raise _error(response.status, response.body, self.url)
        return response.body

    # ------------------------------------------------------------------ rollouts and attempts

    async def enqueue_rollouts(self, requests: Sequence[Any]) -> list[Rollout]:
        body = EnqueueBody(requests=as_requests(requests))
        return _ROLLOUTS.validate_json(await self._call("POST", "/api/rollouts", body))

    async def dequeue_rollout(self, worker_id: str | None = None) -> AttemptedRollout | None:
        answer = await self._call("POST", "/api/rollouts/dequeue", DequeueBody(worker_id=worker_id))
        return None if answer == b"null" else AttemptedRollout.model_validate_json(answer)

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
        body = StartBody(
            input=input, mode=mode, resources_id=resources_id, config=config or RolloutConfig(),
            metadata=metadata or {}, worker_id=worker_id,
        )
        return AttemptedRollout.model_validate_json(await self._call("POST", "/api/rollouts/start", body))

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate_json(await self._call("GET", f"/api/rollouts/{_segment(rollout_id)}"))

    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus | str] | None = None,
        mode: str | None = None,
        rollout_ids: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        body = QueryRolloutsBody(
            status=None if status is None else [RolloutStatus(s) for s in status],
            mode=mode,
            rollout_ids=None if rollout_ids is None else list(rollout_ids),
            limit=limit,
            offset=offset,
        )
        return _ROLLOUTS.validate_json(await self._call("POST", "/api/rollouts/query", body))

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        return _ATTEMPTS.validate_json(await self._call("GET", f"/api/rollouts/{_segment(rollout_id)}/attempts"))

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        *,
        status: AttemptStatus | str | None = None,
        reward: float | None = None,
        error: str | None = None,
    ) -> Attempt:
        body = UpdateAttemptBody(status=None if status is None else AttemptStatus(status), reward=reward, error=error)
        path = f"/api/rollouts/{_segment(rollout_id)}/attempts/{_segment(attempt_id)}"
        return Attempt.model_validate_json(await self._call("PATCH", path, body))

    async def update_rollout(
        self,
        rollout_id: str,
        *,
        status: RolloutStatus | str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        body = UpdateRolloutBody(status=None if status is None else RolloutStatus(status), metadata=metadata)
        return Rollout.model_validate_json(await self._call("PATCH", f"/api/rollouts/{_segment(rollout_id)}", body))

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Long-polls the server, which answers as soon as the rollouts finish or its poll time is up."""
        wanted = list(dict.fromkeys(rollout_ids))
        finished: dict[str, Rollout] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pending = [rid for rid in wanted if rid not in finished]
            remaining = LONG_POLL_SECONDS if deadline is None else max(0.0, deadline - time.monotonic())
            if not pending:
                break
            poll = min(remaining, LONG_POLL_SECONDS)
            body = WaitBody(rollout_ids=pending, timeout=poll)
            answer = await self._call("POST", "/api/rollouts/wait", body, timeout=poll + REQUEST_TIMEOUT_SECONDS)
            finished.update((rollout.rollout_id, rollout) for rollout in _ROLLOUTS.validate_json(answer))
            if deadline is not None and time.monotonic() >= deadline:
                break
        return [finished[rid] for rid in wanted if rid in finished]

    async def check_attempts(self, force: bool = False) -> None:
        await self._call("POST", "/api/attempts/check", CheckAttemptsBody(force=force))

    # ------------------------------------------------------------------ spans

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        if not spans:
            return []
        answer = AddSpansReply.model_validate_json(await self._call("POST", "/api/spans", AddSpansBody(spans=list(spans))))
        return [span.model_copy(update={"sequence_id": sid}) for span, sid in zip(spans, answer.sequence_ids)]

    async def query_spans(
        self, rollout_id: str | None, attempt_id: str | None = None, *, all_attempts: bool = False
    ) -> list[Span]:
        query = {"rollout_id": rollout_id, "attempt_id": attempt_id, "all_attempts": "true" if all_attempts else None}
        path = "/api/spans?" + urlencode({k: v for k, v in query.items() if v is not None})
        return _SPANS.validate_json(await self._call("GET", path))

    # ------------------------------------------------------------------ resources

    async def add_resources(
        self, resources: NamedResources, metadata: dict[str, Any] | None = None
    ) -> ResourcesSnapshot:
        body = AddResourcesBody(resources=resources, metadata=metadata or {})
        return ResourcesSnapshot.model_validate_json(await self._call("POST", "/api/resources", body))

    async def update_resources(self, resources_id: str, metadata: dict[str, Any]) -> ResourcesSnapshot:
        body = UpdateResourcesBody(metadata=metadata)
        path = f"/api/resources/{_segment(resources_id)}"
        return ResourcesSnapshot.model_validate_json(await self._call("PATCH", path, body))

    async def get_resources(self, resources_id: str) -> ResourcesSnapshot:
        return ResourcesSnapshot.model_validate_json(await self._call("GET", f"/api/resources/{_segment(resources_id)}"))

    async def get_latest_resources(self) -> ResourcesSnapshot | None:
        answer = await self._call("GET", "/api/resources/latest")
        return None if answer == b"null" else ResourcesSnapshot.model_validate_json(answer)

    async def query_resources(self) -> list[ResourcesSnapshot]:
        return _SNAPSHOTS.validate_json(await self._call("GET", "/api/resources"))

    # ------------------------------------------------------------------ workers, metrics, stats

    async def heartbeat(
        self,
        worker_id: str,
        *,
        status: WorkerStatus | str | None = None,
        active_attempts: Sequence[tuple[str, str]] | None = None,
        info: dict[str, Any] | None = None,
    ) -> Worker:
        body = HeartbeatBody(
            worker_id=worker_id,
            status=None if status is None else WorkerStatus(status),
            active_attempts=None if active_attempts is None else [tuple(pair) for pair in active_attempts],
            info=info,
        )
        return Worker.model_validate_json(await self._call("POST", "/api/workers/heartbeat", body))

    async def query_workers(self) -> list[Worker]:
        return _WORKERS.validate_json(await self._call("GET", "/api/workers"))

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        for metric in metrics:
            if not math.isfinite(metric.value):
                raise ValueError(f"metric {metric.name!r} at step {metric.step} is {metric.value}, which JSON cannot carry "
                                 "to the store server; log a finite value")
        await self._call("POST", "/api/metrics", AddMetricsBody(metrics=list(metrics)))

    async def query_metrics(self, name: str | None = None, prefix: str | None = None) -> list[Metric]:
        query = urlencode({k: v for k, v in (("name", name), ("prefix", prefix)) if v is not None})
        return _METRICS.validate_json(await self._call("GET", "/api/metrics?" + query))

    async def stats(self) -> StoreStats:
        return StoreStats.model_validate_json(await self._call("GET", "/api/stats"))


def _segment(value: str) -> str:
    return quote(value, safe="")


def _error(status: int, body: bytes, url: str) -> Exception:
    try:
        data = json.loads(body)
        kind, detail = data["error"], data["detail"]
    except (ValueError, KeyError, TypeError):
        kind, detail = "", body.decode(errors="replace")[:500]
    if status == 401:
        return StoreError(f"the store server at {url} refused the token: pass token= (or set {TOKEN_ENV}): {detail}")
    return ERRORS.get(kind, StoreError)(detail)
