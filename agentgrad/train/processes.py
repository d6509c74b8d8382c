"""The `processes` strategy: the store served over HTTP from the algorithm's process, runners in
their own processes; and `run_workers`, the body of any runner process (`agentgrad runner` too).

A runner process that dies is reported, and the attempts it was running are marked
`unresponsive` at once, so its rollouts go back to the queue under their retry policy. A runner
that stops sending heartbeats (hung, or on another machine that vanished) loses its attempts
after `RolloutConfig.unresponsive_seconds`, and by default they run again (`max_attempts_if_lost`).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import secrets
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from agentgrad.algorithms.base import Algorithm, RunContext
from agentgrad.rollout.agent import LitAgent
from agentgrad.rollout.runner import Hook, Runner
from agentgrad.store import Store, open_store
from agentgrad.train.layout import Layout
from agentgrad.types import AttemptStatus, RolloutStatus

R = TypeVar("R")

log = logging.getLogger(__name__)

STOP_SECONDS = 10.0
"""Grace for runner processes to finish the rollouts in flight once asked to stop; then they are killed."""

WATCH_SECONDS = 0.2
"""How often the algorithm's process looks at its runner processes."""


async def run_processes(
    algorithm: Algorithm[R],
    agent: LitAgent,
    ctx: RunContext,
    layout: Layout,
    train_data: Sequence[Any],
    val_data: Sequence[Any] | None,
) -> R:
    """Serve `ctx.store`, start `layout.n_runners` runner processes, run the algorithm, stop them all.

    With `layout.gateway` (`…/v1`), the runners' no-argument `OpenAI()` calls it, routed to each attempt.
    """
    from agentgrad.store.client import StoreClient
    from agentgrad.store.server import store_server

    hooks = list(layout.hooks)
    _check_picklable(agent, hooks)
    server = None
    if isinstance(ctx.store, StoreClient):  # a remote store: the runners join it directly
        url, token = ctx.store.url, ctx.store.token
    else:  # loopback unless the trainer was told otherwise; never without a token: other users need not write to it
        listen = ctx.listen
        token = listen.token or secrets.token_urlsafe(16)
        served = store_server(ctx.store, host=listen.host, token=token, advertise=listen.advertise)
        server = await asyncio.to_thread(served.start)
        url = server.url
    context = multiprocessing.get_context("spawn")  # fork would copy the server's threads and locks
    processes = [
        context.Process(
            target=run_workers,
            args=(
                url,
                token,
                agent,
                [f"runner-{i}"],
                layout.runner_concurrency,
                hooks,
                layout.gateway,
                layout.runner_isolation,
            ),
            name=f"runner-{i}",  # also its worker id
        )
        for i in range(layout.n_runners)
    ]
    try:
        for process in processes:
            process.start()
        log.info("store served at %s to %d runner processes", url, len(processes))
        return await _run_watching(ctx.store, algorithm.run(ctx, train_data, val_data), processes)
    finally:
        await asyncio.to_thread(stop_processes, processes)
        if server is not None:
            await asyncio.to_thread(server.stop)


def _check_picklable(agent: LitAgent, hooks: Sequence[Hook]) -> None:
    try:
        pickle.dumps((agent, hooks))
    except Exception as exc:
        raise TypeError(
            f"the processes strategy sends the agent and hooks to runner processes by pickling, and {exc}. "
            "Define them at module level in an importable module, or use strategy='threads'"
        ) from exc


async def _run_watching(store: Store, work: Any, processes: Sequence[multiprocessing.process.BaseProcess]) -> Any:
    """Run the algorithm; report a runner process that dies and give its attempts up at once."""
    task = asyncio.ensure_future(work)
    reported: set[str] = set()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=WATCH_SECONDS)
            if done:
                return task.result()
            for process in processes:
                if process.exitcode is None or process.name in reported:
                    continue
                reported.add(process.name)
                cause = _exit_cause(process.exitcode)
                log.error(
                    "runner process %s (pid %s) %s; its rollouts go back to the queue", process.name, process.pid, cause
                )
                await release_attempts(store, {process.name}, f"runner process {cause}")
            if processes and len(reported) == len(processes):
                raise RuntimeError(f"all {len(processes)} runner processes died; their errors are above")
    finally:
        task.cancel()


def _exit_cause(exitcode: int) -> str:
    if exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


