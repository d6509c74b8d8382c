"""How soon a wait on one store server returns after another server of the same PostgreSQL database finishes its
rollout.

    .venv/bin/python benchmarks/store_wake.py [--rollouts 40] [--postgres URL]

Two `PostgresStore`s on one database, as two `agentgrad serve` processes hold them: the first enqueues a rollout
and waits on it (`wait_for_rollouts`), the second claims it and marks its attempt succeeded while the wait is
between its own looks (20 ms after it began); the figure is the time from that write's return to the wait's.
Before the database announced finished rollouts (`postgres_schema` migration 3, LISTEN/NOTIFY), a wait learnt it
at its next look, every `WAIT_POLL_SECONDS` (50 ms). PostgreSQL is a throwaway server from the distribution's
binaries (`make postgres`), or `--postgres URL`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from agentgrad.store.postgres import PostgresStore


async def wake_times(url: str, rollouts: int) -> list[float]:
    """Milliseconds from the finishing write's return to the wait's, one per rollout."""
    waiting, finishing = PostgresStore(url, sweep_seconds=None), PostgresStore(url, sweep_seconds=None)
    times = []
    for index in range(rollouts):
        rollout = await waiting.enqueue_rollout({"index": index})
        claimed = await finishing.dequeue_rollout()
        assert claimed is not None and claimed.rollout_id == rollout.rollout_id
        wait = asyncio.create_task(waiting.wait_for_rollouts([rollout.rollout_id], timeout=10))
        await asyncio.sleep(0.02)  # the wait has looked once and sleeps until woken or its next look
        await finishing.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
        finished = time.perf_counter()
        (done,) = await wait
        times.append((time.perf_counter() - finished) * 1e3)
        assert done.status.finished
    for store in (waiting, finishing):
        await store.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=40)
    parser.add_argument("--postgres", help="a database URL (default: a throwaway server)")
    args = parser.parse_args()
    if args.postgres:
        times = asyncio.run(wake_times(args.postgres, args.rollouts))
    else:
        from tests.postgres_server import PostgresServer

        with PostgresServer() as server:
            times = asyncio.run(wake_times(server.create_database("wake"), args.rollouts))
    print(
        f"a wait woke {statistics.median(times):.2f} ms (median; max {max(times):.2f}) after another store server "
        f"finished its rollout, over {len(times)} rollouts"
    )


if __name__ == "__main__":
    main()
