"""The real Prometheus scraping the store server, the gateway and the engine while agents work: does every metric
docs/operations.md lists move?

Four processes beside this one, on loopback: `agentgrad serve` (the store), `agentgrad gateway` (a 50/50 A/B split
of the engine, and an upstream that is down), `agentgrad engine serve` (SmolLM2, the demo's model) and
`prometheus` (Debian's package: `make prometheus`) scraping the three every second with the token. This process
plays the runners and the algorithm: it enqueues rollouts, claims them, has each call the gateway under its
attempt, ends them with a reward, lets some time out, and logs training curves; then it asks Prometheus for
each metric's first and last value and prints them, with a sample of each server's `/metrics` written to --out.

    .venv/bin/python benchmarks/metrics_scrape.py [--seconds 40] [--port 22100] [--out /tmp/agentgrad-metrics]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import httpx

TOKEN = "metrics-scrape-token"
WATCHED = [
    # (PromQL, what it shows)
    ('agentgrad_http_requests_total{server="store"}', "store: requests"),
    ('agentgrad_http_requests_total{server="gateway"}', "gateway: requests"),
    ('agentgrad_http_requests_total{server="engine"}', "engine: requests"),
    ('agentgrad_http_request_duration_seconds_count{server="store"}', "store: latency histogram"),
    ("agentgrad_store_queue_depth", "store: queue depth"),
    ("agentgrad_store_attempts_running", "store: attempts running"),
    ('agentgrad_store_attempts_ended_total{status="timeout"}', "store: attempts timed out"),
    ('agentgrad_store_attempts_ended_total{status="succeeded"}', "store: attempts succeeded"),
    ('agentgrad_store_attempts_ended_total{status="unresponsive"}', "store: attempts unresponsive"),
    ("agentgrad_store_requeues_total", "store: requeues"),
    ('agentgrad_run_step{run="scrape"}', "training: step"),
    ('agentgrad_run_metric{name="train/reward_mean"}', "training: reward"),
    ('agentgrad_run_metric{name="train/loss"}', "training: loss"),
    ('agentgrad_gateway_calls_total{status="200"}', "gateway: calls"),
    ('agentgrad_gateway_tokens_total{kind="output"}', "gateway: output tokens"),
    ('agentgrad_gateway_errors_total{upstream="down"}', "gateway: errors (upstream down)"),
    ('agentgrad_gateway_retries_total{upstream="down"}', "gateway: retries"),
    ('agentgrad_gateway_deadlines_total{upstream="slow"}', "gateway: deadlines hit"),
    ('agentgrad_gateway_ab_calls_total{arm="a"}', "gateway: A/B arm a"),
    ('agentgrad_gateway_ab_calls_total{arm="b"}', "gateway: A/B arm b"),
    ("agentgrad_gateway_calls_in_flight", "gateway: calls in flight"),
    ("agentgrad_engine_generated_tokens_total", "engine: tokens generated"),
    ("rate(agentgrad_engine_generated_tokens_total[5s])", "engine: tokens/s"),
    ("agentgrad_engine_batch_rows", "engine: batch rows"),
    ("agentgrad_engine_decode_rows_total / agentgrad_engine_decode_steps_total", "engine: mean batch size"),
    ("agentgrad_engine_kv_cache_bytes", "engine: KV cache bytes"),
    ("agentgrad_engine_prefix_cache_bytes", "engine: prefix cache bytes"),
    ("agentgrad_engine_prefix_cache_tokens_total", "engine: prefix cache tokens"),
    ('process_resident_memory_bytes{job="engine"}', "engine: resident memory"),
    ('process_resident_memory_bytes{job="gateway"}', "gateway: resident memory"),
]
AGENT_CALLS = 2
SYSTEM = "You are a careful calculator. Answer with 'Answer: <number>'. " * 3


def start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "AGENTGRAD_TOKEN": TOKEN}
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}")
        try:
            if httpx.get(url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout:g} s")


async def work(store_url: str, gateway_url: str, seconds: float) -> int:
    """Runners and an algorithm: rollouts claimed, calls through the gateway, rewards, time-outs, curves."""
    from agentgrad.store import StoreError
    from agentgrad.store.client import StoreClient
    from agentgrad.types import Metric, RolloutConfig

    store = StoreClient(store_url, token=TOKEN)
    headers = {"authorization": f"Bearer {TOKEN}"}
    deadline, step, calls = time.monotonic() + seconds, 0, 0
    async with httpx.AsyncClient(base_url=gateway_url, headers=headers, timeout=600) as gateway:
        running: dict[str, str] = {}  # attempt -> rollout, for the heartbeats

        async def heartbeats() -> None:
            while time.monotonic() < deadline:
                await store.heartbeat("scrape", active_attempts=[(r, a) for a, r in running.items()])
                await asyncio.sleep(2)

        async def runner() -> None:
            nonlocal calls
            while time.monotonic() < deadline:
                claimed = await store.dequeue_rollout(worker_id="scrape")
                if claimed is None:
                    await asyncio.sleep(0.2)
                    continue
                if claimed.input.get("hang"):
                    continue  # never ends it: the store times it out and requeues it
                running[claimed.attempt.attempt_id] = claimed.rollout_id
                route = f"/rollouts/{claimed.rollout_id}/attempts/{claimed.attempt.attempt_id}/v1/chat/completions"
                messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": claimed.input["q"]}]
                for _ in range(AGENT_CALLS):
                    answer = await gateway.post(route, json={"model": "policy", "messages": messages, "max_tokens": 8})
                    calls += 1
                    messages += [answer.json()["choices"][0]["message"], {"role": "user", "content": "Sure?"}]
                try:
                    await store.update_attempt(
                        claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded", reward=1.0
                    )
                except StoreError:  # given up while the engine was busy: counted as unresponsive or timed out
                    pass
                running.pop(claimed.attempt.attempt_id, None)

        async def algorithm() -> None:
            nonlocal step
            quick = RolloutConfig(timeout_seconds=3, max_attempts=2)
            while time.monotonic() < deadline:
                await store.enqueue_rollout({"hang": True}, config=quick)  # first: claimed before the queue fills
                for i in range(6):
                    await store.enqueue_rollout({"q": f"What is {step}+{i}?"})
                hello = [{"role": "user", "content": "hi"}]
                await gateway.post("/v1/chat/completions", json={"model": "down", "messages": hello})
                await gateway.post("/v1/chat/completions", json={"model": "slow", "messages": hello})
                await store.add_metrics(
                    [
                        Metric(name="train/reward_mean", step=step, value=0.2 + 0.05 * step, run_id="scrape"),
                        Metric(name="train/loss", step=step, value=1.0 / (1 + step), run_id="scrape"),
                    ]
                )
                await store.check_attempts(force=True)
                step += 1
                await asyncio.sleep(4)

        await asyncio.gather(algorithm(), heartbeats(), *(runner() for _ in range(6)))
    await store.close()
    return calls


def query(prometheus: str, promql: str, at: float) -> float | None:
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": f"sum({promql})", "time": at}, timeout=10).json()
    result = answer["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=40.0, help="how long the agents work")
    parser.add_argument("--port", type=int, default=22100, help="first of five ports on loopback")
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="agentgrad-metrics-"), help="logs and samples")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store_port, gateway_port, engine_port, prometheus_port, slow_port = range(args.port, args.port + 5)
    cli = [sys.executable, "-m", "agentgrad.cli"]
    engine_url = f"http://127.0.0.1:{engine_port}"
    (out / "routes.toml").write_text(
        f'[upstreams.a]\nurl = "{engine_url}/v1"\nsystem = "agentgrad"\nmodel = "smollm2-135m"\nkey_env = "AGENTGRAD_TOKEN"\n\n'
        f'[upstreams.b]\nurl = "{engine_url}/v1"\nsystem = "agentgrad"\nmodel = "smollm2-135m"\nkey_env = "AGENTGRAD_TOKEN"\n\n'
        f'[upstreams.down]\nurl = "http://127.0.0.1:9/v1"\nmodels = ["down"]\nmax_retries = 2\n\n'
        f'[upstreams.slow]\nurl = "http://127.0.0.1:{slow_port}/v1"\nmodels = ["slow"]\ntimeout_s = 0.5\n\n'
        '[ab.policy]\narms = ["a", "b"]\n'
    )
    (out / "token").write_text(TOKEN)
    targets = {"store": store_port, "gateway": gateway_port, "engine": engine_port}
    jobs = "".join(
        f"  - job_name: {job}\n    authorization: {{credentials_file: {out / 'token'}}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
        for job, port in targets.items()
    )
    (out / "prometheus.yml").write_text(f"global: {{scrape_interval: 1s}}\nscrape_configs:\n{jobs}")
    import socket

    slow = socket.socket()  # accepts connections and never answers: the gateway's deadline cuts the call
    slow.bind(("127.0.0.1", slow_port))
    slow.listen(64)
    processes = []
    try:
        processes.append(
            start([*cli, "engine", "serve", "--port", str(engine_port), "--max-batch-size", "16"], out / "engine.log")
        )
        processes.append(
            start([*cli, "serve", "--store", str(out / "store.db"), "--port", str(store_port)], out / "store.log")
        )
        wait_ready(f"http://127.0.0.1:{store_port}/api/health", processes[1])
        processes.append(
            start(
                [
                    *cli,
                    "gateway",
                    "--store",
                    f"http://127.0.0.1:{store_port}",
                    "--routes",
                    str(out / "routes.toml"),
                    "--port",
                    str(gateway_port),
                    "--retries",
                    "2",
                ],
                out / "gateway.log",
            )
        )
        wait_ready(f"http://127.0.0.1:{gateway_port}/health", processes[2])
        wait_ready(f"{engine_url}/health", processes[0])
        processes.append(
            start(
                [
                    "prometheus",
                    f"--config.file={out / 'prometheus.yml'}",
                    f"--storage.tsdb.path={out / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
                out / "prometheus.log",
            )
        )
        prometheus = f"http://127.0.0.1:{prometheus_port}"
        wait_ready(f"{prometheus}/-/ready", processes[3])
        deadline = time.monotonic() + 60
        while query(prometheus, "up", time.time()) != len(targets) and time.monotonic() < deadline:
            time.sleep(0.5)  # a first scrape of each, idle
        time.sleep(1)
        began = time.time()
        calls = asyncio.run(work(f"http://127.0.0.1:{store_port}", f"http://127.0.0.1:{gateway_port}", args.seconds))
        for job, port in targets.items():
            sample = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text
            (out / f"{job}.metrics.txt").write_text(sample)
        time.sleep(3)  # the last scrape
        ended = time.time()
        targets_up = httpx.get(f"{prometheus}/api/v1/targets").json()["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in targets_up}
        rows = []
        for promql, what in WATCHED:
            first, last = query(prometheus, promql, began), query(prometheus, promql, ended)
            peak = query(prometheus, f"max_over_time(({promql})[{int(ended - began) + 1}s:1s])", ended)
            rows.append((what, promql, first, last, peak))
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            process.wait(60)
        slow.close()

    print(
        f"\nPrometheus {subprocess.run(['prometheus', '--version'], capture_output=True, text=True).stdout.split()[2]} "
        f"scraping every 1 s; targets: {json.dumps(health)}; {calls} agent calls in {args.seconds:g} s"
    )
    print(f"{'metric':<36} {'at start':>12} {'at end':>12} {'peak':>12}  moved")
    for what, _, first, last, peak in rows:
        shown = [("-" if v is None else f"{v:,.2f}") for v in (first, last, peak)]
        moved = peak is not None and (first is None or peak != first or (last is not None and last != first))
        print(f"{what:<36} {shown[0]:>12} {shown[1]:>12} {shown[2]:>12}  {'yes' if moved else 'NO'}")
    print(f"samples of each server's /metrics: {out}/{{store,gateway,engine}}.metrics.txt")
    print(f"load average {os.getloadavg()[0]:.2f} (2 shared cores: the engine, Prometheus and the agents share them)")
    print(urllib.parse.unquote(f"{prometheus}/graph"), "(stopped now)")


if __name__ == "__main__":
    main()
