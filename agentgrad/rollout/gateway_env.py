"""Routing by environment: agents that build `OpenAI()` (or `Anthropic()`) with no arguments call the attempt's gateway route.

`GatewayEnvHook` points `OPENAI_BASE_URL` / `OPENAI_API_KEY` (and `ANTHROPIC_BASE_URL` / `ANTHROPIC_API_KEY`) at the attempt's gateway route
while each attempt runs, for agents that build `OpenAI()` (or LangChain's `ChatOpenAI()`) with
no arguments, and for any program they start. Environment variables are per process: this is
for runner processes that run one attempt at a time; overlapping attempts fall back to
`instrument_openai()`. `openai_environment` sets them for a whole process (the trainer's
threads, where many rollouts share it): the gateway's root, with each call routed by the
headers `instrument_openai()` adds from the current context.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from agentgrad.rollout import instrument
from agentgrad.rollout.instrument import disable_agents_sdk_tracing, instrument_openai
from agentgrad.rollout.runner import Hook
from agentgrad.semconv import gateway_route

log = logging.getLogger(__name__)


OPENAI_ENV = ("OPENAI_BASE_URL", "OPENAI_API_KEY")
"""What a no-argument `OpenAI()` (and LangChain's `ChatOpenAI()`) reads."""
ANTHROPIC_ENV = ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY")
"""What a no-argument `Anthropic()` reads: the base URL without `/v1` (the SDK adds `/v1/messages`)."""


def _set(base_url: str, api_key: str) -> None:
    """Point both SDKs' environment at `base_url` (`…/v1`)."""
    os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = base_url, api_key
    root = base_url.rstrip("/")
    os.environ["ANTHROPIC_BASE_URL"] = root[: -len("/v1")] if root.endswith("/v1") else root
    os.environ["ANTHROPIC_API_KEY"] = api_key


@contextmanager
def openai_environment(gateway_url: str, api_key: str = "agentgrad") -> Iterator[None]:
    """While inside, this process's (and its new subprocesses') no-argument `OpenAI()` calls the gateway at
    `gateway_url` (`…/v1`), and every `openai` call made inside a rollout names its attempt in headers."""
    saved = {name: os.environ.get(name) for name in (*OPENAI_ENV, *ANTHROPIC_ENV)}
    if saved["OPENAI_BASE_URL"] not in (None, gateway_url):
        log.info(
            "OPENAI_BASE_URL is %s; the trainer points it at its gateway %s while it runs",
            saved["OPENAI_BASE_URL"],
            gateway_url,
        )
    _set(gateway_url, api_key)
    was_instrumented = instrument._original_build_headers is not None
    instrument_openai()
    try:
        yield
    finally:
        if not was_instrumented:
            instrument.uninstrument_openai()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class GatewayEnvHook(Hook):
    """Sets `OPENAI_BASE_URL` to `{gateway}/rollouts/{rollout}/attempts/{attempt}/v1` and
    `OPENAI_API_KEY` to `api_key` while each attempt runs, and restores them after.

    `gateway_url` is the gateway's base URL as agents would use it (`http://127.0.0.1:8090/v1`,
    or with the prefix it is mounted under). When attempts overlap in one process (a runner
    with `concurrency > 1`, or several runners in threads) one variable cannot name them all:
    it then holds the un-routed gateway URL and `instrument_openai()` routes each call by its
    context instead.
    """

    _active: ClassVar[dict[str, str]] = {}  # attempt id -> route, for every attempt running in this process
    _saved: ClassVar[dict[str, str | None]] = {}
    _class_lock = threading.Lock()

    def __init__(self, gateway_url: str, api_key: str = "agentgrad") -> None:
        base = gateway_url.rstrip("/")
        self.root = base[: -len("/v1")] if base.endswith("/v1") else base
        self.api_key = api_key
        disable_agents_sdk_tracing()  # routed here, the Agents SDK would upload its traces with the gateway's key

    def route(self, rollout_id: str, attempt_id: str) -> str:
        return gateway_route(self.root, rollout_id, attempt_id)

    def on_trace_start(self, *, agent: Any, runner: Any, rollout: Any) -> None:
        cls = GatewayEnvHook
        with cls._class_lock:
            if not cls._active:
                cls._saved = {name: os.environ.get(name) for name in (*OPENAI_ENV, *ANTHROPIC_ENV)}
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
            _set(next(iter(active.values())), self.api_key)
        else:
            if os.environ.get("OPENAI_BASE_URL") != f"{self.root}/v1":
                log.info("%d attempts share this process: routing their openai calls by context", len(active))
            _set(f"{self.root}/v1", self.api_key)
            instrument_openai()
