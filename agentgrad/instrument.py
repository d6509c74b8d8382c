"""Zero-change routing: unmodified agent code sends its model calls to the right attempt's gateway route.

Two ways, for two kinds of agent:
- `GatewayEnvHook`: a runner hook that points `OPENAI_BASE_URL` / `OPENAI_API_KEY` at the
  attempt's gateway route, for agents that build `OpenAI()` (or LangChain's `ChatOpenAI()`)
  with no arguments, and for any program they start. Environment variables are per process:
  this is for runner processes that run one attempt at a time.
- `instrument_openai()`: every `openai` client in this process adds the rollout and attempt
  headers of the attempt running in the current context, so async tasks and threads that
  share a process, or even one client, still route correctly.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from agentgrad.gateway import ATTEMPT_HEADER, ROLLOUT_HEADER
from agentgrad.runner import Hook
from agentgrad.tracer import current_attempt

log = logging.getLogger(__name__)

_original_build_headers: Any = None
_lock = threading.Lock()


def instrument_openai() -> None:
    """Make every `openai` client (sync or async, any endpoint) route calls by the current attempt.

    Adds `x-agentgrad-rollout-id` / `x-agentgrad-attempt-id` (and a W3C `traceparent`, so the
    gateway's span nests under the agent's current span) to each request made inside a rollout;
    headers the caller set itself are left alone. Idempotent. Threads an agent starts by hand
    inherit no context: run them with `contextvars.copy_context().run` (or use `asyncio.to_thread`).
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


class GatewayEnvHook(Hook):
    """Sets `OPENAI_BASE_URL` to `{gateway}/rollouts/{rollout}/attempts/{attempt}/v1` and
    `OPENAI_API_KEY` to `api_key` while each attempt runs, and restores them after.

    `gateway_url` is the gateway's base URL as agents would use it (`http://127.0.0.1:8090/v1`,
    or with the prefix it is mounted under). When attempts overlap in one process (a runner
    with `concurrency > 1`, or several runners in threads) one variable cannot name them all:
    it then holds the un-routed gateway URL and `instrument_openai()` routes each call by its
    context instead.
    """

    _active: dict[str, str] = {}  # attempt id -> route, for every attempt running in this process
    _saved: dict[str, str | None] = {}
    _class_lock = threading.Lock()

    def __init__(self, gateway_url: str, api_key: str = "agentgrad") -> None:
        base = gateway_url.rstrip("/")
        self.root = base[: -len("/v1")] if base.endswith("/v1") else base
        self.api_key = api_key

    def route(self, rollout_id: str, attempt_id: str) -> str:
        return f"{self.root}/rollouts/{rollout_id}/attempts/{attempt_id}/v1"

    def on_trace_start(self, *, agent: Any, runner: Any, rollout: Any) -> None:
        cls = GatewayEnvHook
        with cls._class_lock:
            if not cls._active:
                cls._saved = {name: os.environ.get(name) for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
            cls._active[rollout.attempt.attempt_id] = self.route(rollout.rollout_id, rollout.attempt.attempt_id)
            self._apply()

    async def on_trace_end(self, *, agent: Any, runner: Any, rollout: Any) -> None:
        cls = GatewayEnvHook
        with cls._class_lock:
            cls._active.pop(rollout.attempt.attempt_id, None)
            if cls._active:
                self._apply()
            else:
                for name, value in cls._saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
        # the gateway writes spans in the background: have this attempt's in before the runner closes it
        await runner.flush_gateways([self.route(rollout.rollout_id, rollout.attempt.attempt_id)])

    def _apply(self) -> None:
        active = GatewayEnvHook._active
        if len(active) == 1:
            os.environ["OPENAI_BASE_URL"] = next(iter(active.values()))
        else:
            if os.environ.get("OPENAI_BASE_URL") != f"{self.root}/v1":
                log.info("%d attempts share this process: routing their openai calls by context", len(active))
            os.environ["OPENAI_BASE_URL"] = f"{self.root}/v1"
            instrument_openai()
        os.environ["OPENAI_API_KEY"] = self.api_key
