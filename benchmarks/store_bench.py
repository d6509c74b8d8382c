"""The store's rollout lifecycle, timed: in process (memory, SQLite) and over HTTP (SQLite behind the server).

Each worker repeats, until 2,000 rollouts are done: enqueue a task -> dequeue a rollout ->
add 10 spans (one batch, ~10 short attributes each) -> mark the attempt succeeded -> wait for
the rollout it enqueued -> query that rollout's spans. Every setup runs in fresh processes, so
peak RSS is its own; over HTTP the server is `agentgrad serve` on a SQLite file, and the last
row writes the 10 spans one call at a time: Agent Lightning 0.3's workload (10 single `add_span`
calls per rollout), shown next to its figure. "span writes" is the time of a rollout's 10 spans
(one call, or ten). CPU ms per rollout barely depends on what else the machine runs; rollouts/s
and the p99s do. `--only queue` times a SQLite dequeue at 1k and 100k queued, and the server's
health check while 8 clients dequeue from a 100k queue. `--only postgres` runs the HTTP lifecycle
(4 client processes × 8 workers) against one `agentgrad serve` on SQLite, one on PostgreSQL, and four
on one PostgreSQL database (each client process on its own server), in one run: PostgreSQL is a
throwaway server from the distribution's binaries (`make postgres`; fsync on, commits acknowledged
before their WAL is flushed, as SQLite's `synchronous=NORMAL`), or `--postgres URL`. Each row's line adds the
CPU a rollout cost in all (PostgreSQL's too, its server and backends, when the script started it) and how many
of the machine's CPUs that kept busy: where that is all of them, more servers cannot go faster here.

Agent Lightning 0.3 runs side by side when its own environment is there (`.venv-agl`, or
`--agentlightning PYTHON`): its in-memory store in a process of 16 workers, the spans of a rollout in one
`add_many_spans` call, and its store server (`python -m agentlightning.cli.store`, in memory) with one
client process of 16 workers through its `LightningStoreClient`, with 10 single `add_span` calls per
rollout (its client's workload). It is never imported here: it runs in its own processes. Without that
environment its rows are left out: no figure of it is quoted.

    .venv/bin/python benchmarks/store_bench.py            # the table, in about a minute
    .venv/bin/python benchmarks/store_bench.py --rollouts 500 --only http
    .venv/bin/python benchmarks/store_bench.py --only queue
    .venv/bin/python benchmarks/store_bench.py --only postgres   # 1 and 4 PostgreSQL servers against 1 SQLite server
    python3 -m venv .venv-agl && .venv-agl/bin/pip install 'agentlightning==0.3.*'   # the reference row
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROLLOUTS = 2000
SPANS_PER_ROLLOUT = 10

AGL_PYTHON = Path(__file__).resolve().parent.parent / ".venv-agl" / "bin" / "python"
"""Agent Lightning 0.3's own environment; made with `python3 -m venv .venv-agl && .venv-agl/bin/pip install 'agentlightning==0.3.*'`."""
AGL_ROW = "Agent Lightning 0.3 server (in memory), spans one by one"
AGL_IN_PROCESS_ROW = "Agent Lightning 0.3, in process (memory), batched spans"
AGL_ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
"""Without it, importing agentlightning (its litellm) fetches a price list from the network first."""
AGL_ROLLOUTS = 300
"""Rollouts of the Agent Lightning row: its rate is steady, and it is slow enough that fewer do."""
QUEUE_SIZES = (1_000, 100_000)
QUEUE_CLIENTS = 8


def spans_for(rollout_id: str, attempt_id: str, index: int, as_dicts: bool = False) -> list[Any]:
    """A rollout's 10 spans, with OpenTelemetry trace and span ids as the tracer and the gateway write them."""
    trace_id = f"{random.getrandbits(128):032x}"
    spans = [
        {
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "trace_id": trace_id,
            "span_id": f"{random.getrandbits(64):016x}",
            "name": "chat" if j % 2 else "tool",
            "attributes": {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "small-model",
                "gen_ai.usage.input_tokens": 120 + j,
                "gen_ai.usage.output_tokens": 30 + j,
                "agentgrad.step": j,
                "task.index": index,
                "tool.name": "search",
                "score": 0.25 * j,
                "lang": "en",
                "ok": "yes",
            },
        }
        for j in range(SPANS_PER_ROLLOUT)
    ]
    if as_dicts:
        return spans
    from agentgrad.types import Span

    return [Span(**span) for span in spans]


