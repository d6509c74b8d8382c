"""The `processes` strategy: the store served over HTTP from the algorithm's process, runners in their own
processes (each runs `rollout.workers.run_workers`, as `agentgrad runner` does); and `run_with_runners`, the
algorithm beside runner processes started in another Python environment (`rollout.venvs.RunnerProcesses`).

Either way a runner process that dies is reported and the attempts it was running are given up at once
(`rollout.workers.supervise`), so its rollouts go back to the queue under their retry policy.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import pickle
import secrets
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from agentgrad.algorithms.base import Algorithm, RunContext
from agentgrad.rollout.venvs import RunnerProcesses
from agentgrad.rollout.workers import RunnerSpec, run_workers, supervise
from agentgrad.store import Store
from agentgrad.train.layout import Layout, Run

R = TypeVar("R")

log = logging.getLogger(__name__)

STOP_SECONDS = 10.0
"""Grace for runner processes to finish the rollouts in flight once asked to stop; then they are killed."""


async def run_processes(run: Run[R], ctx: RunContext, layout: Layout) -> R:
    """Serve `ctx.store`, start `layout.n_runners` runner processes, run the algorithm, stop them all.

    With a gateway (`layout.runner.gateway`, `…/v1`), the runners' no-argument `OpenAI()` calls it, routed to each
    attempt.
    """
    from agentgrad.store.client import StoreClient
    from agentgrad.store.server import store_server

    _check_picklable(layout.runner)
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
        context.Process(target=run_workers, args=(url, token, layout.runner, [f"runner-{i}"]), name=f"runner-{i}")
        for i in range(layout.n_runners)
    ]
    try:
        for process in processes:
            process.start()
        log.info("store served at %s to %d runner processes", url, len(processes))
        return await supervise(ctx.store, run(ctx), processes)
    finally:
        await asyncio.to_thread(stop_processes, processes)
        if server is not None:
            await asyncio.to_thread(server.stop)


async def run_with_runners(
    algorithm: Algorithm[R],
    store: Store,
    runners: Sequence[RunnerProcesses],
    train_data: Sequence[Any],
    val_data: Sequence[Any] | None = None,
    gateway_port: int = 0,
) -> R:
    """Run `algorithm` on `store` while runner processes of another environment (already started, pointed at it)
    execute its rollouts; supervised as the strategies' runners are. `gateway_port`: where an algorithm that serves
    its model (GRPO, SFT) puts its gateway (0: any free port)."""
    ctx = RunContext(store=store, gateway_port=gateway_port)
    return await supervise(store, algorithm.run(ctx, train_data, val_data), runners)


def _check_picklable(spec: RunnerSpec) -> None:
    try:
        pickle.dumps(spec)
    except Exception as exc:
        raise TypeError(
            f"the processes strategy sends the agent and hooks to runner processes by pickling, and {exc}. "
            "Define them at module level in an importable module, or use strategy='threads'"
        ) from exc


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
