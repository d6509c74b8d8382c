"""psycopg 3 against asyncpg on the PostgreSQL store's two hot transactions, to choose its driver.

Each of `--tasks` tasks on one event loop, with a connection of its own, repeats: a dequeue (select the
oldest waiting row `FOR UPDATE SKIP LOCKED`, mark it running, insert an attempt row: one transaction)
and a span batch (10 rows of ~600 bytes in one multi-row insert: one transaction). Printed per driver:
transactions/s, and the client's CPU ms per transaction, which on a small machine decides how much is
left for the store server's own work. The server is a throwaway one (`tests/postgres_server.py`) or
`--url`.

    .venv/bin/pip install 'psycopg[binary]'   # the other driver (asyncpg comes with the dev extra)
    .venv/bin/python benchmarks/pg_drivers.py
    .venv/bin/python benchmarks/pg_drivers.py --rounds 2000 --tasks 16
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SCHEMA = """
DROP TABLE IF EXISTS bench_queue, bench_attempts, bench_spans;
CREATE TABLE bench_queue (id TEXT PRIMARY KEY, seq BIGSERIAL, status TEXT NOT NULL, pos DOUBLE PRECISION NOT NULL);
CREATE INDEX bench_waiting ON bench_queue (pos, seq) WHERE status = 'queuing';
CREATE TABLE bench_attempts (id TEXT PRIMARY KEY, rollout TEXT NOT NULL, start DOUBLE PRECISION NOT NULL);
CREATE TABLE bench_spans (rollout TEXT, seq BIGINT, body TEXT, PRIMARY KEY (rollout, seq));
"""
DEQUEUE = (
    "SELECT id FROM bench_queue WHERE status = 'queuing' ORDER BY pos, seq LIMIT 1 FOR UPDATE SKIP LOCKED",
    "UPDATE bench_queue SET status = 'running' WHERE id = {0}",
    "INSERT INTO bench_attempts VALUES ({0}, {1}, {2})",
)
SPANS = "INSERT INTO bench_spans SELECT * FROM unnest({0}::text[], {1}::bigint[], {2}::text[])"
BODY = "x" * 600


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_asyncpg(url: str, tasks: int, rounds: int) -> tuple[float, float]:
    import asyncpg

    connections = [await asyncpg.connect(url) for _ in range(tasks)]
    dequeue = [q.format("$1", "$2", "$3") for q in DEQUEUE]
    spans = SPANS.format("$1", "$2", "$3")

    async def worker(conn: Any, index: int) -> None:
        for r in range(rounds):
            async with conn.transaction():
                row = await conn.fetchrow(dequeue[0])
                await conn.execute(dequeue[1], row[0])
                await conn.execute(dequeue[2], uuid.uuid4().hex, row[0], time.time())
            key = f"a{index}-{r}"
            async with conn.transaction():
                await conn.execute(spans, [key] * 10, list(range(10)), [BODY] * 10)

    return await timed(worker, connections, tasks, rounds, lambda c: c.close())


async def run_psycopg(url: str, tasks: int, rounds: int) -> tuple[float, float]:
    import psycopg

    connections = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(tasks)]
    dequeue = [q.format("%s", "%s", "%s") for q in DEQUEUE]
    spans = SPANS.format("%s", "%s", "%s")

    async def worker(conn: Any, index: int) -> None:
        for r in range(rounds):
            async with conn.transaction():
                row = await (await conn.execute(dequeue[0])).fetchone()
                await conn.execute(dequeue[1], (row[0],))
                await conn.execute(dequeue[2], (uuid.uuid4().hex, row[0], time.time()))
            key = f"p{index}-{r}"
            async with conn.transaction():
                await conn.execute(spans, ([key] * 10, list(range(10)), [BODY] * 10))

    return await timed(worker, connections, tasks, rounds, lambda c: c.close())


async def timed(worker: Any, connections: list[Any], tasks: int, rounds: int, close: Any) -> tuple[float, float]:
    start_cpu, start = cpu(), time.perf_counter()
    await asyncio.gather(*(worker(conn, i) for i, conn in enumerate(connections)))
    seconds, cpu_seconds = time.perf_counter() - start, cpu() - start_cpu
    for conn in connections:
        await close(conn)
    transactions = 2 * tasks * rounds
    return transactions / seconds, 1000 * cpu_seconds / transactions


async def prepare(url: str, rows: int) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    await conn.execute(SCHEMA)
    await conn.execute(
        "INSERT INTO bench_queue (id, status, pos) SELECT 'r' || i, 'queuing', i FROM generate_series(1, $1::int) i",
        rows,
    )
    await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a PostgreSQL database to use (default: a throwaway server)")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=500, help="dequeues (and span batches) per task")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each driver, alternating; the best is shown")
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        from tests.postgres_server import PostgresServer

        server = PostgresServer(durable=True).start()
        url = server.url()
    try:
        runs: dict[str, list[tuple[float, float]]] = {"asyncpg": [], "psycopg 3": []}
        for _ in range(args.repeat):
            for name, run in (("asyncpg", run_asyncpg), ("psycopg 3", run_psycopg)):
                asyncio.run(prepare(url, args.tasks * args.rounds))
                runs[name].append(asyncio.run(run(url, args.tasks, args.rounds)))
        print(f"{args.tasks} tasks x {args.rounds} (dequeue + 10-span batch); load average {os.getloadavg()[0]:.2f}")
        print(f"{'driver':<12}{'transactions/s':>16}{'client CPU ms/transaction':>28}")
        for name, results in runs.items():
            rate = max(r[0] for r in results)
            cpu_ms = min(r[1] for r in results)
            print(f"{name:<12}{rate:>16.0f}{cpu_ms:>28.3f}")
    finally:
        if server is not None:
            server.remove()


if __name__ == "__main__":
    main()
