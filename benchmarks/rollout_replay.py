"""The built-in engine alone under a GRPO rollout phase's pattern: where the engine's time goes, without agents.

    .venv/bin/python benchmarks/rollout_replay.py [--model smollm2-135m] [--tasks 8] [--group 8] [--phases 5]

Each phase runs `tasks × group` rollouts of two turns at once, as the demo's calc agent does, on tasks of its
own (a GRPO step's): the first turn is the demo's prompt (system prompt, examples, the calculator tool, a
question); when it finishes, the second
turn is that prompt, the completion and a tool result, so it starts with the first turn's tokens (a prefix
cache hit) and joins the running batch while others are still decoding. Sampling is the demo's (T=1, 48
tokens), seeded per rollout, so a phase's tokens are the same from run to run where the engine is exact. No
HTTP, gateway or agent code runs: `benchmarks/vllm_policy.py` times the whole phase against vLLM; this one
splits the engine's side into prefills, decode steps, joins (`kv_cache.restack`) and drops of finished rows,
to compare two commits on a quiet machine (run it at each).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agentgrad.engine.engine as engine_module
from agentgrad.engine import Engine, SamplingParams
from examples.calc_agent import CALCULATE_TOOL, build_messages, make_splits

TOOL_RESULT = "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


def timed(owner: Any, name: str, totals: dict[str, list[float]]) -> None:
    """Count the calls of `owner.name` and their seconds into `totals[name]`."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[name][0] += 1
            totals[name][1] += time.perf_counter() - began

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--phases", type=int, default=5, help="the first is a warm-up, not in the median")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    engine = Engine(args.model)
    train, _ = make_splits(n_train=args.tasks * args.phases, n_val=1, demo="function")
    prompts = [
        engine.chat_prompt_ids(build_messages(task["question"], "function"), tools=[CALCULATE_TOOL])
        for task in train
        for _ in range(args.group)
    ]
    per_phase = args.tasks * args.group
    tool_result = engine.tokenizer.encode(TOOL_RESULT, add_special_tokens=False)
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name in ("_prefill", "_decode", "_drop_finished"):
        timed(engine, name, totals)
    timed(engine_module, "restack", totals)

    def rollout(index: int) -> int:
        first = engine.submit(prompts[index], SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=index))
        completion = first.result().completions[0].token_ids
        second = engine.submit(
            prompts[index] + completion + tool_result,
            SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=len(prompts) + index),
        )
        return len(completion) + len(second.result().completions[0].token_ids)

    seconds = []
    print(f"{args.model}: {per_phase} rollouts × 2 turns a phase, {os.cpu_count()} cores")
    with concurrent.futures.ThreadPoolExecutor(per_phase) as pool:
        for phase in range(args.phases):
            totals.clear()
            began = time.perf_counter()
            tokens = sum(pool.map(rollout, range(phase * per_phase, (phase + 1) * per_phase)))
            seconds.append(time.perf_counter() - began)
            split = ", ".join(
                f"{name.strip('_')} {calls:.0f}× {spent:.2f} s" for name, (calls, spent) in totals.items()
            )
            print(
                f"phase {phase}: {seconds[-1]:.2f} s, {tokens} tokens ({tokens / seconds[-1]:.0f} tok/s), "
                f"load {os.getloadavg()[0]:.1f}: {split}",
                flush=True,
            )
    engine.close()
    print(f"median phase after the warm-up: {statistics.median(seconds[1:]):.2f} s")


if __name__ == "__main__":
    main()
