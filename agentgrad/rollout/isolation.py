"""One attempt's agent in a process of its own: `Runner(isolation="process")`, `agentgrad runner --isolation process`.

An agent that calls `os._exit`, is killed, or crashes the interpreter (a segfault in a native
library) then takes only its own process down: the attempt fails with the exit code and the
runner goes on. What it costs: a process per attempt, forked from a clean fork server (tens of
milliseconds, not an interpreter start), an agent defined at module level (it travels by module
and name), and a task and resources that pickle. The spans the agent writes travel back over a
pipe and the runner stores them as usual; its reward comes back the same way. An attempt still
running past its rollout's `timeout_seconds` is killed, so a hung agent does not hold the slot.

With the default `isolation="thread"` every exception the agent raises, `KeyboardInterrupt` and
`SystemExit` included, already fails only its attempt; a process is for what no `except` catches.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from agentgrad.rollout.agent import LitAgent, Reward
from agentgrad.types import AttemptedRollout, NamedResources, Span

ISOLATIONS = ("thread", "process")
"""`thread`: agents run in the runner's process (its threads or event loop); `process`: a process per attempt."""

TIMEOUT_GRACE_SECONDS = 1.0
"""How long past its rollout's `timeout_seconds` an attempt's process may run before the runner kills it."""

_context: Any = None
_context_lock = threading.Lock()
_reaping = threading.Lock()
"""multiprocessing reads a fork-server child's exit code from a pipe, once, and every `Process.start` reads those
of earlier children that ended: two threads reading the same child's race, and the loser records 255 (CPython's
`popen_forkserver.poll`). So the runner's worker threads start processes and read exit codes in turn."""


def process_context() -> Any:
    """The multiprocessing context attempts are started from: a fork server where there is one (forking the
    runner itself, which has threads, could copy a lock some thread holds), else spawn."""
    global _context
    with _context_lock:
        if _context is None:
            if "forkserver" in multiprocessing.get_all_start_methods():
                _context = multiprocessing.get_context("forkserver")
                _context.set_forkserver_preload([__name__])  # children start with agentgrad imported
            else:
                _context = multiprocessing.get_context("spawn")
        return _context


def describe(exc: BaseException) -> str:
    """How an attempt's error reads: `KeyboardInterrupt: ` with the message, whatever the exception."""
    return f"{type(exc).__qualname__}: {exc}"


def exit_description(code: int | None) -> str:
    """Why an attempt's process ended before it answered, from its exit code."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the agent's process died of {name} (exit code {code}) before it returned (isolation='process')"
    return f"the agent's process exited with code {code} before it returned (isolation='process')"


class _PipeSink:
    """What the tracer's span processor writes to inside the attempt's process: spans go up the pipe."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._lock = threading.Lock()

    def put(self, span: Span) -> None:
        with self._lock:
            self.connection.send(("span", span))


def _attempt_main(
    connection: Connection,
    agent: LitAgent,
    rollout: AttemptedRollout,
    resources: NamedResources,
    parent: tuple[int, int] | None,
) -> None:
    """The attempt's process: run the agent once under the attempt's tracing context, answer its reward or error."""
    from opentelemetry import context as otel_context
    from opentelemetry import trace

    from agentgrad.rollout.emit import emit_exception
    from agentgrad.rollout.tracer import bind_attempt

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the runner's to answer: it ends this process
    if parent is not None:  # the agent's spans are children of the runner's rollout span
        span_context = trace.SpanContext(
            parent[0], parent[1], is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
        )
        otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(span_context)))
    with bind_attempt(rollout.rollout_id, rollout.attempt.attempt_id, _PipeSink(connection)):  # type: ignore[arg-type]
        try:
            answer: tuple[str, Any] = ("reward", asyncio.run(run_and_report(agent, rollout, resources)))
        except BaseException as exc:
            emit_exception(exc)
            answer = ("error", describe(exc))
    connection.send(answer)
    connection.close()


async def run_and_report(agent: LitAgent, rollout: AttemptedRollout, resources: NamedResources) -> Any:
    """The agent's run, then what its frameworks have yet to report (`frameworks.framework_reports`)."""
    from agentgrad.rollout.frameworks import framework_reports

    try:
        return await agent.run(rollout.input, resources, rollout)
    finally:
        await framework_reports()


class AttemptProcesses:
    """The attempt processes of one runner: started per attempt, all killed when the runner is interrupted."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._live: set[Any] = set()
        self._lock = threading.Lock()

    def run(
        self,
        agent: LitAgent,
        rollout: AttemptedRollout,
        resources: NamedResources,
        sink: Any,
        parent: tuple[int, int] | None,
    ) -> tuple[Reward | None, str | None]:
        """Run the agent on the rollout in a new process (blocking; call it from a worker thread).

        Returns (reward, None) or (None, error); spans arrive through `sink.put` as the agent writes them."""
        context = process_context()
        receive, send = context.Pipe(duplex=False)
        process = context.Process(
            target=_attempt_main,
            args=(send, agent, rollout, resources, parent),
            name=f"{self.worker_id}-{rollout.attempt.attempt_id}",
        )
        try:
            with _reaping:
                process.start()  # pickles the agent, task and resources: an error here says which did not pickle
        finally:
            send.close()
        with self._lock:
            self._live.add(process)
        answer: tuple[str, Any] | None = None
        limit = rollout.config.timeout_seconds
        deadline = None if limit is None else time.monotonic() + limit + TIMEOUT_GRACE_SECONDS
        overdue = False
        try:
            while True:
                if deadline is not None and not receive.poll(max(0.0, deadline - time.monotonic())):
                    overdue = True  # the store has timed the attempt out: free this runner's slot for the next
                    process.kill()
                    break
                try:
                    message = receive.recv()
                except (EOFError, OSError):
                    break  # the process ended (or was killed) and nothing more will come
                if message[0] == "span":
                    sink.put(message[1])
                else:
                    answer = message
        finally:
            receive.close()
            multiprocessing.connection.wait([process.sentinel])
            with _reaping:
                process.join()
            with self._lock:
                self._live.discard(process)
        if overdue:
            return None, f"the agent's process was killed past the attempt's timeout of {limit} s (isolation='process')"
        if answer is None:
            return None, exit_description(process.exitcode)
        kind, value = answer
        return (value, None) if kind == "reward" else (None, value)

    def kill_all(self) -> None:
        with self._lock:
            live = list(self._live)
        for process in live:
            with _reaping:
                alive = process.is_alive()
            if alive:
                process.kill()
