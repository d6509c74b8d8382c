"""What agent frameworks report about their own steps, routed into the current attempt: every tool run its own span.

`instrument_frameworks()` (the runner calls it before each attempt; idempotent and cheap) turns on, for each
framework already imported in the process, what that framework emits, and sends it to the attempt that
is running, with no change to the agent:

- OpenTelemetry: spans started through the global API inside an attempt reach the store (agentgrad's provider
  becomes the global one, or joins the one the process set). That is how Microsoft Agent Framework (its tool
  arguments and results switched on), AgentScope (its `TracingMiddleware` added to each agent), AutoGen (its
  agent spans) and the user's own OpenTelemetry spans arrive;
- LangChain and LangGraph: a callback handler every run gets (`on_tool_start` / `on_tool_end` / `on_tool_error`);
- the OpenAI Agents SDK: a trace processor that replaces the SDK's upload to OpenAI, so its tracing is on and stays
  local (function spans become tool spans, agent spans agent steps);
- CrewAI: its event bus (`ToolUsageFinishedEvent`, `ToolUsageErrorEvent`), whose handlers run later in its thread
  pool: the runner waits for them before it closes the attempt (`framework_reports`);
- AutoGen: each tool's `run_json` wrapped, since its own tool span carries no arguments or result.

Each tool run becomes a span in the OpenTelemetry GenAI shape: named `execute_tool <tool>`, with
`gen_ai.tool.name`, `gen_ai.tool.call.id`, `gen_ai.tool.call.arguments`, `gen_ai.tool.call.result`, its duration,
and an error status with `error.type` when it failed. A framework's own span of a model call stays in the tree as a
step, but is not read as a model call (`tracer._as_framework_step`): the gateway's span has the token ids.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from agentgrad import semconv as sc
from agentgrad.rollout import instrument
from agentgrad.rollout.emit import emit_span, to_json
from agentgrad.rollout.tracer import _processor, current_attempt, get_tracer, tool_run_listeners, tracer_provider

log = logging.getLogger(__name__)
_lock = threading.Lock()
_done: set[str] = set()
_late_reporters: list[Callable[[float], object]] = []
"""For each framework that reports its steps from threads of its own, later: a call that waits up to that many
seconds for what it has yet to report."""
REPORT_WAIT_S = 10.0


def emit_tool_call(
    name: str,
    arguments: Any = None,
    result: Any = None,
    *,
    call_id: str | None = None,
    error: BaseException | str | None = None,
    start_time: float | None = None,
    end_time: float | None = None,
) -> None:
    """Record one finished tool run in the current attempt (nothing outside one)."""
    if current_attempt() is None:
        return
    attributes = sc.tool_attributes(name, arguments, result, call_id)
    message = None
    if error is not None:
        attributes[sc.ERROR_TYPE] = type(error).__qualname__ if isinstance(error, BaseException) else "ToolError"
        message = str(error)
    emit_span(f"{sc.EXECUTE_TOOL} {name}", attributes, start_time=start_time, end_time=end_time, error=message)


@contextmanager
def tool_span(name: str, arguments: Any = None, call_id: str | None = None) -> Iterator[Callable[[Any], None]]:
    """A span around a tool run; yields a function that records its result. An exception marks it failed."""
    from opentelemetry.trace import Status, StatusCode

    with get_tracer().start_as_current_span(
        f"{sc.EXECUTE_TOOL} {name}",
        attributes=sc.tool_attributes(name, arguments, None, call_id),
        record_exception=False,
    ) as span:

        def set_result(result: Any) -> None:
            span.set_attribute(sc.GEN_AI_TOOL_CALL_RESULT, result if isinstance(result, str) else to_json(result))

        try:
            yield set_result
        except BaseException as exc:
            span.set_attribute(sc.ERROR_TYPE, type(exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__qualname__}: {exc}"))
            raise


# ----------------------------------------------------------------------------- OpenTelemetry


def route_opentelemetry() -> None:
    """Spans of the global OpenTelemetry API started inside an attempt go to the store: agentgrad's provider becomes
    the global one, or, where the process set an SDK provider of its own, agentgrad's processor joins it."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    ours = tracer_provider()
    current = trace.get_tracer_provider()
    if current is ours:
        return
    if isinstance(current, TracerProvider):
        current.add_span_processor(_processor)  # type: ignore[arg-type]
    else:
        trace.set_tracer_provider(ours)