async def lifecycle(store: Any, workers: int, count: int, single_spans: bool) -> dict[str, Any]:
    """Run `count` lifecycles on `workers` concurrent workers; returns the latencies in seconds."""
    remaining = count
    dequeue: list[float] = []
    span_writes: list[float] = []

    async def worker(index: int) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            mine = await store.enqueue_rollout({"index": index, "question": "What is 2+2?"}, mode="train")
            began = time.perf_counter()
            item = await store.dequeue_rollout(worker_id=f"w{index}")
            dequeue.append(time.perf_counter() - began)
            spans = spans_for(item.rollout_id, item.attempt.attempt_id, index)
            began = time.perf_counter()
            if single_spans:
                for span in spans:
                    await store.add_span(span)
            else:
                await store.add_spans(spans)
            span_writes.append(time.perf_counter() - began)
            await store.update_attempt(item.rollout_id, item.attempt.attempt_id, status="succeeded", reward=1.0)
            (done,) = await store.wait_for_rollouts([mine.rollout_id], timeout=60)
            assert done.status.value == "succeeded"
            assert len(await store.query_spans(mine.rollout_id)) == SPANS_PER_ROLLOUT

    began, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    return {"seconds": time.perf_counter() - began, "cpu": time.process_time() - cpu, "dequeue": dequeue,
            "span_writes": span_writes}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def process_peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stat_fields(stat: Path) -> list[str]:
    """The fields of a `/proc/PID/stat` after the command name: [0] the state, [1] the parent's pid, [11:13] user and
    system CPU ticks, [13:15] those of the children that ended."""
    return stat.read_text().rsplit(")", 1)[1].split()


def process_cpu_seconds(pid: int) -> float:
    fields = stat_fields(Path(f"/proc/{pid}/stat"))
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of process `pid`, its live children and those that ended: a PostgreSQL server's, with the
    backends that served the store's connections."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_fields(stat)
        except OSError:  # it ended meanwhile: its time is in its parent's now
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):
            total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


# ----------------------------------------------------------------------------- child modes


def run_in_process(backend: str, workers: int, count: int, directory: str) -> None:
    from agentgrad.store import MemoryStore, SqliteStore

    store = MemoryStore() if backend == "memory" else SqliteStore(Path(directory) / "bench.db")
    result = asyncio.run(lifecycle(store, workers, count, single_spans=False))
    print(json.dumps({**result, "rss": peak_rss_mb()}))


def run_client(url: str, workers: int, count: int, single_spans: bool) -> None:
    """One client process: get ready, wait for 'go' on stdin, run, print the result."""
    from agentgrad.store.client import StoreClient

    async def main() -> dict[str, Any]:
        store = StoreClient(url)
        await store.stats()  # connected and warm
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        result = await lifecycle(store, workers, count, single_spans)
        await store.close()
        return result

    result = asyncio.run(main())
    print(json.dumps({**result, "rss": peak_rss_mb()}))


