"""The `threads` strategy: the algorithm and N runners in this process, each runner on its own event loop in a
thread (debugging, and the CPU demo, where the engine must share memory with the runners' gateway anyway). The
runners' `OpenAI()` calls reach the gateway through the process's environment, each call naming its attempt in
headers (`instrument_openai`, set up by the trainer's `openai_environment`)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TypeVar

from agentgrad.algorithms.base import RunContext
from agentgrad.rollout.workers import RunnerThread, supervise
from agentgrad.train.layout import Layout, Run

R = TypeVar("R")

log = logging.getLogger(__name__)

STOP_SECONDS = 30.0
"""How long the strategy waits for runners to finish their rollouts in flight once the algorithm is done."""


async def run_threads(run: Run[R], ctx: RunContext, layout: Layout) -> R:
    """Start `layout.n_runners` runner threads on `ctx.store`, `run` the algorithm, stop them."""
    spec = dataclasses.replace(layout.runner, gateway=None)  # the trainer's openai_environment routes this process
    threads = [RunnerThread(spec.build(ctx.store, f"runner-{i}")).start() for i in range(layout.n_runners)]
    try:
        return await supervise(ctx.store, run(ctx), threads)
    finally:
        for thread in threads:
            thread.runner.stop()
        deadline = time.monotonic() + STOP_SECONDS
        for thread in threads:
            await asyncio.to_thread(thread.thread.join, max(0.0, deadline - time.monotonic()))
            if thread.thread.is_alive():
                log.warning("%s did not stop within %.0f s; leaving it behind", thread.name, STOP_SECONDS)
