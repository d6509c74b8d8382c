"""The runner: a worker that takes rollouts from the store and runs the agent on them.

For each rollout: open the attempt (done by `dequeue`), bind the tracing context, hand the agent
its task and resources, record its reward or its exception, and close the attempt. Heartbeats
go out while it works, so the store can tell a busy worker from a dead one.

An agent cannot take its runner down: whatever it raises (`KeyboardInterrupt` and `SystemExit`
included) fails only its attempt, with the exception recorded. A Ctrl+C to the runner's process
still stops the runner: its handler marks the interrupt before Python raises it, so the runner
tells the signal from an agent's own `raise KeyboardInterrupt`. What no `except` can catch (an
agent calling `os._exit`, a segfault) needs `isolation="process"` (`agentgrad.rollout.isolation`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal

# Imported here, not lazily in a worker: the openai client checks sys.modules for httpx from agent
# threads, and a first import of httpx under way in another thread makes those calls fail.
import httpx

from agentgrad.rollout.agent import LitAgent, Reward, agent_threads, as_agent
from agentgrad.rollout.emit import emit_exception, record_returned_reward
from agentgrad.rollout.frameworks import framework_reports, instrument_frameworks
from agentgrad.rollout.isolation import ISOLATIONS, AttemptProcesses, describe
from agentgrad.rollout.tracer import bind_attempt, get_tracer
from agentgrad.semconv import AGENT_NAME, ATTEMPT_ID, FLUSH_ENDPOINT, NO_REWARD, ROLLOUT_ID, ROLLOUT_SPAN
from agentgrad.store import NotFoundError, Store, StoreError
from agentgrad.store.sink import SpanSink
from agentgrad.types import (
    LLM,
    AttemptedRollout,
    AttemptStatus,
    NamedResources,
    Rollout,
    WorkerStatus,
)

log = logging.getLogger(__name__)

POLL_SECONDS = 0.02
"""First pause after finding the queue empty; doubles up to `MAX_POLL_SECONDS`."""
MAX_POLL_SECONDS = 0.2
HEARTBEAT_SECONDS = 2.0
GATEWAY_FLUSH_SECONDS = 10.0
NO_REWARD_ERROR = (
    "the agent reported no reward: it returned None and never called ag.emit_reward(value). Return the reward "
    "(a float) from the agent, or call emit_reward before it returns; to count such a rollout as reward 0 instead, "
    "run it with RolloutConfig(missing_reward='zero') (GRPO(missing_reward='zero'))"
)


class Hook:
    """Override any of these (sync or async) to act around each rollout a runner executes."""

    def on_rollout_start(self, *, agent: LitAgent, runner: Runner, rollout: AttemptedRollout) -> Any: ...
    def on_trace_start(self, *, agent: LitAgent, runner: Runner, rollout: AttemptedRollout) -> Any: ...
    def on_trace_end(self, *, agent: LitAgent, runner: Runner, rollout: AttemptedRollout) -> Any: ...
    def on_rollout_end(self, *, agent: LitAgent, runner: Runner, rollout: Rollout) -> Any: ...


class Runner:
    """Runs rollouts from `store` with `agent` until stopped (or after `max_rollouts`).

    `concurrency` rollouts run at once in this runner's event loop: async agents interleave,
    sync agents each take a thread of the runner's own pool of `concurrency` threads. The runner
    claims a rollout only when it has room to run it, so no attempt waits for a thread while the
    store counts it as running.

    `isolation`: `"thread"` (the default) runs the agent in this process, and every exception it
    raises fails only its attempt; `"process"` runs each attempt in a process of its own, so an agent
    that exits the interpreter or crashes it fails its attempt with the exit code and the runner goes
    on (`agentgrad.rollout.isolation` says what that costs).
    """

    def __init__(
        self,
        agent: LitAgent | Callable[..., Any],
        store: Store,
        *,
        worker_id: str | None = None,
        hooks: Sequence[Hook] = (),
        concurrency: int = 1,
        max_rollouts: int | None = None,
        heartbeat_seconds: float = HEARTBEAT_SECONDS,
        isolation: Literal["thread", "process"] = "thread",
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation is 'thread' or 'process', not {isolation!r}")
        self.agent = as_agent(agent)
        self.store = store
        self.worker_id = worker_id or f"worker-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.hooks = list(hooks)
        self.concurrency = concurrency
        self.max_rollouts = max_rollouts
        self.heartbeat_seconds = heartbeat_seconds
        self.isolation = isolation
        self.completed = 0
        self._interrupted = False  # a Ctrl+C to this process is raising KeyboardInterrupt
        self._processes = AttemptProcesses(self.worker_id)
        self._stop = threading.Event()
        self._active: dict[str, AttemptedRollout] = {}
        self._resources: dict[str, NamedResources] = {}
        self._http: Any = None  # httpx.AsyncClient for gateway flushes, opened on first use

    def stop(self) -> None:
        """Take no new rollouts; `run` returns once those in flight end. Safe from any thread."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> None:
        """The worker loop."""
        self.sink = SpanSink(self.store)
        # sync agents (and attempt processes' pipes) take threads of the runner's own pool, one per rollout
        # in flight: the loop's default pool is shared by every runner of the loop and sized for the CPUs
        threads = concurrent.futures.ThreadPoolExecutor(self.concurrency, f"{self.worker_id}-agent")
        self._threads = threads
        uses_threads = agent_threads.set(threads)
        restore_sigint = self._mark_sigint()
        heartbeats = asyncio.create_task(self._heartbeats())
        in_flight: set[asyncio.Task[None]] = set()
        pause = POLL_SECONDS
        claimed = 0
        try:
            while not self._stop.is_set() and (self.max_rollouts is None or claimed < self.max_rollouts):
                if len(in_flight) >= self.concurrency:
                    done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    self._report(done)
                    continue
                item = await self._dequeue()
                if item is None:
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, MAX_POLL_SECONDS)
                    continue
                pause = POLL_SECONDS
                claimed += 1
                in_flight.add(asyncio.create_task(self.run_rollout(item)))
            if in_flight:
                self._report((await asyncio.wait(in_flight))[0])
        finally:
            for task in in_flight:  # the loop died: their attempts stay running, for the supervisor to give up
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
            restore_sigint()
            agent_threads.reset(uses_threads)
            self._processes.kill_all()  # any left: the runner was cancelled or interrupted, no one reads them
            threads.shutdown(wait=False, cancel_futures=True)
            heartbeats.cancel()
            await self.sink.flush()
            if self._http is not None:
                await self._http.aclose()
                self._http = None
            try:
                await self.store.heartbeat(self.worker_id, status=WorkerStatus.STOPPED, active_attempts=[])
            except Exception:
                log.warning("runner %s could not report that it stopped", self.worker_id, exc_info=True)

    def _mark_sigint(self) -> Callable[[], None]:
        """On the main thread, note each SIGINT before its handler runs (Python's raises KeyboardInterrupt,
        asyncio.run's cancels the main task), so `run_rollout` re-raises a KeyboardInterrupt that the
        signal caused and treats any other as the agent's own. Returns what puts the old handler back."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None  # signals reach the main thread only: this runner's agents raise their own
        previous = signal.getsignal(signal.SIGINT)
        if not callable(previous):
            return lambda: None  # ignored or the default action: no exception will come of a Ctrl+C

        def on_sigint(signum: int, frame: Any) -> None:
            self._interrupted = True
            previous(signum, frame)  # raises KeyboardInterrupt (Python's handler), or returns (a loop's handler)
            self._interrupted = False  # it returned: no KeyboardInterrupt comes of this Ctrl+C

        signal.signal(signal.SIGINT, on_sigint)

        def restore() -> None:
            if signal.getsignal(signal.SIGINT) is on_sigint:
                signal.signal(signal.SIGINT, previous)

        return restore

    def _report(self, done: set[asyncio.Task[None]]) -> None:
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.error("runner %s lost a rollout", self.worker_id, exc_info=task.exception())

    async def _dequeue(self) -> AttemptedRollout | None:
        try:
            return await self.store.dequeue_rollout(worker_id=self.worker_id)
        except StoreError:
            raise
        except Exception:  # the store is unreachable for now: try again after a pause
            log.warning("runner %s could not reach the store", self.worker_id, exc_info=True)
            return None

    async def _heartbeats(self) -> None:
        while True:
            active = [(item.rollout_id, item.attempt.attempt_id) for item in self._active.values()]
            try:
                await self.store.heartbeat(
                    self.worker_id,
                    status=WorkerStatus.BUSY if active else WorkerStatus.IDLE,
                    active_attempts=active,
                    info={"pid": os.getpid(), "host": socket.gethostname(), "agent": self.agent.name},
                )
            except NotFoundError:
                pass  # an attempt ended between the snapshot and the call; the next beat is right
            except Exception:
                log.warning("heartbeat of %s failed", self.worker_id, exc_info=True)
            await asyncio.sleep(self.heartbeat_seconds)

    async def _resources_for(self, rollout: Rollout) -> NamedResources:
        if rollout.resources_id is None:
            snapshot = await self.store.get_latest_resources()
            return dict(snapshot.resources) if snapshot else {}
        if rollout.resources_id not in self._resources:
            self._resources[rollout.resources_id] = (await self.store.get_resources(rollout.resources_id)).resources
        return dict(self._resources[rollout.resources_id])

    async def _call_hooks(self, name: str, **kwargs: Any) -> None:
        for hook in self.hooks:
            try:
                result = getattr(hook, name)(agent=self.agent, runner=self, **kwargs)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("hook %s.%s failed", type(hook).__name__, name)

    async def flush_gateways(self, base_urls: Sequence[str]) -> None:
        """Have the gateways at these routes (`…/v1`) store every call answered so far: the flush barrier.

        Gateways write spans in the background; the runner calls this for proxied LLMs before it
        closes an attempt, so an algorithm reading a finished rollout finds its last model call.
        Hooks may call it for other gateways. It is the gateway's documented endpoint
        `POST …/v1/agentgrad/flush`, so the runner needs no gateway code, only its URL.
        """
        if self._http is None:
            self._http = httpx.AsyncClient()
        for url in sorted({base.rstrip("/") + "/" + FLUSH_ENDPOINT for base in base_urls}):
            await self._flush_gateway(url)

    async def _flush_gateway(self, url: str) -> None:
        """One flush; retried once when the connection broke before an answer (the flush is idempotent)."""
        for retry in (False, True):
            try:
                response = await self._http.post(url, timeout=GATEWAY_FLUSH_SECONDS)
            except httpx.TransportError as exc:
                if not retry and not isinstance(exc, httpx.TimeoutException):
                    continue  # e.g. a kept-alive connection the server closed as it was reused: a new one
                log.warning("could not flush the gateway at %s: %s", url, exc)
                return
            except Exception as exc:  # a bad URL, say: the attempt still ends, its spans maybe incomplete
                log.warning("could not flush the gateway at %s: %s", url, exc)
                return
            if response.status_code != 200:
                log.warning("gateway flush at %s answered %d: %s", url, response.status_code, response.text[:200])
            return

    async def _fail_refused(self, rollout_id: str, attempt_id: str, refusal: StoreError) -> None:
        """The store refused the attempt's result: fail the attempt with the reason rather than leave it running
        (to end `unresponsive` much later). If the attempt already ended (timed out meanwhile), say so."""
        try:
            await self.store.update_attempt(
                rollout_id,
                attempt_id,
                status=AttemptStatus.FAILED,
                error=f"the store refused the attempt's result: {refusal}",
            )
            log.warning(
                "rollout %s: attempt %s failed: the store refused its result: %s", rollout_id, attempt_id, refusal
            )
        except StoreError as exc:  # the store gave the attempt up (timeout, no heartbeat) meanwhile
            log.warning("rollout %s: result of attempt %s not recorded: %s (%s)", rollout_id, attempt_id, refusal, exc)

    async def _run_in_process(
        self, item: AttemptedRollout, resources: NamedResources
    ) -> tuple[Reward | None, str | None]:
        """The agent on `item` in a process of its own (`isolation="process"`): (reward, None) or (None, error)."""
        from opentelemetry import trace

        current = trace.get_current_span().get_span_context()
        parent = (current.trace_id, current.span_id) if current.is_valid else None
        return await asyncio.get_running_loop().run_in_executor(
            self._threads, self._processes.run, self.agent, item, resources, self.sink, parent
        )

    async def _no_reward(self, item: AttemptedRollout) -> bool:
        """Whether the attempt ended with no reward span either; if so, its rollout's metadata says so."""
        try:
            attempts = await self.store.query_attempts(item.rollout_id)
            if any(a.attempt_id == item.attempt.attempt_id and a.reward is not None for a in attempts):
                return False
            await self.store.update_rollout(item.rollout_id, metadata={NO_REWARD: True})
        except StoreError as exc:
            log.warning("rollout %s: could not check for its reward: %s", item.rollout_id, exc)
            return False
        return True

    async def run_rollout(self, item: AttemptedRollout) -> None:
        """Run the agent on one claimed rollout and close its attempt."""
        rollout_id, attempt_id = item.rollout_id, item.attempt.attempt_id
        self._active[attempt_id] = item
        status, reward, error = AttemptStatus.SUCCEEDED, None, None
        proxied: list[LLM] = []
        resources_seen: NamedResources = {}
        try:
            await self._call_hooks("on_rollout_start", rollout=item)
            instrument_frameworks()  # the frameworks the agent imported report their tool runs into the attempt
            with bind_attempt(rollout_id, attempt_id, self.sink):
                attributes = {ROLLOUT_ID: rollout_id, ATTEMPT_ID: attempt_id, AGENT_NAME: self.agent.name}
                with get_tracer().start_as_current_span(ROLLOUT_SPAN, attributes=attributes):
                    await self._call_hooks("on_trace_start", rollout=item)
                    try:
                        resources = await self._resources_for(item)
                        resources = resources_seen = {
                            name: r.for_attempt(rollout_id, attempt_id) if isinstance(r, LLM) else r
                            for name, r in resources.items()
                        }
                        proxied = [r for r in resources.values() if isinstance(r, LLM) and r.proxied]
                        if self.isolation == "process":
                            returned, error = await self._run_in_process(item, resources)
                        else:
                            returned = await self.agent.run(item.input, resources, item)
                        if returned is not None:
                            reward = record_returned_reward(returned)
                    except BaseException as exc:  # an agent's KeyboardInterrupt or SystemExit too
                        task = asyncio.current_task()
                        if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling():
                            raise  # the runner is being stopped, not the agent failing
                        if isinstance(exc, KeyboardInterrupt) and self._interrupted:
                            raise  # a Ctrl+C to this process: it stops the runner
                        error = describe(exc)
                        emit_exception(exc)
                    await framework_reports()
                    if error is not None:
                        status, error = AttemptStatus.FAILED, with_llm_urls(error, resources_seen)
                        log.info("rollout %s attempt %s failed: %s", rollout_id, attempt_id, error)
                    await self._call_hooks("on_trace_end", rollout=item)
            if proxied:
                await self.flush_gateways([llm.base_url for llm in proxied])
            await self.sink.flush()
            if status is AttemptStatus.SUCCEEDED and reward is None and await self._no_reward(item):
                status, error = (
                    (AttemptStatus.FAILED, NO_REWARD_ERROR) if item.config.missing_reward == "fail" else (status, None)
                )
            try:
                await self.store.update_attempt(rollout_id, attempt_id, status=status, reward=reward, error=error)
            except StoreError as exc:
                await self._fail_refused(rollout_id, attempt_id, exc)
            self.completed += 1
            await self._call_hooks("on_rollout_end", rollout=await self.store.get_rollout(rollout_id))
        finally:
            del self._active[attempt_id]


def with_llm_urls(error: str, resources: NamedResources) -> str:
    """An attempt's error, with the URLs of its LLM resources when it is a connection error that names none
    (the openai client says only `Connection error.`): what the agent could not reach is what to fix."""
    if "Connect" not in error.split(":", 1)[0] or "://" in error:
        return error
    urls = sorted({r.base_url for r in resources.values() if isinstance(r, LLM)})
    if not urls:
        return error
    return f"{error} (the attempt's LLM resources point at {', '.join(urls)}: is that server up and reachable?)"
