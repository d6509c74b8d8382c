"""`LocalStore`: the public operations of the backends that keep the data themselves (memory, SQLite).

Each operation is written here once: it calls `transitions` for what changes and hands the
change to a few hooks that find, lock and persist records. A backend implements the hooks and
the plain reads; it decides nothing.

Timeouts hold by themselves: a sweeper thread ends attempts past their limits every
`SWEEP_SECONDS` of the store's clock, so a stuck attempt is timed out (and its rollout requeued
or failed) on time even when every runner is stuck and no one asks the store for work.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import agentgrad.store.transitions as t
from agentgrad.store.base import Store
from agentgrad.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Worker,
    WorkerStatus,
)

log = logging.getLogger(__name__)

SWEEP_SECONDS = t.HEALTH_CHECK_SECONDS
"""How often the sweeper looks for attempts past their limits: wall time between looks, and the least time
on the store's clock between two sweeps (a test's clock that stands still is not swept again)."""

AttemptChange = Callable[[Rollout, Attempt], None]
RolloutChange = Callable[[Rollout], None]
WorkerChange = Callable[[Worker | None], Worker]


@dataclass(frozen=True)
class RolloutQuery:
    """What `query_rollouts` asks for; None means any."""

    statuses: list[RolloutStatus] | None
    mode: str | None
    rollout_ids: list[str] | None
    limit: int | None
    offset: int


class LocalStore(Store):
    """A store whose backend keeps the data: the operations over `transitions`, persisted by hooks.

    A backend calls `_start_sweeper()` once it can answer `_expire_attempts`, and `_stop_sweeper()` in `close`.
    """

    _last_check = 0.0
    _sweeping: threading.Event | None = None

    def _start_sweeper(self, seconds: float | None = SWEEP_SECONDS) -> None:
        """End expired attempts in the background (`None`: never; then only calls that look do)."""
        if seconds is None:
            return
        stop = self._sweeping = threading.Event()
        weakref.finalize(self, stop.set)  # a store dropped without close() stops its sweeper too
        threading.Thread(
            target=_sweep, args=(weakref.ref(self), seconds, stop, self.clock()), name=f"sweeper {self!r}", daemon=True
        ).start()

    def _stop_sweeper(self) -> None:
        if self._sweeping is not None:
            self._sweeping.set()

    async def close(self) -> None:
        self._stop_sweeper()

    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest | dict[str, Any]]) -> list[Rollout]:
        at = self.clock()
        created = [t.new_rollout(request, at) for request in t.as_requests(requests)]
        await self._queue_rollouts(created)
        return created

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
        rollout = t.new_rollout(t.start_request(input, mode, resources_id, config, metadata), self.clock())
        return await self._start_rollout(rollout, worker_id)

    async def query_rollouts(
        self,
        *,
        status: Sequence[RolloutStatus | str] | None = None,
        mode: str | None = None,
        rollout_ids: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Rollout]:
        statuses = None if status is None else [RolloutStatus(s) for s in status]
        ids = None if rollout_ids is None else list(dict.fromkeys(rollout_ids))
        if ids == []:
            return []
        return await self._query_rollouts(RolloutQuery(statuses, mode, ids, limit, offset))

    async def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        *,
        status: AttemptStatus | str | None = None,
        reward: float | None = None,
        error: str | None = None,
    ) -> Attempt:
        change = partial(t.update_attempt, status=status, reward=reward, error=error, at=self.clock())
        return await self._change_attempt(rollout_id, attempt_id, change)

    async def update_rollout(
        self,
        rollout_id: str,
        *,
        status: RolloutStatus | str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Rollout:
        return await self._change_rollout(
            rollout_id, partial(t.update_rollout, status=status, metadata=metadata, at=self.clock())
        )

    async def check_attempts(self, force: bool = False) -> None:
        at = self.clock()
        if t.health_check_due(self._last_check, at, force):
            self._last_check = at
            await self._expire_attempts(at)

    async def heartbeat(
        self,
        worker_id: str,
        *,
        status: WorkerStatus | str | None = None,
        active_attempts: Sequence[tuple[str, str]] | None = None,
        info: dict[str, Any] | None = None,
    ) -> Worker:
        at = self.clock()
        change = partial(
            t.heartbeat, worker_id=worker_id, status=status, active_attempts=active_attempts, info=info, at=at
        )
        return await self._heartbeat(worker_id, change, list(active_attempts or ()), at)

    # ------------------------------------------------------------------ what a backend implements

    @abstractmethod
    async def _queue_rollouts(self, rollouts: list[Rollout]) -> None:
        """Store new rollouts at the back of the queue, in order."""

    @abstractmethod
    async def _start_rollout(self, rollout: Rollout, worker_id: str | None) -> AttemptedRollout:
        """Store a new rollout and open its first attempt (`transitions.open_attempt`), atomically."""

    @abstractmethod
    async def _query_rollouts(self, query: RolloutQuery) -> list[Rollout]:
        """Rollouts matching `query`, in enqueue order."""

    @abstractmethod
    async def _change_attempt(self, rollout_id: str, attempt_id: str, change: AttemptChange) -> Attempt:
        """Apply `change` to the attempt and its rollout atomically, persist both, requeue or announce the rollout."""

    @abstractmethod
    async def _change_rollout(self, rollout_id: str, change: RolloutChange) -> Rollout:
        """Apply `change` to the rollout atomically and persist it."""

    @abstractmethod
    async def _expire_attempts(self, at: float) -> None:
        """End every running attempt that `transitions.expiry` says is over at `at`."""

    @abstractmethod
    async def _heartbeat(
        self, worker_id: str, change: WorkerChange, active_attempts: list[tuple[str, str]], at: float
    ) -> Worker:
        """Check the active attempts exist, mark them alive at `at`, and store `change(stored worker)`."""


def _sweep(store_ref: weakref.ref[LocalStore], seconds: float, stop: threading.Event, last: float) -> None:
    """The sweeper: every `seconds`, end the attempts of the store that are past their limits on its clock.

    It holds the store weakly (a dropped store ends it) and keeps its own time of the last sweep (`last`: the
    store's time when it started), so the throttle of `check_attempts` that calls see is left as it was."""
    loop = asyncio.new_event_loop()
    try:
        while not stop.wait(seconds):
            store = store_ref()
            if store is None:
                return
            try:
                at = store.clock()
                if at - last >= seconds or at < last:
                    last = at
                    loop.run_until_complete(store._expire_attempts(at))
            except Exception:  # a closed or unreachable backend: say so, try again at the next sweep
                if not stop.is_set():
                    log.warning("the sweeper of %r could not end expired attempts", store, exc_info=True)
            del store
    finally:
        loop.close()
