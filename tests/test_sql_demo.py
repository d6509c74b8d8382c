"""`agentgrad demo --task sql`: the text-to-SQL agent trained with LoRA GRPO on Qwen, and its learning curve."""

from __future__ import annotations

import asyncio
import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentgrad.cli.main import build_parser
from agentgrad.cli.sql_demo import spread
from agentgrad.store import SqliteStore
from examples.sql import db

ROOT = Path(__file__).resolve().parents[1]


def test_the_sql_task_is_a_demo_task_with_its_own_defaults() -> None:
    args = build_parser().parse_args(["demo", "--task", "sql"])
    assert args.task == "sql" and args.model is None and args.val_size is None and args.prompts_per_step is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--task", "sqlite"])


def test_the_held_out_questions_are_spread_over_both_held_out_databases_and_every_kind() -> None:
    held_out = db.load_questions("held_out")
    picked = spread(held_out, 8)
    assert len(picked) == 8 == len({q["id"] for q in picked})
    assert {q["db"] for q in picked} == {q["db"] for q in held_out}
    assert len({q["kind"] for q in picked}) >= 4
    assert spread(held_out, 0) == held_out and spread(held_out, 10_000) == held_out


@pytest.mark.qwen
def test_one_lora_grpo_step_of_the_sql_agent_on_2_tasks_x_2_rollouts_writes_an_adapter_and_the_curve(
    tmp_path: Path,
) -> None:
    from safetensors.torch import load_file

    run = tmp_path / "run"
    command = [sys.executable, "-m", "agentgrad.cli", "demo", "--task", "sql", "--steps", "1", "--val-size", "2",
               "--val-every", "1", "--prompts-per-step", "2", "--group-size", "2", "--runners", "1",
               "--run-dir", str(run)]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200", "AGENTGRAD_SQL_DIR": str(tmp_path / "sql")}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, check=False, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "training the text-to-SQL agent" in out and "qwen2.5-coder-0.5b" in out and "self-corrected" in out

    with open(run / "curve.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [0, 1] and all(int(r["n"]) == 2 for r in rows)
    for r in rows:
        assert all(0.0 <= float(r[k]) <= 1.0 for k in ("accuracy", "tool_call_rate", "self_corrected"))
        assert float(r["self_corrected"]) <= float(r["failed_query"]) <= float(r["tool_call_rate"])
    assert (run / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| step |" in (run / "curve.md").read_text()

    # the checkpoint holds LoRA adapters only (on attention and MLP projections), not the 0.5B weights
    adapter = load_file(run / "checkpoints" / "step-1" / "adapter_model.safetensors")
    targets = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in adapter}
    assert {"q_proj", "v_proj", "gate_proj", "down_proj"} <= targets
    assert sum(t.numel() for t in adapter.values()) < 20_000_000
    # LoRA's B matrices start at zero: they moved iff the step had a group whose rewards differed
    moved = any(t.abs().sum() > 0 for name, t in adapter.items() if "lora_B" in name)
    store = SqliteStore(run / "store.db")
    (groups,) = asyncio.run(store.query_metrics("train/groups_used"))
    asyncio.run(store.close())
    assert moved == (groups.value > 0), (groups.value, out)
