"""`StoreClient`: the `Store` interface over HTTP, for runners in other processes and on other machines.

It raises what the local backends raise (`NotFoundError`, `InvalidTransitionError`,
`StoreError`, `ValueError`, `DiskFullError`) with the server's message. Connection errors and 5xx
answers are retried with backoff for up to `retry_seconds`, so runners ride out a server restart;
4xx answers never are, nor is a 507 (the store's disk is full: it fails at once, saying where). Each write carries an idempotency key, so a retry after a lost answer is
not applied twice: a SQLite-backed server commits each answer with its change, so that holds
across a server crash too. Routes, bodies and answers come from `api.OPERATIONS`, the table
the server is built from.

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

from pydantic import TypeAdapter

from agentgrad.guard import TOKEN_ENV
from agentgrad.store.api import BY_NAME, LONG_POLL_SECONDS, AddSpansReply, Operation
from agentgrad.store.base import Store
from agentgrad.store.errors import DiskFullError, InvalidTransitionError, NotFoundError, StoreError
from agentgrad.store.http11 import ConnectionPool, TransportError
from agentgrad.store.span_batches import SpanBatches
from agentgrad.store.transitions import as_requests
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
    Run,
    Span,
    StoreStats,
    Worker,
    WorkerStatus,
)

log = logging.getLogger(__name__)

RETRY_SECONDS = 60.0
"""How long a call keeps retrying while the server is unreachable or answers 5xx (but `FINAL_5XX`)."""
FINAL_5XX = frozenset({507})
"""Server errors that a retry cannot cure: 507, the store's disk is full (someone must free space first)."""
FIRST_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 2.0
REQUEST_TIMEOUT_SECONDS = 60.0
"""Longest wait for one answer (a long-poll gets `LONG_POLL_SECONDS` more)."""

ERRORS: dict[str, type[Exception]] = {
    "NotFoundError": NotFoundError,
    "InvalidTransitionError": InvalidTransitionError,
    "StoreError": StoreError,
    "DiskFullError": DiskFullError,
    "ValidationError": ValueError,
    "ValueError": ValueError,
}

