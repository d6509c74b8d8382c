"""Instrumenting the `openai` client: each request names the attempt and the agent of its context.

`instrument_openai()` makes every `openai` client in this process (and every `anthropic` one, where that SDK is
installed: it is built the same way) add the rollout, attempt and agent headers of the current context (`bind_attempt`, `ag.agent`), so async tasks and
threads that share a process, or even one client, route their calls correctly. For agents
that build `OpenAI()` with no arguments, `agentgrad.gateway.GatewayEnvHook` sets the
environment instead (and calls this when attempts overlap in one process).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from agentgrad.rollout.naming import current_agent
from agentgrad.rollout.tracer import current_attempt
from agentgrad.semconv import AGENT_HEADER, ATTEMPT_HEADER, ROLLOUT_HEADER, TOOL_RUNS_TRACED_HEADER

_original_build_headers: Any = None
_original_anthropic_headers: Any = None
_lock = threading.Lock()

AGENTS_TRACING_ENV = "OPENAI_AGENTS_DISABLE_TRACING"
"""The OpenAI Agents SDK's switch for its trace upload to the hosted tracing endpoint (read on first use)."""
agents_sdk_traces_stay_local = False
"""True once `frameworks.instrument_frameworks` replaced the SDK's exporter with a local processor: its tracing is then
on and uploads nothing, so `disable_agents_sdk_tracing` leaves it on."""


def disable_agents_sdk_tracing() -> None:
    """Keep the OpenAI Agents SDK from uploading its traces to OpenAI's hosted endpoint: routed to the gateway, it
    would send them with the gateway's key (and fail, or leak the run). The environment variable covers an SDK
    imported later in this process and its subprocesses; an SDK already imported is switched off directly. A
    value the user set is left alone, and so is an SDK whose traces agentgrad keeps local (`agents_sdk_traces_stay_local`)."""
    if agents_sdk_traces_stay_local:
        return
    os.environ.setdefault(AGENTS_TRACING_ENV, "1")
    agents = sys.modules.get("agents")
    switch = getattr(agents, "set_tracing_disabled", None)
    if callable(switch) and os.environ[AGENTS_TRACING_ENV].lower() in ("1", "true"):
        switch(True)


def instrument_openai() -> None:
    """Make every `openai` client (sync or async, any endpoint) route calls by the current attempt.

    Adds `x-agentgrad-rollout-id` / `x-agentgrad-attempt-id` (and a W3C `traceparent`, so the
    gateway's span nests under the agent's current span) to each request made inside a rollout,
    and `x-agentgrad-agent` inside `with ag.agent(name)`, and `x-agentgrad-tool-runs-traced` once the attempt
    recorded a tool run itself (the gateway then reads none from its conversation); headers the caller set itself
    are left alone. Idempotent. Threads an agent starts by hand inherit no context: run them with
    `contextvars.copy_context().run` (or use `asyncio.to_thread`). It also turns off the OpenAI Agents
    SDK's trace upload (`disable_agents_sdk_tracing`).
    """
    global _original_build_headers, _original_anthropic_headers
    from openai._base_client import BaseClient

    disable_agents_sdk_tracing()

    with _lock:
        if _original_build_headers is None:
            _original_build_headers = BaseClient._build_headers
            BaseClient._build_headers = _routed(_original_build_headers)  # type: ignore[method-assign]
        try:
            from anthropic._base_client import BaseClient as AnthropicClient
        except ImportError:  # the anthropic SDK is optional
            return
        if _original_anthropic_headers is None:
            _original_anthropic_headers = AnthropicClient._build_headers
            AnthropicClient._build_headers = _routed(_original_anthropic_headers)  # type: ignore[method-assign]


def _routed(original: Any) -> Any:
    """`_build_headers` adding the context's attempt, traceparent and agent (both SDKs share this method)."""

    def _build_headers(self: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        headers = original(self, options, *args, **kwargs)
        attempt = current_attempt()
        if attempt is not None and ROLLOUT_HEADER not in headers:
            headers[ROLLOUT_HEADER] = attempt.rollout_id
            headers[ATTEMPT_HEADER] = attempt.attempt_id
            if "traceparent" not in headers:
                traceparent = _traceparent()
                if traceparent:
                    headers["traceparent"] = traceparent
            if attempt.traces_tool_runs:
                headers[TOOL_RUNS_TRACED_HEADER] = "1"
        agent = current_agent()
        if agent is not None and AGENT_HEADER not in headers:
            headers[AGENT_HEADER] = agent
        return headers

    return _build_headers


def uninstrument_openai() -> None:
    """Undo `instrument_openai`."""
    global _original_build_headers, _original_anthropic_headers
    from openai._base_client import BaseClient

    with _lock:
        if _original_build_headers is not None:
            BaseClient._build_headers = _original_build_headers  # type: ignore[method-assign]
            _original_build_headers = None
        if _original_anthropic_headers is not None:
            from anthropic._base_client import BaseClient as AnthropicClient

            AnthropicClient._build_headers = _original_anthropic_headers  # type: ignore[method-assign]
            _original_anthropic_headers = None


def _traceparent() -> str | None:
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