async def agl_lifecycle(store: Any, workers: int, count: int, batched: bool = False) -> dict[str, Any]:
    """`lifecycle` on an Agent Lightning 0.3 store, its spans one `add_span` call each, or one `add_many_spans` call
    with `batched` (its API asks the caller for each span's sequence id, and its client's `wait_for_rollouts` polls
    at most 0.1 s at a time)."""
    from agentlightning.types import OtelResource, Span, TraceStatus

    remaining = count
    dequeue: list[float] = []
    span_writes: list[float] = []

    async def worker(index: int) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            mine = await store.enqueue_rollout({"index": index, "question": "What is 2+2?"}, mode="train")
            began = time.perf_counter()
            item = await store.dequeue_rollout(worker_id=f"w{index}")
            dequeue.append(time.perf_counter() - began)
            ours = spans_for(item.rollout_id, item.attempt.attempt_id, index, as_dicts=True)
            began = time.perf_counter()
            theirs = [
                Span(
                    rollout_id=item.rollout_id, attempt_id=item.attempt.attempt_id, sequence_id=j + 1,
                    trace_id=span["trace_id"], span_id=span["span_id"], parent_id=None, name=span["name"],
                    status=TraceStatus(status_code="OK"), attributes=span["attributes"], events=[], links=[],
                    start_time=time.time(), end_time=time.time(), context=None, parent=None,
                    resource=OtelResource(attributes={}, schema_url=""),
                )
                for j, span in enumerate(ours)
            ]
            if batched:
                await store.add_many_spans(theirs)
            else:
                for span in theirs:
                    await store.add_span(span)
            span_writes.append(time.perf_counter() - began)
            await store.update_attempt(item.rollout_id, item.attempt.attempt_id, status="succeeded")
            while not (done := await store.wait_for_rollouts(rollout_ids=[mine.rollout_id], timeout=0.1)):
                pass
            assert done[0].status == "succeeded", done[0].status
            assert len(await store.query_spans(mine.rollout_id)) == SPANS_PER_ROLLOUT

    began, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    return {"seconds": time.perf_counter() - began, "cpu": time.process_time() - cpu, "dequeue": dequeue,
            "span_writes": span_writes}


def run_agl_in_process(workers: int, count: int) -> None:
    """`run_in_process` on Agent Lightning 0.3's in-memory store, spans batched (run by its own Python)."""
    from agentlightning.store import InMemoryLightningStore

    result = asyncio.run(agl_lifecycle(InMemoryLightningStore(), workers, count, batched=True))
    print(json.dumps({**result, "rss": peak_rss_mb()}))


def run_agl_client(url: str, workers: int, count: int) -> None:
    """`run_client` with Agent Lightning 0.3's client (run by its own Python)."""
    from agentlightning.store import LightningStoreClient

    async def main() -> dict[str, Any]:
        store = LightningStoreClient(url)
        await store.statistics()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        result = await agl_lifecycle(store, workers, count)
        await store.close()
        return result

    result = asyncio.run(main())
    print(json.dumps({**result, "rss": peak_rss_mb()}))


# ----------------------------------------------------------------------------- the parent


def child(*args: str, python: Path | None = None, **options: Any) -> subprocess.Popen[str]:
    """This script in a new process (run by `python`: Agent Lightning's, for its client)."""
    return subprocess.Popen(
        [str(python or sys.executable), __file__, *args], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
        env=None if python is None else AGL_ENV, **options,
    )


def agl_version(python: Path) -> str | None:
    """The Agent Lightning version installed for `python`, if it is a 0.3 release; else None."""
    if not python.exists():
        return None
    code = "import importlib.metadata as m; print(m.version('agentlightning'))"
    found = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    version = found.stdout.strip()
    return version if found.returncode == 0 and version.startswith("0.3") else None


