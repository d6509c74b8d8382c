"""Does SFT on demonstrations alone move the SQL agent? The base Qwen2.5-Coder-0.5B and the same model after one
pass over `recovery.demonstration_mix` (100 fixes of the five trap kinds, 80 of the two join kinds, 60 chats that
start right), each evaluated greedily through the real agent on the SQL demo's validation questions (60 of the
project's held-out databases, 60 of the real-world ones): accuracy, failed-first share, self-corrected share, side
by side, with the training's time and the process's peak RSS.

The training step runs each chat's context (everything before its first taught token) under no_grad into a KV
cache and back-propagates through the rest only: no gradient reaches the context's keys and values through the
LoRA weights, where the loop's warm start (`demonstrations.warm_start`, SFT's `nll.sft_update`) sends it there
too, at 2.4x the time on these ~550-token chats (36 min for 158 of them in the demo). This probe measures what the
data does in the time a demo can spend; whether the full step does better is not measured here.

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
from agentgrad.adapters import Trajectory  # noqa: E402
from agentgrad.algorithms.baseline import Baseline  # noqa: E402
from agentgrad.algorithms.demonstrations import to_trajectories  # noqa: E402
from agentgrad.algorithms.nll import Kept  # noqa: E402
from agentgrad.cli import sql_demo  # noqa: E402
from agentgrad.engine import Engine  # noqa: E402
from agentgrad.engine.model import load_model  # noqa: E402
from agentgrad.policy.local import LocalPolicy  # noqa: E402
from agentgrad.store import open_store  # noqa: E402
from examples.sql import db, recovery  # noqa: E402
from examples.sql.train import sql_rollout  # noqa: E402

MODEL = "qwen2.5-coder-0.5b"
LORA_RANK, LORA_ALPHA, LEARNING_RATE, BATCH_SIZE, MAX_GRAD_NORM = 16, 32, 2e-4, 8, 1.0


def context_cached_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: list[Trajectory]) -> float:
    """One AdamW step on the mean NLL of the batch's taught tokens, each chat's context run under no_grad."""
    from transformers import DynamicCache

    tokens = sum(sum(t.loss_mask) for t in batch)
    total = 0.0
    optimizer.zero_grad(set_to_none=True)
    for t in batch:
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=torch.tensor([t.token_ids[: t.prompt_length - 1]]), past_key_values=cache, use_cache=True)
        rest = torch.tensor([t.token_ids[t.prompt_length - 1 :]])  # the context's last token predicts the first taught
        logits = model(input_ids=rest[:, :-1], past_key_values=cache, use_cache=True).logits[0]
        nll = torch.nn.functional.cross_entropy(logits.float(), rest[0, 1:], reduction="none")
        loss = (nll * torch.tensor(t.loss_mask[t.prompt_length :], dtype=torch.float32)).sum() / tokens
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], MAX_GRAD_NORM)
    optimizer.step()
    return total


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
        losses.append(context_cached_step(peft_model, optimizer, batch))
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
