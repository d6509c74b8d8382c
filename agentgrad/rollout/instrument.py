"""Instrumenting the `openai` client: each request names the attempt and the agent of its context.

`instrument_openai()` makes every `openai` client in this process add the rollout, attempt
and agent headers of the current context (`bind_attempt`, `ag.agent`), so async tasks and
threads that share a process, or even one client, route their calls correctly. For agents
that build `OpenAI()` with no arguments, `agentgrad.gateway.GatewayEnvHook` sets the
environment instead (and calls this when attempts overlap in one process).
"""

from __future__ import annotations

import threading
from typing import Any

from agentgrad.rollout.naming import current_agent
from agentgrad.rollout.tracer import current_attempt
from agentgrad.semconv import AGENT_HEADER, ATTEMPT_HEADER, ROLLOUT_HEADER

_original_build_headers: Any = None
_lock = threading.Lock()


def instrument_openai() -> None:
    """Make every `openai` client (sync or async, any endpoint) route calls by the current attempt.

    Adds `x-agentgrad-rollout-id` / `x-agentgrad-attempt-id` (and a W3C `traceparent`, so the
    gateway's span nests under the agent's current span) to each request made inside a rollout,
    and `x-agentgrad-agent` inside `with ag.agent(name)`; headers the caller set itself are left
    alone. Idempotent. Threads an agent starts by hand inherit no context: run them with
    `contextvars.copy_context().run` (or use `asyncio.to_thread`).
    """
    global _original_build_headers
    from openai._base_client import BaseClient

    with _lock:
        if _original_build_headers is not None:
            return
        original = BaseClient._build_headers

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
            agent = current_agent()
            if agent is not None and AGENT_HEADER not in headers:
                headers[AGENT_HEADER] = agent
            return headers

        BaseClient._build_headers = _build_headers  # type: ignore[method-assign]
        _original_build_headers = original


def uninstrument_openai() -> None:
    """Undo `instrument_openai`."""
    global _original_build_headers
    from openai._base_client import BaseClient

    with _lock:
        if _original_build_headers is not None:
            BaseClient._build_headers = _original_build_headers  # type: ignore[method-assign]
            _original_build_headers = None


def _traceparent() -> str | None:
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
