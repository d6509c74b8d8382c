"""Replicas of one model behind the gateway: which one serves a call, and which weights version.

`ReplicaPool` is a gateway router (`Gateway(store, routers={model: pool})`): each call takes a
`Lease` (a replica and the weights version it runs) and gives it back when its last byte is
relayed. A rollout's calls stick to one replica, so its prefix cache is reused across turns;
new rollouts go to the replica with the fewest calls in flight.

`pool.exclusive()` (from a thread that is not the gateway's) holds new calls, waits for the
calls in flight to finish, and lets the caller swap the weights before it reopens: every
call runs on one version from its first token to its last, and its span names that version.
`pool.attempts_held()` goes further, for attempts of several calls: it holds the first call of every
rollout that has not called yet and names those that have (on the weights served now), so a trainer can
wait for those to end before it swaps, and no attempt's calls straddle two versions.

A pool of servers holding several LoRA adapters (vLLM's multi-LoRA serving, one adapter per agent role) is given
`adapters` (adapter name -> the model name it is served under, `semconv.BASE_ADAPTER` for the base) and `resolve`
(agent name -> adapter: `Adapters.resolve`, the built-in engine's rule): each call is sent under its agent's
adapter's model name, and its lease names the adapter for the span (`agentgrad.adapter.name`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from agentgrad.gateway.upstreams import Backend, Upstream

MAX_STICKY_ROLLOUTS = 100_000
"""Rollouts remembered for stickiness; the oldest are forgotten first."""

ATTEMPT_WAIT_SECONDS = 60.0
"""How long a weights swap under asynchronous training waits, by default, for the attempts begun on the old
weights to end (`attempts_held`); the policies (`LocalPolicy`, `PolicyConfig.attempt_wait_s`) take it."""


@dataclass(frozen=True)
class Lease:
    upstream: Upstream
    version: int
    replica: int
    adapter: str | None = None  # the LoRA adapter serving the call, in a pool of several (`semconv.ADAPTER_NAME`)


class ReplicaPool:
    """`backends` are the replicas of one model; `version` the weights version they serve now.

    `adapters` (adapter -> model name upstream) and `resolve` (agent name -> adapter) serve each agent by its
    adapter on every replica; without them every call goes under the backend's own model name.
    """

    def __init__(
        self,
        name: str,
        backends: Sequence[Backend],
        version: int = 0,
        *,
        adapters: Mapping[str, str] | None = None,
        resolve: Callable[[str | None], str] | None = None,
    ) -> None:
        if not backends:
            raise ValueError(f"replica pool {name!r} needs at least one backend")
        if (adapters is None) != (resolve is None):
            raise ValueError(
                f"replica pool {name!r}: give both adapters (adapter -> model name) and resolve, or neither"
            )
        self.name = name
        self.upstreams = [Upstream.of(f"{name}#{i}", b) for i, b in enumerate(backends)]
        self.resolve = resolve
        self.adapter_upstreams = [_per_adapter(f"{name}#{i}", b, adapters or {}) for i, b in enumerate(backends)]
        self.system = backends[0].system
        self.version = version
        self.in_flight = [0] * len(backends)
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._started: OrderedDict[str, None] = OrderedDict()  # rollouts with a call on the weights served now
        self._attempts_held = False
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._drained = threading.Condition(self._lock)
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def open(self) -> bool:
        """False while a weight swap holds new calls."""
        return self._open.is_set()

    @property
    def held_calls(self) -> int:
        """Calls waiting for a weight swap or for `attempts_held` to end."""
        with self._lock:
            return len(self._waiting)

    # ------------------------------------------------------------------ gateway side (its event loop)

    async def acquire(self, rollout_id: str | None, agent: str | None = None) -> Lease:
        """A replica for this call (the rollout's own, or the least loaded), once the pool is open; in a pool of
        adapters, under the model name of `agent`'s adapter."""
        adapter = self.resolve(agent) if self.resolve is not None else None
        while True:
            with self._lock:
                if self._open.is_set() and not self._held(rollout_id):
                    replica = self._choose(rollout_id)
                    self.in_flight[replica] += 1
                    if rollout_id is not None:
                        self._started[rollout_id] = None
                        if len(self._started) > MAX_STICKY_ROLLOUTS:
                            self._started.popitem(last=False)
                    if adapter is None:
                        return Lease(self.upstreams[replica], self.version, replica)
                    return Lease(self.adapter_upstreams[replica][adapter], self.version, replica, adapter)
                future = asyncio.get_running_loop().create_future()
                self._waiting.append((asyncio.get_running_loop(), future))
            await future

    def release(self, lease: Lease) -> None:
        with self._lock:
            self.in_flight[lease.replica] -= 1
            if not any(self.in_flight):
                self._drained.notify_all()

    def _held(self, rollout_id: str | None) -> bool:
        """Whether this call is a rollout's first on the weights served now while `attempts_held` holds those."""
        return self._attempts_held and rollout_id is not None and rollout_id not in self._started

    def _choose(self, rollout_id: str | None) -> int:
        if rollout_id is not None and rollout_id in self._sticky:
            self._sticky.move_to_end(rollout_id)
            return self._sticky[rollout_id]
        counts = [0] * len(self.upstreams)
        for replica in self._sticky.values():
            counts[replica] += 1
        replica = min(range(len(self.upstreams)), key=lambda i: (self.in_flight[i], counts[i], i))
        if rollout_id is not None:
            self._sticky[rollout_id] = replica
            if len(self._sticky) > MAX_STICKY_ROLLOUTS:
                self._sticky.popitem(last=False)
        return replica

    # ------------------------------------------------------------------ trainer side (any other thread)

    @contextmanager
    def attempts_held(self) -> Iterator[list[str]]:
        """Hold every rollout's first call from now on; yield the rollouts that already called on the weights
        served now (their later calls still pass), for the caller to wait for their attempts to end."""
        with self._lock:
            self._attempts_held = True
            started = list(self._started)
        try:
            yield started
        finally:
            with self._lock:
                self._attempts_held = False
                self._wake_waiting()

    @contextmanager
    def exclusive(self, timeout_s: float = 600.0) -> Iterator[None]:
        """Hold new calls and wait for those in flight; set `self.version` inside, before it reopens."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._open.clear()
            while any(self.in_flight):
                if not self._drained.wait(max(deadline - time.monotonic(), 0)):
                    self._reopen()
                    raise TimeoutError(
                        f"{sum(self.in_flight)} call(s) to {self.name!r} still in flight after "
                        f"{timeout_s:g} s; the weights were not changed"
                    )
        try:
            yield
        finally:
            with self._lock:
                self._started.clear()  # new weights: no rollout has called on them yet
                self._reopen()

    def _reopen(self) -> None:
        self._open.set()
        self._wake_waiting()

    def _wake_waiting(self) -> None:
        waiting, self._waiting = self._waiting, []
        for loop, future in waiting:
            loop.call_soon_threadsafe(_wake, future)


def _per_adapter(name: str, backend: Backend, models: Mapping[str, str]) -> dict[str, Upstream]:
    """One upstream per adapter on one replica: the same server, each call renamed to its adapter's model name."""
    return {
        adapter: Upstream.of(f"{name}@{adapter}", replace(backend, model=model)) for adapter, model in models.items()
    }


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