async def release_attempts(store: Store, worker_ids: set[str], reason: str) -> int:
    """Mark the running attempts of these workers unresponsive; returns how many there were."""
    released = 0
    for rollout in await store.query_rollouts(status=[RolloutStatus.RUNNING]):
        for attempt in await store.query_attempts(rollout.rollout_id):
            if attempt.status is AttemptStatus.RUNNING and attempt.worker_id in worker_ids:
                try:
                    await store.update_attempt(
                        rollout.rollout_id, attempt.attempt_id, status=AttemptStatus.UNRESPONSIVE, error=reason
                    )
                    released += 1
                except Exception:  # it ended meanwhile
                    log.debug("attempt %s ended before it could be released", attempt.attempt_id)
    return released


def stop_processes(processes: Sequence[multiprocessing.process.BaseProcess], grace: float = STOP_SECONDS) -> None:
    """SIGTERM (finish what is in flight), then SIGKILL whatever is still alive after `grace`."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        if process.pid is None:
            continue  # never started
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            log.warning("runner process %s did not stop within %.0f s; killing it", process.name, grace)
            process.kill()
            process.join()


# ----------------------------------------------------------------------------- inside a runner process


def run_workers(
    store: str,
    token: str | None,
    agent: LitAgent,
    worker_ids: Sequence[str],
    concurrency: int = 1,
    hooks: Sequence[Hook] = (),
    gateway: str | None = None,
    isolation: Literal["thread", "process"] = "thread",
) -> None:
    """Run one `Runner` per worker id on the store at `store` (URL or path) until told to stop.

    With `gateway` (`…/v1`), agents that build `OpenAI()` with no arguments call it, each attempt
    on its own route (`GatewayEnvHook`; the process inherits the un-routed URL for clients built
    at import).

    SIGTERM or Ctrl+C: take no new rollouts and return once those in flight end; a second one
    quits at once. In a process the strategy started, the parent's death stops it as well.
    """
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {worker_ids[0]} %(levelname)s %(message)s")
    if gateway:
        from agentgrad.rollout.gateway_env import GatewayEnvHook
        from agentgrad.rollout.instrument import instrument_openai

        instrument_openai()  # clients built at import call the inherited un-routed URL: their headers route them
        hooks = [*hooks, GatewayEnvHook(gateway, api_key=token or "agentgrad")]  # the gateway's token, off loopback
    asyncio.run(_workers(store, token, agent, worker_ids, concurrency, hooks, isolation))


async def _workers(
    spec: str,
    token: str | None,
    agent: LitAgent,
    worker_ids: Sequence[str],
    concurrency: int,
    hooks: Sequence[Hook],
    isolation: Literal["thread", "process"] = "thread",
) -> None:
    from agentgrad.store.client import StoreClient

    store = StoreClient(spec, token) if spec.startswith(("http://", "https://")) else open_store(spec)
    runners = [
        Runner(agent, store, worker_id=wid, hooks=hooks, concurrency=concurrency, isolation=isolation)
        for wid in worker_ids
    ]
    loop = asyncio.get_running_loop()

    def stop() -> None:
        if any(runner.stopping for runner in runners):
            os._exit(130)  # asked twice: do not wait for agents that may never return
        log.info("stopping: finishing the rollouts in flight (Ctrl+C again to quit now)")
        for runner in runners:
            runner.stop()

    loop.add_signal_handler(signal.SIGTERM, stop)
    parent = multiprocessing.parent_process()
    if parent is None:
        loop.add_signal_handler(signal.SIGINT, stop)
    else:  # Ctrl+C reaches the whole process group: the parent answers it by stopping its runners in order
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        threading.Thread(target=_exit_with, args=(parent, loop, stop), daemon=True).start()
    try:
        await asyncio.gather(*(runner.run() for runner in runners))
    finally:
        await store.close()


def _exit_with(parent: multiprocessing.process.BaseProcess, loop: asyncio.AbstractEventLoop, stop: Any) -> None:
    """A runner process outlives no parent: stop when it dies, and quit if stopping takes too long."""
    multiprocessing.connection.wait([parent.sentinel])
    try:
        loop.call_soon_threadsafe(stop)
    except RuntimeError:  # the loop is closed: this process is exiting anyway
        return
    time.sleep(STOP_SECONDS)
    os._exit(1)