def _agent_framework() -> None:
    """Microsoft Agent Framework: its spans are on by default; its tool arguments and results are "sensitive"."""
    from agent_framework.observability import enable_instrumentation

    enable_instrumentation(enable_sensitive_data=True)


def _agentscope() -> None:
    """AgentScope: every `Agent` gets its `TracingMiddleware` (agent, model-call and tool spans) unless it has one."""
    from agentscope.agent import Agent
    from agentscope.middleware import TracingMiddleware

    original: Any = Agent.__init__

    def __init__(self: Any, *args: Any, middlewares: list[Any] | None = None, **kwargs: Any) -> None:
        middlewares = list(middlewares or [])
        if not any(isinstance(m, TracingMiddleware) for m in middlewares):
            middlewares.append(TracingMiddleware())
        original(self, *args, middlewares=middlewares, **kwargs)

    Agent.__init__ = __init__  # type: ignore[method-assign]


def _autogen() -> None:
    """AutoGen: each tool's `run_json` inside a tool span with its arguments and result, in place of AutoGen's own
    (which has neither)."""
    from autogen_core.tools import BaseTool, _base

    own_span = _base.trace_tool_span

    @contextmanager
    def trace_tool_span(*args: Any, **kwargs: Any) -> Iterator[Any]:
        if current_attempt() is not None:  # the wrapper below records this run
            from opentelemetry.trace import INVALID_SPAN

            yield INVALID_SPAN
            return
        with own_span(*args, **kwargs) as span:
            yield span

    _base.trace_tool_span = trace_tool_span
    original = BaseTool.run_json

    async def run_json(self: Any, args: Mapping[str, Any], cancellation_token: Any, call_id: str | None = None) -> Any:
        if current_attempt() is None:
            return await original(self, args, cancellation_token, call_id)
        with tool_span(self.name, dict(args), call_id) as set_result:
            result = await original(self, args, cancellation_token, call_id)
            set_result(self.return_value_as_string(result))
            return result

    BaseTool.run_json = run_json


# ----------------------------------------------------------------------------- callbacks and events


def _langchain() -> None:
    """LangChain (and LangGraph, which runs LangChain tools): a handler every callback manager adds."""
    import contextvars

    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.tracers.context import register_configure_hook

    class ToolSpans(BaseCallbackHandler):
        """Each tool run, from its start and end callbacks, as a span of the attempt."""

        def __init__(self) -> None:
            self.started: dict[Any, tuple[float, str, Any]] = {}

        def on_tool_start(
            self, serialized: dict[str, Any], input_str: str, *, run_id: Any, inputs: Any = None, **kwargs: Any
        ) -> None:
            if current_attempt() is not None:
                name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
                self.started[run_id] = (time.time(), name, inputs if inputs is not None else input_str)

        def on_tool_end(self, output: Any, *, run_id: Any, **kwargs: Any) -> None:
            if run_id in self.started:
                began, name, arguments = self.started.pop(run_id)
                call_id = getattr(output, "tool_call_id", None)
                result = getattr(output, "content", output)
                emit_tool_call(name, arguments, result, call_id=call_id, start_time=began, end_time=time.time())

        def on_tool_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
            if run_id in self.started:
                began, name, arguments = self.started.pop(run_id)
                emit_tool_call(name, arguments, error=error, start_time=began, end_time=time.time())

    # one handler for every context: it keeps runs by id, and each span goes to the attempt of the context it ends in
    handler: contextvars.ContextVar[Any] = contextvars.ContextVar("agentgrad_tool_spans", default=ToolSpans())  # noqa: B039
    register_configure_hook(handler, inheritable=True)


def _epoch(moment: Any) -> float | None:
    """A framework's timestamp (ISO text or datetime) as seconds since the epoch."""
    if isinstance(moment, datetime):
        return moment.timestamp()
    if isinstance(moment, str):
        return datetime.fromisoformat(moment).timestamp()
    return None


