"""`LocalStore`: the public operations of the backends that keep the data themselves (memory, SQLite).

Each operation is written here once: it calls `transitions` for what changes and hands the
change to a few hooks that find, lock and persist records. A backend implements the hooks and
the plain reads; it decides nothing.
"""

from __future__ import annotations

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
    """A store whose backend keeps the data: the operations over `transitions`, persisted by hooks."""

    _last_check = 0.0

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
        return await self._change_rollout(rollout_id, partial(t.update_rollout, status=status, metadata=metadata,
                                                              at=self.clock()))

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
        change = partial(t.heartbeat, worker_id=worker_id, status=status, active_attempts=active_attempts, info=info,
                         at=at)
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
