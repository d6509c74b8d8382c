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
from agentgrad.cli.sql_demo import curve_table, episodes, learning_curve, point, spread, training_share, write_curve
from agentgrad.store import SqliteStore
from examples.sql import db, recovery

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


def episode(db_name: str, reward: float, first_failed: bool,
            from_mistake: bool = False) -> tuple[dict[str, str], float, dict[str, bool]]:
    return {"db": db_name}, reward, {"sql.first_failed": first_failed, "sql.matched": reward >= 1.0,
                                     "sql.from_mistake": from_mistake}


def test_self_corrected_is_the_share_of_failed_first_episodes_that_ended_right() -> None:
    rows = [episode("movies", 1.0, False), episode("movies", 1.0, True), episode("movies", 0.0, True),
            episode("movies", 0.0, True), episode("movies", 0.0, False)]  # fmt: skip
    p = point(0, "real-world", rows)
    assert (p.accuracy, p.failed_first, p.n_failed_first, p.n_self_corrected, p.n) == (0.4, 0.6, 3, 1, 5)
    assert p.self_corrected == pytest.approx(1 / 3)
    assert point(0, "x", [episode("movies", 1.0, False)]).self_corrected == 0.0  # none failed: nothing to correct


def test_the_table_shows_both_held_out_sets_at_every_step_and_each_database_before_and_after() -> None:
    points = [point(step, scope, [episode(scope, 1.0, True)]) for step in (0, 2, 4)
              for scope in ("held-out", "real-world", "movies")]  # fmt: skip
    rows = [(cells[0], cells[1]) for cells in zip(*(column.cells for column in curve_table(points, "t").columns))]
    assert [scope for step, scope in rows if step == "2"] == ["held-out", "real-world"]
    assert [step for step, scope in rows if scope == "movies"] == ["0", "4"]


def test_the_training_share_counts_failed_first_episodes_at_the_first_step_and_overall() -> None:
    rows = {1: [episode("library", 0.0, True), episode("library", 1.0, False)],
            2: [episode("library", 1.0, True), episode("library", 1.0, True)]}  # fmt: skip
    text = training_share(rows)
    assert "0.500 (1/2) at step 1" in text and "0.750 (3/4) over all steps" in text and "0.667 (2/3)" in text
    assert "started from a mistake" not in text
    rows[2] += [episode("library", 1.0, True, from_mistake=True), episode("library", 0.0, True, from_mistake=True)]
    text = training_share(rows)  # episodes given their first query are counted apart
    assert "0.750 (3/4) over all steps" in text and "episodes started from a mistake: 0.500 (1/2) fixed it" in text


async def test_the_curve_is_read_from_the_stored_rollouts_and_annotations_and_drawn_per_held_out_set(
    tmp_path: Path,
) -> None:
    from agentgrad.semconv import ANNOTATION_PREFIX, ANNOTATION_SPAN
    from agentgrad.store import MemoryStore
    from agentgrad.types import Span

    store = MemoryStore()
    runs = [(0, "airline", 1.0, False), (0, "movies", 0.0, True), (0, "lahman", 1.0, True),
            (3, "airline", 1.0, True), (3, "movies", 1.0, True), (3, "lahman", 1.0, False)]  # fmt: skip
    for step, name, reward, first_failed in runs:
        await store.enqueue_rollout({"db": name}, mode="val", metadata={"step": step})
        attempted = await store.dequeue_rollout()
        assert attempted is not None
        labels = {f"{ANNOTATION_PREFIX}sql.first_failed": first_failed}
        await store.add_span(Span(rollout_id=attempted.rollout_id, attempt_id=attempted.attempt.attempt_id,
                                  name=ANNOTATION_SPAN, attributes=labels))  # fmt: skip
        await store.update_attempt(attempted.rollout_id, attempted.attempt.attempt_id, status="succeeded", reward=reward)
    points = await learning_curve(store, {"movies", "lahman"}.__contains__)
    at = {(p.step, p.scope): p for p in points}
    assert (at[0, "real-world"].accuracy, at[0, "real-world"].n_failed_first, at[0, "real-world"].n_self_corrected) == (
        0.5, 2, 1)  # fmt: skip
    assert (at[3, "real-world"].accuracy, at[3, "held-out"].self_corrected) == (1.0, 1.0)
    assert at[0, "held-out"].n == 1 and at[3, "movies"].n_self_corrected == 1
    assert sorted(await episodes(store, "train")) == []
    written = write_curve(points, tmp_path, "t")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and tmp_path / "curve.png" in written
    with open(tmp_path / "curve.csv") as f:
        assert {(r["step"], r["scope"]) for r in csv.DictReader(f)} == {(str(s), c) for s, c in at}


def test_a_warm_start_then_one_lora_grpo_step_of_the_sql_agent_on_2_tasks_x_2_rollouts_writes_an_adapter_and_the_curve(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, tiny_default_models: Path
) -> None:
    """The demo's wiring end to end on the tiny Qwen2 (the real 0.5B's run is `benchmarks/sql_demo_run.py`)."""
    from safetensors.torch import load_file

    run = tmp_path / "run"
    command = [sys.executable, "-m", "agentgrad.cli", "demo", "--task", "sql", "--steps", "1", "--val-size", "1",
               "--val-every", "1", "--prompts-per-step", "2", "--group-size", "2", "--runners", "1",
               "--sql-warm-start", "--run-dir", str(run)]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200", "AGENTGRAD_SQL_DIR": str(tmp_path_factory.getbasetemp() / "sql")}  # as tests/test_sql_example.py's
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, check=False, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "training the text-to-SQL agent" in out and "qwen2.5-coder-0.5b" in out and "self-corrected" in out
    assert "training episodes whose first query failed" in out
    shown = len(recovery.demonstration_mix(db.load_questions("train")))
    assert f"warm start on {shown} demonstrations (fixes, joins, right starts)" in out and f"warm start: SFT on {shown} demonstrations" in out

    with open(run / "curve.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted({int(r["step"]) for r in rows}) == [0, 1]
    assert all(int(r["n"]) == 1 for r in rows if r["scope"] in ("held-out", "real-world"))
    for r in rows:
        assert all(0.0 <= float(r[k]) <= 1.0 for k in ("accuracy", "failed_first", "self_corrected"))
        assert int(r["n_self_corrected"]) <= int(r["n_failed_first"]) <= int(r["n"])
    assert (run / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| step |" in (run / "curve.md").read_text()

    # the checkpoint holds LoRA adapters only (on attention and MLP projections), not the model's weights
    adapter = load_file(run / "checkpoints" / "step-1" / "adapter_model.safetensors")
    targets = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in adapter}
    assert {"q_proj", "v_proj", "gate_proj", "down_proj"} <= targets
    assert all(".lora_A." in name or ".lora_B." in name for name in adapter), sorted(adapter)[:5]
    # LoRA's B matrices start at zero: the warm start moved them before step 1
    assert any(t.abs().sum() > 0 for name, t in adapter.items() if "lora_B" in name)
    store = SqliteStore(run / "store.db")
    (warm,) = asyncio.run(store.query_metrics("warm_start/demonstrations"))
    (groups,) = asyncio.run(store.query_metrics("train/groups_used"))
    norms = asyncio.run(store.query_metrics("train/grad_norm"))
    asyncio.run(store.close())
    assert (warm.step, warm.value) == (0, shown)
    # then GRPO's step had a gradient iff a group's rewards differed (the rest of a group's advantages are zero)
    assert any(n.value > 0 for n in norms) == (groups.value > 0), (groups.value, norms, out)
