"""Runners, started one way wherever they run: in the trainer's threads, in runner processes, in Ray actors, in
another Python environment (`agentgrad runner`), and watched one way.

`RunnerSpec` is everything a runner is built from (the agent, hooks, concurrency, isolation, and the gateway
its no-argument `OpenAI()` calls): every strategy builds its runners with `RunnerSpec.build`. `supervise` runs the
algorithm while watching the runners: one that dies is reported and the attempts it was running are marked
`unresponsive` at once (`release_attempts`), so their rollouts go back to the queue under their retry policy. A
runner that stops sending heartbeats (hung, or on a machine that vanished) loses its attempts after
`RolloutConfig.unresponsive_seconds` instead.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from agentgrad.rollout.agent import LitAgent
from agentgrad.rollout.runner import Hook, Runner
from agentgrad.store import Store, open_store
from agentgrad.types import AttemptStatus, RolloutStatus

log = logging.getLogger(__name__)

R = TypeVar("R")

WATCH_SECONDS = 0.2
"""How often `supervise` looks at the runners."""

STOP_SECONDS = 10.0
"""Grace for a runner process to finish the rollouts in flight once asked to stop; then it quits."""


@dataclass(frozen=True)
class RunnerSpec:
    """What a runner is built from, in any process: picklable, so runner processes and Ray actors get it whole.

    `gateway` (`…/v1`), for a runner in a process of its own: agents that build `OpenAI()` with no arguments call
    it, each attempt on its own route (`GatewayEnvHook`; calls from clients built earlier are routed by the headers
    `instrument_openai` adds). In the trainer's own process the trainer points the whole process at the gateway
    (`openai_environment`), so its runner threads take no `gateway`.
    """

    agent: LitAgent
    hooks: tuple[Hook, ...] = ()
    concurrency: int = 1
    isolation: Literal["thread", "process"] = "thread"
    gateway: str | None = None
    gateway_key: str = "agentgrad"  # the key agents send the gateway (its token, when it is bound off loopback)

    def build(self, store: Store, worker_id: str) -> Runner:
        hooks = list(self.hooks)
        if self.gateway:
            from agentgrad.rollout.gateway_env import GatewayEnvHook
            from agentgrad.rollout.instrument import instrument_openai

            instrument_openai()  # clients built at import call the inherited un-routed URL: their headers route them
            hooks.append(GatewayEnvHook(self.gateway, api_key=self.gateway_key))
        return Runner(
            self.agent, store, worker_id=worker_id, hooks=hooks, concurrency=self.concurrency, isolation=self.isolation
        )


class RunnerHandle(Protocol):
    """A runner (a thread, a process, an actor) as `supervise` watches it: its name, which is its worker id (or the
    prefix of its workers' ids, `name/0`, `name/1`, ...: `worker_of`), and its exit code once it has exited (None
    while it runs; negative: killed by that signal)."""

    @property
    def name(self) -> str: ...

    @property
    def exitcode(self) -> int | None: ...


async def supervise(store: Store, work: Awaitable[R], runners: Sequence[RunnerHandle]) -> R:
    """Await `work` (the algorithm's run) while watching `runners`: one that exits is reported and its attempts are
    given up at once (they run again under their retry policy); if every runner has exited, the run fails."""
    task = asyncio.ensure_future(work)
    reported: set[str] = set()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=WATCH_SECONDS)
            if done:
                return task.result()
            for runner in runners:
                code = runner.exitcode
                if code is None or runner.name in reported:
                    continue
                reported.add(runner.name)
                cause = exit_cause(code)
                log.error("runner %s %s; its rollouts go back to the queue", runner.name, cause)
                await release_attempts(store, {runner.name}, f"runner {cause}")
            if runners and len(reported) == len(runners):
                raise RuntimeError(f"all {len(runners)} runners exited; their errors are above")
    finally:
        task.cancel()


def exit_cause(exitcode: int) -> str:
    if exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


def worker_of(runner: str, index: int, workers: int) -> str:
    """The worker id of the `index`-th of a runner's `workers` runners: its name alone, or `name/index`."""
    return runner if workers == 1 else f"{runner}/{index}"


async def release_attempts(store: Store, runners: set[str], reason: str) -> int:
    """Mark the running attempts of these runners' workers unresponsive; returns how many there were."""
    released = 0
    for rollout in await store.query_rollouts(status=[RolloutStatus.RUNNING]):
        for attempt in await store.query_attempts(rollout.rollout_id):
            runner = (attempt.worker_id or "").split("/", 1)[0]
            if attempt.status is AttemptStatus.RUNNING and runner in runners:
                try:
                    await store.update_attempt(
                        rollout.rollout_id, attempt.attempt_id, status=AttemptStatus.UNRESPONSIVE, error=reason
                    )
                    released += 1
                except Exception:  # it ended meanwhile
                    log.debug("attempt %s ended before it could be released", attempt.attempt_id)
    return released


class RunnerThread:
    """A runner on its own event loop in a thread of this process (the `threads` strategy); a `RunnerHandle`."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=runner.worker_id, daemon=True)

    @property
    def name(self) -> str:
        return self.runner.worker_id

    @property
    def exitcode(self) -> int | None:
        if self.thread.is_alive() or self.thread.ident is None:
            return None
        return 1 if self.error is not None else 0

    def start(self) -> RunnerThread:
        self.thread.start()
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self.runner.run())
        except BaseException as exc:  # reported by `supervise`, which gives its attempts up
            self.error = exc
            log.exception("%s stopped with an error", self.runner.worker_id)


# ----------------------------------------------------------------------------- inside a runner process


def run_workers(store: str, token: str | None, spec: RunnerSpec, worker_ids: Sequence[str]) -> None:
    """Run one runner per worker id on the store at `store` (URL or path) until told to stop: the body of every
    runner process (the `processes` strategy's, and `agentgrad runner`'s).

    SIGTERM or Ctrl+C: take no new rollouts and return once those in flight end; a second one
    quits at once. In a process the strategy started, the parent's death stops it as well.
    """
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {worker_ids[0]} %(levelname)s %(message)s")
    asyncio.run(_workers(store, token, spec, worker_ids))


async def _workers(spec_store: str, token: str | None, spec: RunnerSpec, worker_ids: Sequence[str]) -> None:
    from agentgrad.store.client import StoreClient

    store = StoreClient(spec_store, token) if spec_store.startswith(("http://", "https://")) else open_store(spec_store)
    # this process is new: an attempt still running under one of its worker ids was a dead predecessor's
    released = await release_attempts(store, {w.split("/", 1)[0] for w in worker_ids}, "its runner was restarted")
    if released:
        log.warning("%d attempt(s) of a runner that died before this one go back to the queue", released)
    runners = [spec.build(store, worker_id) for worker_id in worker_ids]
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
