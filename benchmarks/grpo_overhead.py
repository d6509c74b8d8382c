"""What the framework costs a GRPO step: the calc agent's rollouts through runners → gateway → engine,
against the bare engine generating the same prompts with the same sampling.

    .venv/bin/python benchmarks/grpo_overhead.py [--steps 3] [--prompts 8] [--group 8]

Both paths use the same engine and weights; the bare path calls `engine.generate` directly (no
store, runner, HTTP, gateway or span). The difference per step is the framework's overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agentgrad as ag  # noqa: E402
from agentgrad.policy.local import LocalPolicy  # noqa: E402
from agentgrad.engine import Engine, SamplingParams  # noqa: E402
from examples.calc_agent import build_messages, calc_agent, make_splits  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    args = parser.parse_args()
    train, _ = make_splits(n_train=args.steps * args.prompts, n_val=1)
    engine = Engine()
    sampling = {"temperature": 1.0, "max_tokens": 48}
    store = ag.MemoryStore()
    framework, bare, tokens = [], [], []
    with LocalPolicy(store, engine) as policy:
        trainer = ag.Trainer(store=store, n_runners=4, runner_concurrency=16, resources={"llm": policy.llm(**sampling)})
        engine.generate([engine.chat_prompt_ids(build_messages("What is 1 + 1?"))], SamplingParams(max_tokens=4))
        for step in range(args.steps):
            tasks = train[step * args.prompts : (step + 1) * args.prompts]
            batch = [t for t in tasks for _ in range(args.group)]
            began = time.perf_counter()
            trainer.fit(calc_agent, batch)
            framework.append(time.perf_counter() - began)
            prompts = [engine.chat_prompt_ids(build_messages(t["question"])) for t in batch]
            began = time.perf_counter()
            generations = engine.generate(prompts, SamplingParams(max_tokens=48, temperature=1.0))
            bare.append(time.perf_counter() - began)
            tokens.append(sum(len(g.completions[0].token_ids) for g in generations))
    spans = asyncio.run(store.stats()).spans
    table = Table(title=f"one GRPO step's rollouts: {args.prompts} tasks × {args.group}, calc agent, {engine.device}")
    for column in ("path", "seconds per step (median)", "per rollout ms"):
        table.add_column(column, justify="right")
    rollouts = args.prompts * args.group
    table.add_row("bare engine.generate", f"{statistics.median(bare):.2f}", f"{1000 * statistics.median(bare) / rollouts:.1f}")
    table.add_row("runner → gateway → engine", f"{statistics.median(framework):.2f}",
                  f"{1000 * statistics.median(framework) / rollouts:.1f}")
    Console().print(table)
    Console().print(f"overhead per step: {statistics.median(framework) - statistics.median(bare):+.2f} s; "
                    f"~{statistics.mean(tokens) / rollouts:.1f} tokens per answer; {spans} spans recorded")


if __name__ == "__main__":
    main()
