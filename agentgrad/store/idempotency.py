"""Writes applied at most once per idempotency key: the client sends one key per call and the same key
on every retry of it; the store answers a key it has seen with the answer it gave the first time.

`Replays` keeps answers in memory (enough for a store that lives in memory); `SqliteStore.run_once`
commits each answer in the transaction of its change, so a retry after a crash gets it back too.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

Answer = tuple[int, bytes]
"""An HTTP status and its JSON body."""

REPLAY_ENTRIES = 4096
"""Answers kept in memory by `Replays`."""

REPLY_SECONDS = 3600.0
"""How long a durable answer is kept: far past any client's retry window (`client.RETRY_SECONDS`)."""


def finish_now(work: Awaitable[Answer]) -> Answer:
    """Run a coroutine that never waits to its end, here and now (so it fits in one transaction).

    Store calls on SQLite never wait: their statements run on the calling thread."""
    coroutine: Coroutine[Any, Any, Answer] = work  # type: ignore[assignment]
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("a store call waited inside its transaction; it cannot be made idempotent this way")


class Replays:
    """Answers of recent writes by idempotency key: a retried write gets the first answer back, and a
    retry that arrives while the first try runs waits for it."""

    def __init__(self, size: int = REPLAY_ENTRIES) -> None:
        self._size = size
        self._done: OrderedDict[str, Answer] = OrderedDict()
        self._running: dict[str, asyncio.Future[Answer]] = {}

    async def run(self, key: str, work: Callable[[], Awaitable[Answer]]) -> Answer:
        if key in self._done:
            return self._done[key]
        if key in self._running:  # the first try is still being answered
            return await asyncio.shield(self._running[key])
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            answer = await work()
            if answer[0] < 500:
                self._done[key] = answer
                if len(self._done) > self._size:
                    self._done.popitem(last=False)
            future.set_result(answer)
            return answer
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: nobody may be waiting
            raise
        finally:
            del self._running[key]
