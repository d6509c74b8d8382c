"""Tracing: in-process OpenTelemetry spans land in the store under the current rollout and attempt.

The runner binds `(rollout_id, attempt_id, sink)` in a context variable around each attempt.
Context variables follow asyncio tasks and `asyncio.to_thread`, so concurrent rollouts in one
process never mix their spans. A `SpanSink` batches spans and writes them from the runner's
event loop, whichever thread produced them.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentgrad.rollout.naming import current_agent
from agentgrad.semconv import AGENT_NAME, EXECUTE_TOOL, FRAMEWORK_OPERATION, GEN_AI_OPERATION, is_llm_call
from agentgrad.store.sink import SpanSink
from agentgrad.types import Span, SpanEvent, SpanStatus

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.trace import Tracer


log = logging.getLogger(__name__)


@dataclass
class AttemptContext:
    rollout_id: str
    attempt_id: str
    sink: SpanSink
    traces_tool_runs: bool = False
    """Set once a tool-run span of this attempt ended in this process, or a framework whose spans come later said a
    run began (CrewAI): its calls then tell the gateway not to read tool runs from the conversation
    (`semconv.TOOL_RUNS_TRACED_HEADER`)."""


_current: contextvars.ContextVar[AttemptContext | None] = contextvars.ContextVar("agentgrad_attempt", default=None)


def current_attempt() -> AttemptContext | None:
    """The attempt whose spans this code writes, or None outside any rollout."""
    return _current.get()


@contextmanager
def bind_attempt(rollout_id: str, attempt_id: str, sink: SpanSink) -> Iterator[AttemptContext]:
    """Route every span started inside the block to this attempt."""
    context = AttemptContext(rollout_id, attempt_id, sink)
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


# ----------------------------------------------------------------------------- OpenTelemetry


def to_span(readable: ReadableSpan, rollout_id: str | None, attempt_id: str | None) -> Span:
    """An OpenTelemetry span in our data model."""
    context = readable.context
    parent = readable.parent
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        trace_id=format(context.trace_id, "032x") if context else "",
        span_id=format(context.span_id, "016x") if context else "",
        parent_id=format(parent.span_id, "016x") if parent else None,
        name=readable.name,
        start_time=(readable.start_time or 0) / 1e9,
        end_time=(readable.end_time or 0) / 1e9 if readable.end_time else None,
        attributes=_plain(dict(readable.attributes or {})),
        events=[
            SpanEvent(name=event.name, time=event.timestamp / 1e9, attributes=_plain(dict(event.attributes or {})))
            for event in readable.events
        ],
        status=SpanStatus(code=readable.status.status_code.name, description=readable.status.description),
    )


def _as_framework_step(readable: ReadableSpan, span: Span) -> Span:
    """A framework's own span of a model call (its instrumentation, not agentgrad's) kept as a step of the tree,
    its operation moved to `FRAMEWORK_OPERATION`: read as a model call, it would be a second copy of the gateway's
    span without token ids."""
    scope = readable.instrumentation_scope
    if (scope is None or scope.name != TRACER_NAME) and is_llm_call(span):
        attributes = dict(span.attributes)
        attributes[FRAMEWORK_OPERATION] = attributes.pop(GEN_AI_OPERATION)
        return span.model_copy(update={"attributes": attributes})
    return span


def _plain(attributes: dict[str, Any]) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in attributes.items()}


tool_run_listeners: list[Callable[[], None]] = []
"""Called when an attempt's first tool-run span ends (`frameworks.instrument_frameworks` adds `instrument_openai`, so
that the attempt's next calls say it even where the attempt is routed by its URL alone)."""


class _StoreSpanProcessor:
    """Sends every ended span that started inside a bound attempt to that attempt's sink."""

    def __init__(self) -> None:
        self._started: dict[int, AttemptContext] = {}
        self._lock = threading.Lock()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        context = _current.get()
        if context is not None:
            agent = current_agent()
            if agent is not None and AGENT_NAME not in (span.attributes or {}):
                span.set_attribute(AGENT_NAME, agent)  # rewards and messages emitted under ag.agent(...) name it too
            with self._lock:
                self._started[span.context.span_id] = context

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            context = self._started.pop(span.context.span_id, None) if span.context else None
        if context is not None:
            if not context.traces_tool_runs and (span.attributes or {}).get(GEN_AI_OPERATION) == EXECUTE_TOOL:
                context.traces_tool_runs = True
                for listener in tool_run_listeners:
                    listener()
            context.sink.put(_as_framework_step(span, to_span(span, context.rollout_id, context.attempt_id)))

    def _on_ending(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


_provider: TracerProvider | None = None
_processor = _StoreSpanProcessor()
_provider_lock = threading.Lock()


def tracer_provider() -> TracerProvider:
    """agentgrad's own provider (created on first use; the global one is left alone)."""
    global _provider
    with _provider_lock:
        if _provider is None:
            from opentelemetry.sdk.trace import TracerProvider

            _provider = TracerProvider()
            _provider.add_span_processor(_processor)  # type: ignore[arg-type]
        return _provider


TRACER_NAME = "agentgrad"
"""The instrumentation scope of agentgrad's own spans (every other scope is a framework's or the user's)."""


def get_tracer() -> Tracer:
    return tracer_provider().get_tracer(TRACER_NAME)
