"""`SpanSink`: spans put from any thread, written to a store in batches from one event loop.

The runner's tracer and the gateway's recorder both write through it, so a slow store never
blocks the agent or the relay, and a failed write is logged rather than raised.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from agentgrad.store.base import Store
from agentgrad.types import Span

log = logging.getLogger(__name__)


class SpanSink:
    """Buffers spans from any thread and writes them to the store in batches from one event loop."""

    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.store = store
        self._loop = loop or asyncio.get_running_loop()
        self._pending: list[Span] = []
        self._lock = threading.Lock()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    def put(self, span: Span) -> None:
        """Queue a span for writing; safe from any thread."""
        with self._lock:
            self._pending.append(span)
        try:
            self._loop.call_soon_threadsafe(self._signal)
        except RuntimeError:  # loop closed: the runner is gone, the span has nowhere to go
            log.warning("span %r dropped: its runner's event loop is closed", span.name)

    def _signal(self) -> None:
        self._idle.clear()
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._drain())

    async def _drain(self) -> None:
        while True:
            with self._lock:
                batch, self._pending = self._pending, []
            if not batch:
                self._idle.set()
                return
            await self.write(batch)

    async def write(self, batch: list[Span]) -> None:
        """Store one batch; a failure is logged, never raised (a bad span must not take the writer down)."""
        try:
            await self.store.add_spans(batch)
        except Exception:
            log.exception("could not write %d span(s) to the store", len(batch))

    async def flush(self) -> None:
        """Return once every span put so far is written (or its failure logged)."""
        await asyncio.sleep(0)  # let call_soon_threadsafe callbacks from other threads run
        with self._lock:
            if self._pending and (self._task is None or self._task.done()):
                self._signal()
        await self._idle.wait()