def in_process(backend: str, workers: int, count: int, agl_python: Path | None = None) -> dict[str, Any]:
    """One process running the lifecycle on a store of its own: ours (`backend`), or Agent Lightning 0.3's in-memory
    store with `agl_python`."""
    with tempfile.TemporaryDirectory(prefix="store-bench-") as directory:
        mode = ["--child-in-process", backend, "--dir", directory] if agl_python is None else ["--child-agl-in-process"]
        run = child(*mode, "--workers", str(workers), "--rollouts", str(count), python=agl_python)
        out, _ = run.communicate(timeout=600)
    result = json.loads(out.splitlines()[-1])
    name = f"{backend}, in process" if agl_python is None else AGL_IN_PROCESS_ROW
    return summary(name, f"{workers}", count, result["seconds"], [result], result["rss"], None, None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(directory: str, agl_python: Path | None = None) -> tuple[subprocess.Popen[str], str, float]:
    """`agentgrad serve` on a fresh SQLite file (or Agent Lightning 0.3's store server, with `agl_python`);
    returns it, its URL and its start-up time (spawn to healthy)."""
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if agl_python is None:
        command = [sys.executable, "-m", "agentgrad.cli", "serve", "--store", str(Path(directory) / "bench.db"),
                   "--port", str(port)]
        health, env = url + "/api/health", None
    else:
        command = [str(agl_python), "-m", "agentlightning.cli.store", "--host", "127.0.0.1", "--port", str(port),
                   "--log-level", "WARNING"]
        health, env = url + "/v1/agl/health", AGL_ENV
    began = time.perf_counter()
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL if agl_python else None,
                              env=env)
    with httpx.Client() as client:
        while True:
            try:
                if client.get(health, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise RuntimeError(f"the server did not start: {' '.join(command)}")
            time.sleep(0.005)
    return server, url, time.perf_counter() - began


def start_store_server(store: str) -> tuple[subprocess.Popen[str], str]:
    """`agentgrad serve --store STORE` on a free port, once healthy."""
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "agentgrad.cli", "serve", "--store", store, "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    while True:
        try:
            if httpx.get(url + "/api/health", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            raise RuntimeError(f"the server did not start: {' '.join(command)}")
        time.sleep(0.02)


def race(
    clients: list[subprocess.Popen[str]], servers: list[int], database: int | None = None
) -> tuple[list[dict[str, Any]], float, float, float, float | None]:
    """Start the ready client processes at once and collect their results: (results, seconds, the servers' CPU
    seconds meanwhile, their largest peak RSS in MB, the CPU seconds of the database server `database`)."""
    for client in clients:
        assert client.stdout is not None and client.stdout.readline().strip() == "ready"
    database_cpu = None if database is None else tree_cpu_seconds(database)
    began, server_cpu = time.perf_counter(), sum(map(process_cpu_seconds, servers))
    for client in clients:
        assert client.stdin is not None
        client.stdin.write("go\n")
        client.stdin.flush()
    results = [json.loads(client.communicate(timeout=900)[0].splitlines()[-1]) for client in clients]
    seconds = time.perf_counter() - began
    server_cpu = sum(map(process_cpu_seconds, servers)) - server_cpu
    if database is not None:
        database_cpu = tree_cpu_seconds(database) - database_cpu  # type: ignore[operator]
    return results, seconds, server_cpu, max(map(process_peak_rss_mb, servers)), database_cpu


def servers_row(
    name: str, stores: list[str], processes: int, workers: int, count: int, database: int | None = None
) -> dict[str, Any]:
    """The lifecycle over HTTP with one `agentgrad serve` per entry of `stores`, client process i on server i % n;
    `database`: the pid of the PostgreSQL server they use, whose CPU is counted too."""
    servers = [start_store_server(store) for store in stores]
    try:
        share = count // processes
        clients = [
            child("--child-client", servers[i % len(servers)][1], "--workers", str(workers), "--rollouts", str(share))
            for i in range(processes)
        ]
        results, seconds, server_cpu, server_rss, database_cpu = race(
            clients, [server.pid for server, _ in servers], database
        )
    finally:
        for server, _ in servers:
            server.terminate()
            server.wait(timeout=30)
    rss = max(r["rss"] for r in results)
    row = summary(name, f"{processes}×{workers}", share * processes, seconds, results, rss, server_rss, server_cpu)
    row["database CPU ms/rollout"] = None if database_cpu is None else 1000 * database_cpu / (share * processes)
    return row


def postgres_rows(count: int, postgres: str | None) -> list[dict[str, Any]]:
    """One SQLite server, one PostgreSQL server, four PostgreSQL servers on one database: the same clients."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.postgres_server import PostgresServer

    pg = None if postgres else PostgresServer(durable=True).start()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="store-bench-") as directory:
            rows.append(servers_row("HTTP, SQLite, 1 server", [str(Path(directory) / "bench.db")], 4, 8, count))
        for servers in (1, 4):
            if pg is not None:
                url = pg.create_database(f"bench{servers}")
            else:
                url = postgres.rstrip("/") + f"?search_path=bench{servers}"  # type: ignore[union-attr]
            database = None if pg is None else pg.pid()
            rows.append(
                servers_row(f"HTTP, PostgreSQL, {servers} server(s)", [url] * servers, 4, 8, count, database)
            )
    finally:
        if pg is not None:
            pg.remove()
    return rows


def over_http(
    processes: int, workers: int, count: int, single_spans: bool = False, agl_python: Path | None = None
) -> tuple[dict[str, Any], float]:
    with tempfile.TemporaryDirectory(prefix="store-bench-") as directory:
        server, url, startup = start_server(directory, agl_python)
        try:
            share = count // processes
            extra = ["--single-spans"] if single_spans else []
            mode = "--child-client" if agl_python is None else "--child-agl-client"
            clients = [
                child(mode, url, "--workers", str(workers), "--rollouts", str(share), *extra, python=agl_python)
                for _ in range(processes)
            ]
            results, seconds, server_cpu, server_rss, _ = race(clients, [server.pid])
        finally:
            server.terminate()
            server.wait(timeout=30)
    name = AGL_ROW if agl_python else "HTTP, SQLite server" + (", spans one by one" if single_spans else "")
    rss = max(r["rss"] for r in results)
    row = summary(name, f"{processes}×{workers}", share * processes, seconds, results, rss, server_rss, server_cpu)
    return row, startup


# ----------------------------------------------------------------------------- queue depth


def fill_queue(path: Path, count: int) -> None:
    from agentgrad.store import SqliteStore

    store = SqliteStore(path)
    for start in range(0, count, 10_000):
        asyncio.run(store.enqueue_rollouts([{"input": {"i": i}} for i in range(start, min(count, start + 10_000))]))


def dequeue_ms(path: Path, samples: int = 500) -> float:
    """Median time of one in-process dequeue (claim and open an attempt) from the file's queue."""
    from agentgrad.store import SqliteStore

    async def run() -> float:
        store = SqliteStore(path)
        times = []
        for _ in range(samples):
            began = time.perf_counter()
            assert await store.dequeue_rollout() is not None
            times.append(time.perf_counter() - began)
        await store.close()
        return 1000 * statistics.median(times)

    return asyncio.run(run())


def run_dequeuer(url: str) -> None:
    """A client that claims rollouts and completes them until told to stop (stdin closes)."""
    from agentgrad.store.client import StoreClient

    async def main() -> None:
        store = StoreClient(url)
        stop = asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        count = 0
        while not stop.done():
            item = await store.dequeue_rollout()
            if item is not None:
                await store.update_attempt(item.rollout_id, item.attempt.attempt_id, status="succeeded")
                count += 1
        print(count)

    asyncio.run(main())


def health_while_dequeuing(directory: str) -> tuple[list[float], int]:
    """Health-check latencies (s) while `QUEUE_CLIENTS` clients claim and complete rollouts from
    `directory`/bench.db over HTTP, and how many they completed."""
    import httpx

    server, url, _ = start_server(directory)
    try:
        clients = [child("--child-dequeuer", url) for _ in range(QUEUE_CLIENTS)]
        time.sleep(1.0)
        health = []
        began = time.perf_counter()
        with httpx.Client() as client:
            while time.perf_counter() - began < 4:
                started = time.perf_counter()
                assert client.get(url + "/api/health").status_code == 200
                health.append(time.perf_counter() - started)
                time.sleep(0.02)
        done = sum(int(process.communicate("", timeout=60)[0].split()[-1]) for process in clients)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return health, done


def queue_rows() -> None:
    for count in QUEUE_SIZES:
        with tempfile.TemporaryDirectory(prefix="store-bench-") as directory:
            path = Path(directory) / "bench.db"
            fill_queue(path, count + 10_000)  # room for what the clients below take
            print(f"dequeue with {count:>7,} queued: {dequeue_ms(path):.3f} ms p50 (in process, SQLite)")
            health, done = health_while_dequeuing(directory)
            print(f"  health check while {QUEUE_CLIENTS} clients dequeue over HTTP: {1000 * statistics.median(health):.1f} ms "
                  f"p50, {1000 * percentile(health, 99):.1f} ms p99 ({done:,} rollouts claimed and completed, "
                  f"{os.cpu_count()} CPUs for server and clients)")


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def summary(
    name: str,
    layout: str,
    count: int,
    seconds: float,
    results: list[dict[str, Any]],
    rss: float,
    server_rss: float | None,
    server_cpu: float | None,
) -> dict[str, Any]:
    dequeue = [x for r in results for x in r["dequeue"]]
    writes = [x for r in results for x in r["span_writes"]]
    return {
        "setup": name,
        "workers": layout,
        "rollouts/s": count / seconds,
        "spans/s": count * SPANS_PER_ROLLOUT / seconds,
        "dequeue p50/p99 ms": (1000 * percentile(dequeue, 50), 1000 * percentile(dequeue, 99)),
        "span write p50/p99 ms": (1000 * percentile(writes, 50), 1000 * percentile(writes, 99)),
        "peak RSS MB": (server_rss, rss),
        "CPU ms/rollout": (None if server_cpu is None else 1000 * server_cpu / count,
                           1000 * sum(r["cpu"] for r in results) / count),
    }


def their_figure(row: dict[str, Any], measured: float | None) -> str:
    """Agent Lightning 0.3's rate on the same setup, measured in this run (its environment present), else nothing."""
    if row["workers"] != "1×16" or row["setup"] == AGL_ROW:
        return "-"
    if measured is not None and row["setup"] == "HTTP, SQLite server, spans one by one":
        return f"{measured:,.1f} (measured)"
    return "-"


def pair(values: tuple[float | None, float], form: str) -> str:
    server, client = values
    return f"{'-' if server is None else form.format(server)} / {form.format(client)}"


def import_seconds(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout) for _ in range(5)]
    return min(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=ROLLOUTS)
    parser.add_argument("--only", choices=["memory", "sqlite", "http", "queue", "postgres"], help="run one kind of setup")
    parser.add_argument("--postgres", metavar="URL", help="--only postgres: an existing PostgreSQL database to use "
                        "(its schemas bench1 and bench4 must exist) instead of a throwaway server")
    parser.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--single-spans", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-in-process", help=argparse.SUPPRESS)
    parser.add_argument("--child-client", help=argparse.SUPPRESS)
    parser.add_argument("--agentlightning", type=Path, default=AGL_PYTHON, metavar="PYTHON",
                        help="the Python of an environment with agentlightning 0.3, for the reference row (default: "
                             ".venv-agl/bin/python); the row is left out when it has none")
    parser.add_argument("--agl-rollouts", type=int, default=AGL_ROLLOUTS, help="rollouts of the reference row")
    parser.add_argument("--child-dequeuer", help=argparse.SUPPRESS)
    parser.add_argument("--child-agl-client", help=argparse.SUPPRESS)
    parser.add_argument("--child-agl-in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_dequeuer:
        return run_dequeuer(args.child_dequeuer)
    if args.only == "queue":
        return queue_rows()
    if args.child_in_process:
        return run_in_process(args.child_in_process, args.workers, args.rollouts, args.dir)
    if args.child_client:
        return run_client(args.child_client, args.workers, args.rollouts, args.single_spans)
    if args.child_agl_client:
        return run_agl_client(args.child_agl_client, args.workers, args.rollouts)
    if args.child_agl_in_process:
        return run_agl_in_process(args.workers, args.rollouts)

    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    began = time.perf_counter()
    rows, startups = [], []
    agl = agl_version(args.agentlightning) if args.only in (None, "memory", "http") else None
    for backend in ("memory", "sqlite"):
        if args.only in (None, backend):
            for workers in (1, 16):
                rows.append(in_process(backend, workers, args.rollouts))
                console.print(f"  {rows[-1]['setup']} ×{workers}: {rows[-1]['rollouts/s']:.0f} rollouts/s")
            if backend == "memory" and agl:  # right after ours, so both see the same machine
                rows.append(in_process(backend, 16, args.rollouts, agl_python=args.agentlightning))
                console.print(f"  {rows[-1]['setup']} (agentlightning {agl}) ×16: {rows[-1]['rollouts/s']:.0f} rollouts/s")
    if args.only == "postgres":
        rows += postgres_rows(args.rollouts, args.postgres)
        for row in rows:
            cpu = sum(row["CPU ms/rollout"]) + (row.get("database CPU ms/rollout") or 0)
            database = "" if row.get("database CPU ms/rollout") is None else (
                f" + PostgreSQL {row['database CPU ms/rollout']:.2f}")
            console.print(f"  {row['setup']} {row['workers']}: {row['rollouts/s']:.0f} rollouts/s; CPU a rollout: "
                          "server {:.2f} + clients {:.2f}".format(*row["CPU ms/rollout"]) + database
                          + f" = {cpu:.2f} ms, {cpu * row['rollouts/s'] / 1000:.2f} of {os.cpu_count()} CPUs busy")
        sqlite_rate, one, four = (row["rollouts/s"] for row in rows)
        console.print(f"  1 PostgreSQL server vs 1 SQLite server: {one / sqlite_rate:.2f}× (goal ≥ 0.7×); "
                      f"4 PostgreSQL servers vs 1: {four / one:.2f}× (goal ≥ 1.5×); load average "
                      f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.only in (None, "http"):
        for processes, workers, single in ((1, 16, False), (4, 8, False), (1, 16, True)):
            row, startup = over_http(processes, workers, args.rollouts, single)
            rows.append(row)
            startups.append(startup)
            console.print(f"  {row['setup']} {row['workers']}: {row['rollouts/s']:.0f} rollouts/s")
        if agl:  # right after our row of its workload, so both see the same machine
            row, agl_startup = over_http(1, 16, args.agl_rollouts, agl_python=args.agentlightning)
            rows.append(row)
            console.print(f"  {row['setup']} (agentlightning {agl}) {row['workers']}: {row['rollouts/s']:.0f} rollouts/s")
    if args.only in (None, "memory", "http") and not agl:
        console.print(f"  [dim]no Agent Lightning 0.3 at {args.agentlightning}: its rows and column are left out "
                      "(see --agentlightning)[/dim]")
    measured = next((row["rollouts/s"] for row in rows if row["setup"] == AGL_ROW), None)

    table = Table(title=f"Store lifecycle, {args.rollouts} rollouts × {SPANS_PER_ROLLOUT} spans ({os.cpu_count()} CPUs)")
    for column in ("setup", "workers", "rollouts/s", "Agent Lightning 0.3 rollouts/s", "spans/s", "dequeue p50/p99 ms",
                   "span writes p50/p99 ms", "peak RSS MB server/client", "CPU ms/rollout server/clients"):
        table.add_column(column, justify="left" if column == "setup" else "right")
    for row in rows:
        table.add_row(
            row["setup"], row["workers"], f"{row['rollouts/s']:,.0f}",
            their_figure(row, measured), f"{row['spans/s']:,.0f}",
            "{:.2f} / {:.2f}".format(*row["dequeue p50/p99 ms"]), "{:.2f} / {:.2f}".format(*row["span write p50/p99 ms"]),
            pair(row["peak RSS MB"], "{:.0f}"), pair(row["CPU ms/rollout"], "{:.2f}"),
        )
    console.print(table)
    if startups:
        console.print(f"server start-up (spawn to healthy): {1000 * min(startups):.0f} ms (best of {len(startups)})"
                      + (f"; Agent Lightning 0.3's: {agl_startup:.1f} s" if measured else ""))
    console.print(f"import agentgrad: {1000 * import_seconds('agentgrad'):.0f} ms; "
                  f"import agentgrad.store.client (a runner's): {1000 * import_seconds('agentgrad.store.client'):.0f} ms")
    best = {(row["setup"], row["workers"]): row["rollouts/s"] for row in rows}
    for label, ours, theirs in (
        ("memory ×16 vs Agent Lightning 0.3 in process ×16, both with batched spans",
         ("memory, in process", "16"), (AGL_IN_PROCESS_ROW, "16")),
        ("HTTP 1×16, spans one by one (its workload) vs its server", ("HTTP, SQLite server, spans one by one", "1×16"),
         (AGL_ROW, "1×16")),
    ):
        if ours in best and theirs in best:
            console.print(f"  {label}, measured just now: {best[ours] / best[theirs]:.1f}×")
    batched, single = best.get(("HTTP, SQLite server", "1×16")), best.get(("HTTP, SQLite server, spans one by one", "1×16"))
    if batched and single:
        console.print(f"  spans one by one, 1×16: {single / batched:.2f}× the batched row's rate (the issue asks ≥ 0.5×)")
    console.print(f"[dim]total {time.perf_counter() - began:.0f} s; the machine is shared, so figures move between runs[/dim]")


if __name__ == "__main__":
    main()
