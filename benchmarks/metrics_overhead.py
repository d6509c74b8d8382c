"""What the gateway's Prometheus metrics cost per call: its CPU per proxied call with the counting on and off.

The gateway runs in this process and is called as an ASGI app (no HTTP server in front: its parsing would only
add to both sides, so the share measured here is an upper bound of what a served gateway pays); its upstream is
`gateway_bench.py`'s bare canned-answer server in another process, its store SQLite as in production. Rounds
alternate on and off, and the figure is this process's CPU time, which other processes on a shared machine
disturb far less than wall time (gateway_bench.py's req/s moved ±50% between identical runs at load 7).
"Off" skips exactly what the metrics add: the HTTP request count and latency (`metrics.counted`) and the
gateway's per-call counts (`GatewayMetrics.record`).

    .venv/bin/python benchmarks/metrics_overhead.py [--calls 2000] [--rounds 8] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_bench import REQUEST_BODY, free_port


async def call(app: object, path: str, headers: list[tuple[bytes, bytes]]) -> None:
    delivered = False
    hang_up = asyncio.Event()

    async def receive() -> dict[str, object]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": REQUEST_BODY, "more_body": False}
        await hang_up.wait()
        return {"type": "http.disconnect"}

    status = 0

    async def send(message: dict[str, object]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])  # type: ignore[call-overload]

    scope = {"type": "http", "method": "POST", "path": path, "root_path": "", "query_string": b"", "headers": headers}
    await app(scope, receive, send)  # type: ignore[operator]
    if status != 200:
        raise RuntimeError(f"the gateway answered {status}")


async def measure(calls: int, rounds: int, concurrency: int, upstream: str, store_path: str) -> dict[str, list[float]]:
    from agentgrad.gateway import Backend, Gateway
    from agentgrad.store import SqliteStore

    store = SqliteStore(store_path)
    started = await store.start_rollout("bench")
    gateway = Gateway(store, {"policy": Backend(upstream, system="vllm")})
    await gateway.start()
    path = f"/rollouts/{started.rollout_id}/attempts/{started.attempt.attempt_id}/v1/chat/completions"
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    recorder = gateway._recording

    async def batch(count: int) -> None:
        queue = list(range(count))

        async def client() -> None:
            while queue:
                queue.pop()
                await call(gateway, path, headers)

        await asyncio.gather(*(client() for _ in range(concurrency)))
        await gateway.flush()

    await batch(calls // 4)  # warm up: connections, caches
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(rounds):
        for mode in ("off", "on"):
            gateway._count_http = mode == "on"
            recorder.metrics = gateway.counts if mode == "on" else None
            before = time.process_time()
            await batch(calls)
            cpu[mode].append((time.process_time() - before) / calls * 1e6)
    await gateway.aclose()
    await store.close()
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and mode")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    import uvloop

    port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "gateway_bench.py"), "--serve-upstream", str(port)]
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        with tempfile.TemporaryDirectory() as folder:
            cpu = uvloop.run(
                measure(args.calls, args.rounds, args.concurrency, f"http://127.0.0.1:{port}/v1", f"{folder}/bench.db")
            )
    finally:
        upstream.terminate()
        upstream.wait(10)
    on, off = statistics.median(cpu["on"]), statistics.median(cpu["off"])
    print(
        f"gateway CPU per proxied call, median of {args.rounds} alternating rounds of {args.calls} calls "
        f"({args.concurrency} at a time, SQLite store):"
    )
    print(f"  metrics off: {off:7.1f} µs   rounds: {', '.join(f'{v:.0f}' for v in cpu['off'])}")
    print(f"  metrics on:  {on:7.1f} µs   rounds: {', '.join(f'{v:.0f}' for v in cpu['on'])}")
    print(f"  overhead: {on - off:+.1f} µs/call = {(on - off) / off:+.1%} of the gateway's CPU (goal: at most 2%)")
    print(f"load average {os.getloadavg()[0]:.2f} (2 shared cores)")


if __name__ == "__main__":
    main()
