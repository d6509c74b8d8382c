"""What only a durable, shared file can promise: several processes, and surviving a kill."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from agentgrad.store import SqliteStore

CLAIM_AND_FINISH = textwrap.dedent(
    """
    import asyncio, json, sys
    from agentgrad.store import SqliteStore

    async def main(path, worker):
        store = SqliteStore(path)
        claimed = []
        while (item := await store.dequeue_rollout(worker_id=worker)) is not None:
            claimed.append(item.rollout_id)
            await store.update_attempt(item.rollout_id, item.attempt.attempt_id, status="succeeded")
        print(json.dumps(claimed))

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


def test_exactly_one_of_four_processes_claims_each_rollout(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    store = SqliteStore(path)
    asyncio.run(store.enqueue_rollouts([{"input": i} for i in range(400)]))
    workers = [
        subprocess.Popen([sys.executable, "-c", CLAIM_AND_FINISH, str(path), f"p{i}"], stdout=subprocess.PIPE, text=True)
        for i in range(4)
    ]
    claims = [json.loads(worker.communicate(timeout=120)[0]) for worker in workers]
    assert all(worker.returncode == 0 for worker in workers)
    everything = [rid for claimed in claims for rid in claimed]
    assert len(everything) == 400 and len(set(everything)) == 400
    assert asyncio.run(store.stats()).rollouts == {"succeeded": 400}


WRITE_UNTIL_KILLED = textwrap.dedent(
    """
    import asyncio, sys
    from agentgrad.store import SqliteStore
    from agentgrad.types import Span

    async def main(path):
        store = SqliteStore(path)
        i = 0
        while True:
            started = await store.start_rollout({"i": i})
            spans = [Span(rollout_id=started.rollout_id, attempt_id=started.attempt.attempt_id, name=f"s{j}",
                          attributes={"i": i, "j": j}) for j in range(3)]
            await store.add_spans(spans)
            await store.update_attempt(started.rollout_id, started.attempt.attempt_id, status="succeeded", reward=i)
            print(started.rollout_id, flush=True)
            i += 1

    asyncio.run(main(sys.argv[1]))
    """
)


def test_everything_committed_before_a_sigkill_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "killed.db"
    writer = subprocess.Popen([sys.executable, "-c", WRITE_UNTIL_KILLED, str(path)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    acknowledged = [writer.stdout.readline().strip() for _ in range(50)]
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=10)
    assert writer.returncode == -signal.SIGKILL

    async def read_back() -> None:
        store = SqliteStore(path)
        for i, rollout_id in enumerate(acknowledged):
            rollout = await store.get_rollout(rollout_id)
            assert rollout.status.value == "succeeded" and rollout.reward == i
            spans = await store.query_spans(rollout_id)
            assert [s.name for s in spans] == ["s0", "s1", "s2"] and spans[2].attributes == {"i": i, "j": 2}
        # the file is still a healthy store: it takes new work
        started = await store.start_rollout("after")
        await store.update_attempt(started.rollout_id, started.attempt.attempt_id, status="succeeded")
        await store.close()

    asyncio.run(read_back())
