"""Does SFT on demonstrations alone move the SQL agent? The base Qwen2.5-Coder-0.5B and the same model after one
pass over `recovery.demonstration_mix` (100 fixes of the five trap kinds, 80 of the two join kinds, 60 chats that
start right), each evaluated greedily through the real agent on the SQL demo's validation questions (60 of the
project's held-out databases, 60 of the real-world ones): accuracy, failed-first share, self-corrected share, side
by side, with the training's time and the process's peak RSS.

The training step is the warm start's with `frozen_context` (`nll.sft_update`, as `--sql-warm-start` runs it):
each chat's context (everything before its first taught token) runs under no_grad into a KV cache and only the rest
is back-propagated, 2.4x faster than the full step on these ~550-token chats.

    .venv/bin/python benchmarks/sql_sft_probe.py                   # ~25 min of SFT, two evaluations of ~6-9 min
    .venv/bin/python benchmarks/sql_sft_probe.py --skip-base       # the trained model only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import agentgrad as ag  # noqa: E402
from agentgrad.algorithms.baseline import Baseline  # noqa: E402
from agentgrad.algorithms.demonstrations import to_trajectories  # noqa: E402
from agentgrad.algorithms.nll import Kept, sft_update  # noqa: E402
from agentgrad.cli import sql_demo  # noqa: E402
from agentgrad.engine import Engine  # noqa: E402
from agentgrad.engine.model import load_model  # noqa: E402
from agentgrad.policy.local import LocalPolicy  # noqa: E402
from agentgrad.store import open_store  # noqa: E402
from examples.sql import db, recovery  # noqa: E402
from examples.sql.train import sql_rollout  # noqa: E402

MODEL = "qwen2.5-coder-0.5b"
LORA_RANK, LORA_ALPHA, LEARNING_RATE, BATCH_SIZE, MAX_GRAD_NORM = 16, 32, 2e-4, 8, 1.0


def fine_tune(out: Path) -> dict[str, float]:
    """One pass over the mix, LoRA on every linear layer, merged and saved to `out`."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model, tokenizer = load_model(MODEL)
    data = Kept(to_trajectories(recovery.demonstration_mix(db.load_questions("train")), tokenizer), "0/warm-start")
    lora = LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules="all-linear", lora_dropout=0.0)
    peft_model = get_peft_model(model, lora)
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=LEARNING_RATE,
                                  weight_decay=0.0)
    peft_model.train()
    began, losses = time.perf_counter(), []
    for i, batch in enumerate(data.batches(1, BATCH_SIZE)):
        losses.append(sft_update(peft_model, optimizer, batch, MAX_GRAD_NORM, frozen_context=True))
        print(f"  batch {i}: loss {losses[-1]:.3f} ({time.perf_counter() - began:.0f} s)", flush=True)
    peft_model.merge_and_unload().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"seconds": time.perf_counter() - began, "chats": len(data.trajectories),
            "taught tokens": sum(t.response_length for t in data.trajectories), "last loss": losses[-1]}


def evaluate(model: str | Path, store_path: Path) -> list[Any]:
    """Greedy, through the real agent, on the demo's 120 validation questions: the demo's curve points."""
    _, val = sql_demo.task_lists(db, True, 60)
    engine = Engine(str(model), sampling_dtype="float32", name=MODEL)
    store = open_store(str(store_path))
    with LocalPolicy(store, engine=engine) as policy:
        llm = policy.llm(temperature=0.0, max_tokens=sql_demo.MAX_TOKENS)
        trainer = ag.Trainer(Baseline(rollout_timeout=sql_demo.ROLLOUT_TIMEOUT, val_size=1000), n_runners=2,
                             runner_concurrency=sql_demo.RUNNER_CONCURRENCY, store=store, resources={"llm": llm})
        trainer.fit(sql_rollout, [], val)
    return asyncio.run(sql_demo.learning_curve(store, set(db.real_world_names()).__contains__))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-base", action="store_true", help="evaluate the trained model only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sql-sft-probe-") as folder:
        here = Path(folder)
        if not args.skip_base:
            began = time.perf_counter()
            sql_demo.console.print(sql_demo.curve_table(evaluate(MODEL, here / "base.db"), f"{MODEL}, untrained"))
            print(f"evaluated in {(time.perf_counter() - began) / 60:.1f} min", flush=True)
        stats = fine_tune(here / "model")
        print(", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items()), flush=True)
        began = time.perf_counter()
        points = evaluate(here / "model", here / "trained.db")
        sql_demo.console.print(sql_demo.curve_table(points, f"{MODEL} after SFT on the demonstration mix"))
        print(f"evaluated in {(time.perf_counter() - began) / 60:.1f} min", flush=True)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GB; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
