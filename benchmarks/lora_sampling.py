"""Sampling from a LoRA-adapted model on a CPU: through peft's layers against the packed twin with the adapter merged.

    .venv/bin/python benchmarks/lora_sampling.py [--model qwen2.5-coder-0.5b] [--rows 16] [--rounds 3]

The SQL demo's setting (`agentgrad demo --task sql`): fp32 weights, rank-16 LoRA on every linear projection.
"peft layers": the engine samples from the `PeftModel` itself (`Engine.replace_model(model)`, what every CPU LoRA
run did before): transformers' forward through peft's LoRA layers, plain fp32 products. "merged twin":
`Engine.replace_model(model, merge=True)` (what `Policy` asks for): a packed twin of the base with each adapter
merged into its packed copy (`prepack.packed_twin`), decoded by `LeanDecoder`. The adapters are random (not
zero), so the two are compared on real work: `rows` prompts of ~600 tokens (a SQL agent's schema and question),
64 new tokens each (`ignore_eos`), sampled at temperature 1; the best of `rounds` rounds, after one warm-up;
the time to make the twin again (what each `publish` adds) and the process's peak RSS beside them. Each
setting runs in a process of its own, so its RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

SETTINGS = {"peft layers": False, "merged twin": True}
PROMPT = "Write a SQLite query that answers: the number of flights per airline and month, " * 40


def measure(model: str, merge: bool, rows: int, rounds: int) -> dict[str, float]:
    """One setting, in this process: tokens per second, the publish's seconds, peak RSS."""
    import torch
    from peft import LoraConfig, get_peft_model

    from agentgrad.engine import Engine, SamplingParams
    from agentgrad.engine.threads import in_own_thread

    engine = Engine(model, sampling_dtype="float32")
    torch.manual_seed(0)
    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False)
    engine.replace_model(in_own_thread(get_peft_model, engine.model, config), merge=merge)
    prompt = engine.tokenizer(PROMPT)["input_ids"][:560]
    prompts = [prompt[: 540 + i] for i in range(rows)]
    params = SamplingParams(max_tokens=64, temperature=1.0, ignore_eos=True, seed=1)
    engine.generate(prompts[:2], params)
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        engine.generate(prompts, params)
        best = min(best, time.perf_counter() - began)
    began = time.perf_counter()
    engine.publish()
    publish = time.perf_counter() - began
    engine.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return {"tok_s": rows * 64 / best, "seconds": best, "publish": publish, "rss_gb": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=list(SETTINGS), help=argparse.SUPPRESS)  # a child process: one setting
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.model, SETTINGS[args.one], args.rows, args.rounds)))
        return
    results = {}
    for name in SETTINGS:
        command = [sys.executable, __file__, "--one", name, "--model", args.model]
        command += ["--rows", str(args.rows), "--rounds", str(args.rounds)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    table = Table(title=f"LoRA sampling on the CPU: {args.model}, rank 16, fp32, {args.rows} rows x ~550 + 64 tokens")
    for column in ("setting", "tok/s", "round s", "publish s", "peak RSS GB"):
        table.add_column(column, justify="left" if column == "setting" else "right")
    for name, r in results.items():
        table.add_row(name, f"{r['tok_s']:.1f}", f"{r['seconds']:.1f}", f"{r['publish']:.2f}", f"{r['rss_gb']:.1f}")
    console = Console()
    console.print(table)
    ratio = results["merged twin"]["tok_s"] / results["peft layers"]["tok_s"]
    console.print(f"merged twin / peft layers: {ratio:.2f}x tokens per second")


if __name__ == "__main__":
    main()
