"""Naming the agents of a multi-agent system, so one of them can be trained alone.

    with ag.agent("sql_writer"):          # every model call made in here is the writer's
        client.chat.completions.create(...)

    @ag.agent("critic")                    # or around a function, sync or async
    def critique(...): ...

The name lives in a context variable, so async tasks and threads started with the context
(`asyncio.to_thread`, `contextvars.copy_context().run`) keep it, and nested names win. It
reaches the gateway as the `x-agentgrad-agent` header (`instrument_openai()` adds it) or as
the per-agent route `…/agents/{name}/v1` (`LLM.for_agent(name)`, for clients built by hand and
agents in other processes); the gateway records it on the call's span as
`agentgrad.agent.name`, and `agent_match` selects by it.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentgrad_agent", default=None)


def current_agent() -> str | None:
    """The name of the agent running in this context, if any."""
    return _current.get()


class agent:
    """Names the agent whose model calls run inside it: a context manager and a decorator."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name.strip() or "/" in name:
            raise ValueError(f"an agent name is a non-empty string without '/', not {name!r}")
        self.name = name
        self._tokens: list[contextvars.Token[str | None]] = []

    def __enter__(self) -> agent:
        self._tokens.append(_current.set(self.name))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        _current.reset(self._tokens.pop())

    def __call__(self, function: F) -> F:
        name = self.name
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with agent(name):
                    return await function(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            with agent(name):
                return function(*args, **kwargs)

        return run  # type: ignore[return-value]
