"""What the gateway costs: latency it adds (p50/p99) over calling the same upstream directly,
requests/s at concurrency 1, 16 and 64, its CPU per call, and its start-up time.

Three processes, as in production: a fast local OpenAI-compatible upstream (a bare asyncio
server answering a canned vLLM-style chat completion with token ids and logprobs), the gateway
started with the real `agentgrad gateway` command recording into a SQLite store, and this
process as the load generator (keep-alive HTTP/1.1 connections, one per simulated client).

    .venv/bin/python benchmarks/gateway_bench.py [--seconds 3] [--store sqlite|memory]

On a small shared machine the figures move from run to run: run it twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONCURRENCY = (1, 16, 64)
WARMUP_REQUESTS = 300
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_CONTENT_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)

REQUEST_BODY = json.dumps(
    {
        "model": "policy",
        "messages": [
            {"role": "system", "content": "You are a careful calculator. Answer with 'Answer: <number>'."},
            {"role": "user", "content": "What is 37 + 45?"},
        ],
        "temperature": 1.0,
        "max_tokens": 32,
    }
).encode()


def canned_response() -> bytes:
    """A chat completion as vLLM or the agentgrad engine returns it when asked for token ids and logprobs."""
    tokens = [f"t{i}" for i in range(32)]
    body = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "policy",
            "system_fingerprint": "agentgrad-weights-v3",
            "prompt_token_ids": list(range(1000, 1120)),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "token_ids": list(range(2000, 2032)),
                    "message": {"role": "assistant", "content": "37 + 45 = 82, so the sum is eighty-two. Answer: 82"},
                    "logprobs": {
                        "content": [
                            {"token": t, "logprob": -0.125, "bytes": list(t.encode()), "top_logprobs": []}
                            for t in tokens
                        ]
                    },
                }
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": 32, "total_tokens": 152},
        }
    ).encode()
    head = (
        f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-agentgrad-model-version: 3\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


# ----------------------------------------------------------------------------- the upstream


class _UpstreamProtocol(asyncio.Protocol):
    response = canned_response()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            match = _CONTENT_LENGTH.search(self.buffer, 0, end)
            size = int(match.group(1)) if match else 0
            if len(self.buffer) < end + 4 + size:
                return
            self.buffer = self.buffer[end + 4 + size :]
            self.transport.write(self.response)  # type: ignore[attr-defined]


def serve_upstream(port: int) -> None:
    import uvloop

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_UpstreamProtocol, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


# ----------------------------------------------------------------------------- the load generator


async def _client(port: int, path: str, deadline: float, latencies: list[float], limit: int | None) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer agentgrad\r\ncontent-length: {len(REQUEST_BODY)}\r\n\r\n"
    ).encode() + REQUEST_BODY
    clock = time.perf_counter
    try:
        while clock() < deadline and (limit is None or len(latencies) < limit):
            start = clock()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            match = _CONTENT_LENGTH.search(head)
            body = await reader.readexactly(int(match.group(1)) if match else 0)
            if head[9:12] != b"200":
                raise RuntimeError(f"{path} answered {head[:12]!r}: {body[:300]!r}")
            latencies.append(clock() - start)
    finally:
        writer.close()


async def load(
    port: int, path: str, concurrency: int, seconds: float, limit: int | None = None
) -> tuple[list[float], float]:
    """Latencies of every request and the wall time, `concurrency` clients hammering `path`."""
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + seconds
    await asyncio.gather(*[_client(port, path, deadline, latencies, limit) for _ in range(concurrency)])
    return latencies, time.perf_counter() - start


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(port: int, path: str, process: subprocess.Popen[bytes], timeout: float = 30) -> float:
    """Seconds until `GET path` answers 200 (polling every 5 ms)."""
    start = time.perf_counter()
    request = f"GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n".encode()
    while time.perf_counter() - start < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(request)
                if sock.recv(64).startswith(b"HTTP/1.1 200"):
                    return time.perf_counter() - start
        except OSError:
            pass
        time.sleep(0.005)
    raise TimeoutError(f"nothing answered on port {port} within {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each measured run")
    parser.add_argument(
        "--store", choices=("sqlite", "memory"), default="sqlite", help="where the gateway records spans"
    )
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return

    import uvloop
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    up_port, gw_port = free_port(), free_port()
    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    store = str(workdir / "bench.db") if args.store == "sqlite" else "memory"
    route = "/v1/chat/completions"
    if args.store == "sqlite":  # record into a real attempt, as a runner's agent would
        from agentgrad.store import SqliteStore

        rollout = asyncio.run(SqliteStore(store).start_rollout("benchmark"))
        route = f"/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1/chat/completions"
    upstream = subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(up_port)])
    gateway = None
    try:
        wait_for_upstream = time.perf_counter()
        while True:  # the bare upstream has no GET route; wait for its port
            try:
                socket.create_connection(("127.0.0.1", up_port), timeout=1).close()
                break
            except OSError:
                if time.perf_counter() - wait_for_upstream > 30:
                    raise
                time.sleep(0.01)
        gateway = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentgrad.cli",
                "gateway",
                "--store",
                store,
                "--port",
                str(gw_port),
                "--backend",
                f"policy=http://127.0.0.1:{up_port}/v1,system=vllm",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(workdir / "gateway.log").open("wb"),
        )
        startup = wait_for(gw_port, "/v1/models", gateway)
        rows = []
        sent_through_gateway = 0
        for concurrency in CONCURRENCY:
            result = {}
            for target, port, path in (("direct", up_port, "/v1/chat/completions"), ("gateway", gw_port, route)):
                warm, _ = uvloop.run(load(port, path, concurrency, 30, limit=WARMUP_REQUESTS))
                cpu_before = cpu_seconds(gateway.pid)
                latencies, wall = uvloop.run(load(port, path, concurrency, args.seconds))
                cpu = cpu_seconds(gateway.pid) - cpu_before
                if target == "gateway":
                    sent_through_gateway += len(warm) + len(latencies)
                latencies.sort()
                result[target] = {
                    "p50": statistics.median(latencies) * 1000,
                    "p99": latencies[int(len(latencies) * 0.99) - 1] * 1000,
                    "rps": len(latencies) / wall,
                    "cpu_ms": cpu / len(latencies) * 1000,
                }
            rows.append((concurrency, result))
    finally:
        if gateway is not None:
            gateway.send_signal(signal.SIGINT)
            gateway.wait(60)
        upstream.terminate()
        upstream.wait(10)

    recorded = None
    if args.store == "sqlite":
        from agentgrad.store import SqliteStore

        recorded = asyncio.run(SqliteStore(store).stats()).spans
    table = Table(
        title=f"agentgrad gateway vs. calling the upstream directly ({args.seconds:g} s per run, store: {args.store})"
    )
    for column in (
        "clients",
        "direct p50 ms",
        "gateway p50 ms",
        "added p50 ms",
        "direct p99 ms",
        "gateway p99 ms",
        "added p99 ms",
        "direct req/s",
        "gateway req/s",
        "gateway CPU ms/call",
    ):
        table.add_column(column, justify="right")
    for concurrency, r in rows:
        d, g = r["direct"], r["gateway"]
        table.add_row(
            str(concurrency),
            f"{d['p50']:.3f}",
            f"{g['p50']:.3f}",
            f"{g['p50'] - d['p50']:.3f}",
            f"{d['p99']:.3f}",
            f"{g['p99']:.3f}",
            f"{g['p99'] - d['p99']:.3f}",
            f"{d['rps']:,.0f}",
            f"{g['rps']:,.0f}",
            f"{g['cpu_ms']:.3f}",
        )
    console.print(table)
    console.print(f"gateway start-up (spawn of `agentgrad gateway` to first answer): {startup:.2f} s")
    if recorded is not None:
        console.print(f"spans recorded in the SQLite store: {recorded:,} of {sent_through_gateway:,} calls")
    console.print(
        f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end "
        "(load generator, gateway and upstream share them)"
    )
    console.print("aim: well under 1 ms added at p50, over 1,000 req/s")


if __name__ == "__main__":
    main()
