"""Group commit for span writes over HTTP: spans written while another span write is in flight go
out together in the next request, so N concurrent one-span writes cost one round trip and one
SQLite transaction, not N.

Why: a span write's cost over HTTP is nearly all per request (parsing, two socket writes, one
transaction commit writing its WAL pages), not per span: one span by itself costs about what ten
together do. A lone writer waits for nothing: its spans leave at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from agentgrad.store.errors import StoreError
from agentgrad.types import Span

MAX_BATCH_SPANS = 512
"""Most spans sent in one coalesced request (more wait for the next)."""

Send = Callable[[list[Span]], Awaitable[list[int]]]
"""Stores spans in one request; returns their sequence ids, in order."""


class SpanBatches:
    """Coalesces the `add_spans` calls of one event loop; each caller still gets its own answer or error."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._waiting: list[tuple[list[Span], asyncio.Future[list[Span]]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def add(self, spans: Sequence[Span]) -> list[Span]:
        future: asyncio.Future[list[Span]] = asyncio.get_running_loop().create_future()
        self._waiting.append((list(spans), future))
        if self._sender is None:
            self._sender = asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch: list[tuple[list[Span], asyncio.Future[list[Span]]]] = []
                size = 0
                while self._waiting and (not batch or size + len(self._waiting[0][0]) <= MAX_BATCH_SPANS):
                    entry = self._waiting.pop(0)
                    batch.append(entry)
                    size += len(entry[0])
                await self._flush(batch)
        finally:
            self._sender = None

    async def _flush(self, batch: list[tuple[list[Span], asyncio.Future[list[Span]]]]) -> None:
        try:
            ids = await self._send([span for spans, _ in batch for span in spans])
        except StoreError as exc:
            if len(batch) == 1:
                _fail(batch[0][1], exc)
            else:  # the store refused the batch and kept none of it: each call on its own, for its own answer
                for entry in batch:
                    await self._flush([entry])
            return
        except Exception as exc:
            for _, future in batch:
                _fail(future, exc)
            return
        except BaseException:
            for _, future in batch + self._waiting:
                future.cancel()
            raise
        start = 0
        for spans, future in batch:
            if not future.done():
                future.set_result([s.model_copy(update={"sequence_id": i}) for s, i in zip(spans, ids[start:])])
            start += len(spans)


def _fail(future: asyncio.Future[list[Span]], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
