"""The `threads` strategy: the algorithm and N runners in this process, each runner on its own
event loop in a thread (debugging, and the CPU demo, where the engine must share memory with the
runners' gateway anyway). The runners' `OpenAI()` calls reach the gateway through the process's
environment, each call naming its attempt in headers (`instrument_openai`)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from agentgrad.algorithms.base import Algorithm, RunContext
from agentgrad.rollout.agent import LitAgent
from agentgrad.rollout.runner import Runner
from agentgrad.train.layout import Layout

R = TypeVar("R")

log = logging.getLogger(__name__)

STOP_SECONDS = 30.0
"""How long the strategy waits for runners to finish their rollouts in flight once the algorithm is done."""


async def run_threads(
    algorithm: Algorithm[R],
    agent: LitAgent,
    ctx: RunContext,
    layout: Layout,
    train_data: Sequence[Any],
    val_data: Sequence[Any] | None,
) -> R:
    """Start `layout.n_runners` runner threads on `ctx.store`, run the algorithm, stop them."""
    runners = [
        Runner(
            agent,
            ctx.store,
            worker_id=f"runner-{i}",
            hooks=list(layout.hooks),
            concurrency=layout.runner_concurrency,
            isolation=layout.runner_isolation,
        )
        for i in range(layout.n_runners)
    ]
    threads = [
        threading.Thread(target=_run_in_own_loop, args=(runner,), name=runner.worker_id, daemon=True)
        for runner in runners
    ]
    for thread in threads:
        thread.start()
    try:
        return await algorithm.run(ctx, train_data, val_data)
    finally:
        for runner in runners:
            runner.stop()
        deadline = time.monotonic() + STOP_SECONDS
        for thread in threads:
            await asyncio.to_thread(thread.join, max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("%s did not stop within %.0f s; leaving it behind", thread.name, STOP_SECONDS)


def _run_in_own_loop(runner: Runner) -> None:
    try:
        asyncio.run(runner.run())
    except Exception:
        log.exception("%s stopped with an error", runner.worker_id)