_RESULTS: dict[str, TypeAdapter[Any]] = {name: TypeAdapter(op.response) for name, op in BY_NAME.items()}


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
        self._batches: dict[asyncio.AbstractEventLoop, SpanBatches] = {}
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
                    self._batches.pop(closed, None)
                pool = self._pools[loop] = ConnectionPool(self.url, self._headers)
                self._batches[loop] = SpanBatches(self._send_spans)
        return pool

    async def close(self) -> None:
        """Close this event loop's connections (other loops' close with their loops)."""
        with self._pools_lock:
            pool = self._pools.pop(asyncio.get_running_loop(), None)
            self._batches.pop(asyncio.get_running_loop(), None)
        if pool is not None:
            pool.close()

    async def _invoke(self, name: str, timeout: float = REQUEST_TIMEOUT_SECONDS, /, **arguments: Any) -> Any:
        """Call the store method `name` on the server: its route, body and answer come from `api.OPERATIONS`."""
        operation = BY_NAME[name]
        path = operation.path.format(**{param: _segment(arguments.pop(param)) for param in operation.path_params})
        payload = None
        if operation.body is not None:
            payload = operation.body(**arguments).model_dump_json().encode()
        elif operation.query is not None:
            query = operation.query(**arguments).model_dump(exclude_defaults=True)
            path += "?" + urlencode({k: str(v).lower() if isinstance(v, bool) else v for k, v in query.items()})
        answer = await self._call(operation, path, payload, timeout)
        return None if operation.response is None else _RESULTS[name].validate_json(answer)

    async def _call(self, operation: Operation, path: str, payload: bytes | None, timeout: float) -> bytes:
        """One API call with retries; returns the answer's JSON or raises the store's exception.

        A write carries one idempotency key over all its retries, so the server applies it once."""
        method = operation.method
        headers = {"idempotency-key": uuid.uuid4().hex} if operation.once else None
        pool = self._pool()
        deadline = time.monotonic() + self.retry_seconds
        backoff = FIRST_BACKOFF_SECONDS
        while True:
            try:
                response = await pool.request(method, path, payload, headers, timeout)
                if response.status < 500 or response.status in FINAL_5XX:
                    break
                raise _ServerTrouble(f"HTTP {response.status}: {response.body[:500]!r}")
            except (TimeoutError, TransportError, _ServerTrouble) as exc:
                if time.monotonic() + backoff > deadline:
                    raise StoreUnreachable(
                        f"store server at {self.url} failed for {self.retry_seconds:.0f} s: {exc}"
                    ) from exc
                log.debug("store call %s %s failed (%s); retrying in %.2f s", method, path, exc, backoff)
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
        if response.status >= 400:
            raise _error(response.status, response.body, self.url)
        return response.body

    # ------------------------------------------------------------------ rollouts and attempts

    async def enqueue_rollouts(self, requests: Sequence[Any]) -> list[Rollout]:
        return await self._invoke("enqueue_rollouts", requests=as_requests(requests))

    async def dequeue_rollout(self, worker_id: str | None = None) -> AttemptedRollout | None:
        return await self._invoke("dequeue_rollout", worker_id=worker_id)

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
        return await self._invoke(
            "start_rollout",
            input=input,
            mode=mode,
            resources_id=resources_id,
            config=config or RolloutConfig(),
            metadata=metadata or {},
            worker_id=worker_id,
        )

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return await self._invoke("get_rollout", rollout_id=rollout_id)

    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus | str] | None = None,
        mode: str | None = None,
        rollout_ids: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        return await self._invoke(
            "query_rollouts",
            status=None if status is None else list(status),
            mode=mode,
            rollout_ids=None if rollout_ids is None else list(rollout_ids),
            limit=limit,
            offset=offset,
        )

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        return await self._invoke("query_attempts", rollout_id=rollout_id)

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        *,
        status: AttemptStatus | str | None = None,
        reward: float | None = None,
        error: str | None = None,
    ) -> Attempt:
        return await self._invoke(
            "update_attempt", rollout_id=rollout_id, attempt_id=attempt_id, status=status, reward=reward, error=error
        )

    async def update_rollout(
        self,
        rollout_id: str,
        *,
        status: RolloutStatus | str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        return await self._invoke("update_rollout", rollout_id=rollout_id, status=status, metadata=metadata)

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Long-polls the server, which answers as soon as the rollouts finish or its poll time is up.

        The last poll asks the server to hold until the deadline, which it keeps on its store's clock;
        its answer then ends the wait (so a server whose clock a test moves decides when it is over)."""
        wanted = list(dict.fromkeys(rollout_ids))
        finished: dict[str, Rollout] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pending = [rid for rid in wanted if rid not in finished]
            if not pending:
                break
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            poll = LONG_POLL_SECONDS if remaining is None else min(remaining, LONG_POLL_SECONDS)
            answer = await self._invoke(
                "wait_for_rollouts", poll + REQUEST_TIMEOUT_SECONDS, rollout_ids=pending, timeout=poll
            )
            finished.update((rollout.rollout_id, rollout) for rollout in answer)
            if remaining is not None and poll >= remaining:  # the server held it to the deadline
                break
        return [finished[rid] for rid in wanted if rid in finished]

    async def check_attempts(self, force: bool = False) -> None:
        await self._invoke("check_attempts", force=force)

    # ------------------------------------------------------------------ spans

    async def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Spans written by other tasks of this loop meanwhile travel in the same request (`span_batches`)."""
        if not spans:
            return []
        self._pool()
        return await self._batches[asyncio.get_running_loop()].add(spans)

    async def _send_spans(self, spans: list[Span]) -> list[int]:
        answer: AddSpansReply = await self._invoke("add_spans", spans=spans)
        return answer.sequence_ids

    async def query_spans(
        self, rollout_id: str | None, attempt_id: str | None = None, *, all_attempts: bool = False
    ) -> list[Span]:
        return await self._invoke(
            "query_spans", rollout_id=rollout_id, attempt_id=attempt_id, all_attempts=all_attempts
        )

    async def query_spans_of(self, rollout_ids: Sequence[str]) -> dict[str, list[Span]]:
        return await self._invoke("query_spans_of", rollout_ids=list(rollout_ids))

    # ------------------------------------------------------------------ resources

    async def add_resources(
        self, resources: NamedResources, metadata: dict[str, Any] | None = None
    ) -> ResourcesSnapshot:
        return await self._invoke("add_resources", resources=resources, metadata=metadata or {})

    async def update_resources(self, resources_id: str, metadata: dict[str, Any]) -> ResourcesSnapshot:
        return await self._invoke("update_resources", resources_id=resources_id, metadata=metadata)

    async def get_resources(self, resources_id: str) -> ResourcesSnapshot:
        return await self._invoke("get_resources", resources_id=resources_id)

    async def get_latest_resources(self) -> ResourcesSnapshot | None:
        return await self._invoke("get_latest_resources")

    async def query_resources(self) -> list[ResourcesSnapshot]:
        return await self._invoke("query_resources")

    # ------------------------------------------------------------------ workers, metrics, stats

    async def heartbeat(
        self,
        worker_id: str,
        *,
        status: WorkerStatus | str | None = None,
        active_attempts: Sequence[tuple[str, str]] | None = None,
        info: dict[str, Any] | None = None,
    ) -> Worker:
        pairs = None if active_attempts is None else [tuple(pair) for pair in active_attempts]
        return await self._invoke("heartbeat", worker_id=worker_id, status=status, active_attempts=pairs, info=info)

    async def query_workers(self) -> list[Worker]:
        return await self._invoke("query_workers")

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        for metric in metrics:
            if not math.isfinite(metric.value):
                raise ValueError(
                    f"metric {metric.name!r} at step {metric.step} is {metric.value}, which JSON cannot carry "
                    "to the store server; log a finite value"
                )
        await self._invoke("add_metrics", metrics=list(metrics))

    async def query_metrics(
        self, name: str | None = None, prefix: str | None = None, run_id: str | None = None
    ) -> list[Metric]:
        return await self._invoke("query_metrics", name=name, prefix=prefix, run_id=run_id)

    async def put_run(self, run: Run) -> Run:
        return await self._invoke("put_run", run=run)

    async def get_run(self, run_id: str) -> Run:
        return await self._invoke("get_run", run_id=run_id)

    async def query_runs(self) -> list[Run]:
        return await self._invoke("query_runs")

    async def latest_metrics(self) -> list[Metric]:
        return await self._invoke("latest_metrics")

    async def stats(self) -> StoreStats:
        return await self._invoke("stats")


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