def _agents_sdk() -> None:
    """The OpenAI Agents SDK: a trace processor instead of the SDK's exporter, and its tracing on."""
    import agents
    from agents.tracing import AgentSpanData, FunctionSpanData, TracingProcessor

    class LocalSpans(TracingProcessor):
        """Function spans as tool spans, agent spans as agent steps, in the attempt they ran in."""

        def on_trace_start(self, trace: Any) -> None:
            pass

        def on_trace_end(self, trace: Any) -> None:
            pass

        def on_span_start(self, span: Any) -> None:
            pass

        def on_span_end(self, span: Any) -> None:
            data = span.span_data
            error = span.error.get("message") if span.error else None
            began, ended = _epoch(span.started_at), _epoch(span.ended_at)
            if isinstance(data, FunctionSpanData):
                emit_tool_call(data.name, data.input, data.output, error=error, start_time=began, end_time=ended)
            elif isinstance(data, AgentSpanData) and current_attempt() is not None:
                emit_span(
                    f"{sc.INVOKE_AGENT} {data.name}",
                    {sc.GEN_AI_OPERATION: sc.INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: data.name},
                    start_time=began,
                    end_time=ended,
                    error=error,
                )

        def shutdown(self) -> None:
            pass

        def force_flush(self) -> None:
            pass

    agents.set_trace_processors([LocalSpans()])  # the SDK's exporter to OpenAI goes: nothing leaves the process
    instrument.agents_sdk_traces_stay_local = True
    agents.set_tracing_disabled(False)


def _crewai() -> None:
    """CrewAI: its event bus's tool events (its sync handlers run with the emitter's context: the attempt's).
    The bus runs them later, in its thread pool, maybe after the model call that carries the tool's result, so the
    attempt's calls cannot wait for a tool span to say that its tool runs are traced here: a hook that CrewAI calls
    before each model call, in the caller's thread, marks the attempt (whichever path ran its tools), and the
    `openai` clients send the mark from the first call on; else the gateway would also record each run from the
    conversation (`gateway/tool_runs.py`)."""
    from crewai.events import crewai_event_bus
    from crewai.events.types.tool_usage_events import ToolUsageErrorEvent, ToolUsageFinishedEvent
    from crewai.hooks import register_before_llm_call_hook

    def traced_here(context: Any) -> None:
        attempt = current_attempt()
        if attempt is not None:
            attempt.traces_tool_runs = True

    register_before_llm_call_hook(traced_here)
    instrument.instrument_openai()
    _late_reporters.append(crewai_event_bus.flush)

    @crewai_event_bus.on(ToolUsageFinishedEvent)
    def finished(source: Any, event: ToolUsageFinishedEvent) -> None:
        failure = getattr(event, "failure", None)
        emit_tool_call(
            event.tool_name,
            event.tool_args,
            event.output,
            error=str(failure) if failure else None,
            start_time=_epoch(event.started_at),
            end_time=_epoch(event.finished_at),
        )

    @crewai_event_bus.on(ToolUsageErrorEvent)
    def failed(source: Any, event: ToolUsageErrorEvent) -> None:
        emit_tool_call(event.tool_name, event.tool_args, error=str(event.error))


FRAMEWORKS: dict[str, Callable[[], None]] = {
    "agent_framework": _agent_framework,
    "agentscope": _agentscope,
    "autogen_core": _autogen,
    "langchain_core": _langchain,
    "agents": _agents_sdk,
    "crewai": _crewai,
}
"""Module whose presence in `sys.modules` says the framework is in use -> what turns its reports on."""


async def framework_reports(timeout_s: float = REPORT_WAIT_S) -> None:
    """Wait for the steps the frameworks in use have yet to report (CrewAI's events run in its thread pool), so an
    attempt's spans are all written before it closes; nothing to wait for in a process without such a framework."""
    for wait in list(_late_reporters):
        await asyncio.to_thread(wait, timeout_s)


def instrument_frameworks() -> None:
    """Route the OpenTelemetry API, and each framework imported so far, into the current attempt (idempotent:
    a framework is set up once, the first time it is found imported)."""
    with _lock:
        if "opentelemetry" not in _done:
            route_opentelemetry()
            tool_run_listeners.append(instrument.instrument_openai)  # tells the gateway (gateway/tool_runs.py)
            _done.add("opentelemetry")
        for module, turn_on in FRAMEWORKS.items():
            if module in _done or module not in sys.modules:
                continue
            _done.add(module)
            try:
                turn_on()
            except Exception as exc:  # a framework version whose hooks moved: its tool runs go untraced, nothing more
                log.warning(
                    "could not trace %s's own steps (%s: %s); its model calls are still recorded",
                    module,
                    type(exc).__name__,
                    exc,
                )
