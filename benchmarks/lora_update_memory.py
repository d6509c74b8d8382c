"""Peak memory of one LoRA GRPO update of Qwen2.5-Coder-0.5B on the SQL agent's prompts (issue 21, item 4).

The full shape: 8 tasks x 8 rollouts, each prompt the SQL agent's (system prompt with a training database's
schema, the run_sql tool, the question: ~400 tokens), `--response` sampled tokens each (random ids here:
memory does not depend on which), LoRA rank 16 on every linear projection (attention and MLP), gradient
checkpointing, micro-batches of `--micro-batch` sequences (one task's group each), one AdamW step through
`LocalUpdate`, as GRPO runs it. Resident memory is sampled every 5 ms while the update runs.

On 2 shared CPU cores the full 64-sequence update takes long; `--micro-batches N` runs only the first N
micro-batches, to show that the peak does not grow with their number (the gradients accumulate in the
adapters; each micro-batch's activations are freed before the next):

    python benchmarks/lora_update_memory.py                                  # 8 x 8, micro-batches of 8
    python benchmarks/lora_update_memory.py --micro-batch 2 --micro-batches 1   # then 2, then 4
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from agentgrad.adapters import Trajectory
from agentgrad.algorithms.grpo import GRPOConfig
from agentgrad.algorithms.grpo_update import LocalUpdate
from agentgrad.engine import Engine
from agentgrad.policy.config import PolicyConfig
from agentgrad.policy.local import LocalPolicy
from agentgrad.store import MemoryStore
from benchmarks.update_memory import PeakRSS
from examples.sql import agent, db

RUN_SQL = {"type": "function", "function": {
    "name": "run_sql", "description": "Run one SQLite query on the database and return its rows, or the error.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=8, help="rollouts per task")
    parser.add_argument("--response", type=int, default=64, help="sampled tokens per rollout")
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward")
    parser.add_argument("--micro-batches", type=int, help="run only the first N micro-batches (default: all)")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--no-checkpointing", action="store_true", help="keep every layer's activations")
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = random.Random(0)
    engine = Engine(args.model, sampling_dtype="float32", device="cpu")
    policy = LocalPolicy(MemoryStore(), engine, lora_rank=args.lora_rank)  # LoRA on every linear projection
    questions = db.load_questions("train")
    tasks = [questions[i * len(questions) // args.tasks] for i in range(args.tasks)]
    batch: list[tuple[Trajectory, float]] = []
    for task in tasks:
        messages = [{"role": "system", "content": agent.INSTRUCTIONS.format(schema=db.schema(task["db"]))},
                    {"role": "user", "content": task["question"]}]
        prompt = engine.chat_prompt_ids(messages, tools=[RUN_SQL])
        for i in range(args.group):
            response = [rng.randrange(1000, 100000) for _ in range(args.response)]
            batch.append((Trajectory(prompt + response, [0] * len(prompt) + [1] * len(response),
                                     [0.0] * len(prompt) + [-2.0] * len(response), len(prompt)),
                          1.0 if i % 2 else -1.0))
    if args.micro_batches:
        batch = batch[: args.micro_batches * args.micro_batch]
    config = GRPOConfig(micro_batch_size=args.micro_batch, gradient_checkpointing=not args.no_checkpointing,
                        policy=PolicyConfig(lora_rank=args.lora_rank))
    update = LocalUpdate(policy, config)
    trainable = sum(p.numel() for p in policy.trainable_parameters())
    prompts = sorted({t.prompt_length for t, _ in batch})
    with PeakRSS() as memory:
        began = time.perf_counter()
        update.step(batch)
        seconds = time.perf_counter() - began
    before, peak = memory.before, memory.peak
    micro_batches = -(-len(batch) // args.micro_batch)
    print(f"{len(batch)} sequences ({micro_batches} micro-batches of {args.micro_batch}), prompts "
          f"{prompts[0]}-{prompts[-1]} + {args.response} tokens, LoRA r{args.lora_rank} ({trainable / 1e6:.1f}M "
          f"trainable), checkpointing {'off' if args.no_checkpointing else 'on'}: update {seconds:.0f} s, "
          f"RSS {before / 2**30:.2f} GiB before, peak {peak / 2**30:.2f} GiB (+{(peak - before) / 2**30:.2f})",
          flush=True)
    engine.close()


if __name__ == "__main__":
    main()
