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
import inspect
import json
import logging
import math
import os
import random
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast
from urllib.parse import quote, urlencode

from pydantic import TypeAdapter

from agentgrad.serving.guard import TOKEN_ENV
from agentgrad.store.api import BY_NAME, LONG_POLL_SECONDS, AddSpansReply, Operation
from agentgrad.store.base import Store
from agentgrad.store.errors import DiskFullError, InvalidTransitionError, NotFoundError, StoreError
from agentgrad.store.http11 import ConnectionPool, TransportError
from agentgrad.store.span_batches import SpanBatches
from agentgrad.store.transitions import as_requests
from agentgrad.types import (
    Metric,
    Rollout,
    Span,
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


Method = TypeVar("Method", bound=Callable[..., Awaitable[Any]])


def remote(method: Method) -> Method:
    """`Store.method` as a call to the server's operation of that name: the arguments bound to the method's
    signature (its defaults applied) are the operation's fields; an argument left None takes the field's default."""
    signature = inspect.signature(method)
    name = method.__name__

    async def call(self: StoreClient, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return await self._invoke(name, **{k: v for k, v in bound.arguments.items() if k != "self"})

    call.__name__, call.__qualname__, call.__doc__ = name, f"StoreClient.{name}", method.__doc__
    return cast(Method, call)


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
            fields = operation.body.model_fields  # None for a field with a default: its default
            given = {k: v for k, v in arguments.items() if v is not None or fields[k].is_required()}
            payload = operation.body(**given).model_dump_json().encode()
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

    # ------------------------------------------------------------------ the operations, each derived from `Store`'s

    dequeue_rollout = remote(Store.dequeue_rollout)
    start_rollout = remote(Store.start_rollout)
    get_rollout = remote(Store.get_rollout)
    query_rollouts = remote(Store.query_rollouts)
    query_attempts = remote(Store.query_attempts)
    update_attempt = remote(Store.update_attempt)
    update_rollout = remote(Store.update_rollout)
    check_attempts = remote(Store.check_attempts)
    query_spans = remote(Store.query_spans)
    query_spans_of = remote(Store.query_spans_of)
    add_resources = remote(Store.add_resources)
    update_resources = remote(Store.update_resources)
    get_resources = remote(Store.get_resources)
    get_latest_resources = remote(Store.get_latest_resources)
    query_resources = remote(Store.query_resources)
    heartbeat = remote(Store.heartbeat)
    query_workers = remote(Store.query_workers)
    query_metrics = remote(Store.query_metrics)
    put_run = remote(Store.put_run)
    get_run = remote(Store.get_run)
    query_runs = remote(Store.query_runs)
    latest_metrics = remote(Store.latest_metrics)
    stats = remote(Store.stats)

    # ------------------------------------------------------------------ the operations done here in part

    async def enqueue_rollouts(self, requests: Sequence[Any]) -> list[Rollout]:
        return await self._invoke("enqueue_rollouts", requests=as_requests(requests))

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

    # ------------------------------------------------------------------ resources

    # ------------------------------------------------------------------ workers, metrics, stats

    async def add_metrics(self, metrics: Sequence[Metric]) -> None:
        for metric in metrics:
            if not math.isfinite(metric.value):
                raise ValueError(
                    f"metric {metric.name!r} at step {metric.step} is {metric.value}, which JSON cannot carry "
                    "to the store server; log a finite value"
                )
        await self._invoke("add_metrics", metrics=list(metrics))


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
