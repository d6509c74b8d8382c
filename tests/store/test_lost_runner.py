"""A runner that dies mid-attempt under the default `RolloutConfig`: its rollout runs again elsewhere."""

from __future__ import annotations

import asyncio
from typing import Any

import agentgrad as ag
from agentgrad.rollout.runner import Runner
from agentgrad.store import MemoryStore
from agentgrad.types import AttemptStatus, RolloutConfig, RolloutStatus
from tests.helpers import ManualClock


async def test_a_runner_that_stops_beating_mid_attempt_loses_its_rollout_to_another_under_the_default_config() -> None:
    clock = ManualClock()
    store = MemoryStore(clock=clock)
    rollout = await store.enqueue_rollout({"n": 3})  # no config: the default
    hanging = asyncio.Event()

    @ag.rollout
    async def hangs(task: Any) -> float:
        hanging.set()
        await asyncio.Event().wait()  # never returns: the runner is as good as dead
        return 0.0

    doomed = Runner(hangs, store, worker_id="doomed", heartbeat_seconds=0.01)
    doomed_run = asyncio.create_task(doomed.run())
    await asyncio.wait_for(hanging.wait(), 10)
    doomed_run.cancel()  # its loop is gone: no heartbeats, no result
    await asyncio.gather(doomed_run, return_exceptions=True)
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        task.cancel()  # the agent's task, left behind

    clock.advance(RolloutConfig().unresponsive_seconds - 1)  # type: ignore[operator]
    await store.check_attempts(force=True)
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.RUNNING  # not yet given up
    clock.advance(2)
    await Runner(lambda task: float(task["n"] ** 2), store, worker_id="survivor", max_rollouts=1).run()

    final = await store.get_rollout(rollout.rollout_id)
    assert final.status is RolloutStatus.SUCCEEDED and final.reward == 9.0
    first, second = await store.query_attempts(rollout.rollout_id)
    assert (first.worker_id, first.status) == ("doomed", AttemptStatus.UNRESPONSIVE)
    assert (second.worker_id, second.status) == ("survivor", AttemptStatus.SUCCEEDED)
