"""Peak memory and time of one GRPO update of the tool demo's shape, by micro-batch size.

64 sequences of the demo's prompt (~276 tokens with the function tool, ~174 with `--demo tool`)
sharing its history, 40 response tokens each, one AdamW step; resident memory is sampled every
5 ms while the update runs. Run it in two checkouts to compare them.

    python benchmarks/update_memory.py --micro-batch 32
    python benchmarks/update_memory.py --micro-batch 8 [--demo tool]
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time

import torch

from agentgrad.adapters import Trajectory
from agentgrad.algorithms.grpo import GRPOConfig
from agentgrad.algorithms.grpo_update import grpo_update
from agentgrad.engine import Engine
from examples.calc_agent import CALCULATE_TOOL, build_messages

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """The process's resident memory before the block and its peak during it, sampled every 5 ms by a thread."""

    def __enter__(self) -> PeakRSS:
        self.before = self.peak = rss()
        self.running = True
        self.watcher = threading.Thread(target=self._sample, daemon=True)
        self.watcher.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, rss())
            time.sleep(0.005)

    def __exit__(self, *exc: object) -> None:
        self.running = False
        self.watcher.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--response", type=int, default=40)
    parser.add_argument("--demo", choices=["function", "tool"], default="function")
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = random.Random(0)
    engine = Engine()
    batch = []
    for i in range(args.sequences):
        question = f"What is {rng.randint(100, 999)} + {rng.randint(100, 999)}?"
        prompt = engine.chat_prompt_ids(build_messages(question, args.demo),
                                        tools=[CALCULATE_TOOL] if args.demo == "function" else None)
        response = [rng.randrange(1000, 20000) for _ in range(args.response)]
        batch.append((Trajectory(prompt + response, [0] * len(prompt) + [1] * len(response),
                                 [0.0] * len(prompt) + [-1.0] * len(response), len(prompt)), 1.0 if i % 2 else -1.0))
    optimizer = torch.optim.AdamW([p for p in engine.model.parameters() if p.requires_grad], lr=1e-5)
    config = GRPOConfig(micro_batch_size=args.micro_batch)
    with PeakRSS() as memory, engine.training() as model:
        began = time.perf_counter()
        grpo_update(model, optimizer, batch, config, engine.tokenizer.pad_token_id)
        seconds = time.perf_counter() - began
    before, peak = memory.before, memory.peak
    print(f"micro-batch {args.micro_batch}: {args.sequences} x ({len(batch[0][0].token_ids) - args.response} + {args.response}) "
          f"tokens, update {seconds:.1f} s, RSS {before / 2**30:.2f} GiB before, peak {peak / 2**30:.2f} GiB "
          f"(+{(peak - before) / 2**30:.2f})", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
