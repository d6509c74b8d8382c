"""Runs as records in the store: every fit writes one (configuration, versions, machine, git, figures), and
`agentgrad runs ls | show | compare` prints them."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import agentgrad as ag
from agentgrad.algorithms.base import Algorithm, RunContext
from agentgrad.algorithms.baseline import Baseline
from agentgrad.algorithms.grpo import GRPOResult
from agentgrad.policy.checkpoints import TRAINER_STATE, BestCheckpoint, prune_checkpoints
from agentgrad.train.runs import end_record, git_state
from agentgrad.types import Metric, Run, RunStatus
from tests.tracking.test_trackers import TASKS, Climb, half_agent


def agentgrad_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentgrad.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"},
    )


def two_runs(path: Path) -> ag.SqliteStore:
    store = ag.SqliteStore(path)
    ag.Trainer(Baseline(success_threshold=0.5), store=store, run_name="baseline", tags={"kind": "eval"}).fit(
        half_agent, TASKS, TASKS[:2]
    )
    ag.Trainer(Climb(steps=4), store=store, run_name="climb").fit(half_agent, TASKS)
    return store


def test_every_fit_records_a_run_with_its_config_versions_machine_figures_and_metrics(tmp_path: Path) -> None:
    store = two_runs(tmp_path / "store.db")
    baseline, climb = asyncio.run(store.query_runs())
    assert (baseline.name, baseline.algorithm, baseline.status) == ("baseline", "Baseline", RunStatus.SUCCEEDED)
    assert baseline.config["success_threshold"] == 0.5 and baseline.config["trainer"]["train_size"] == 6
    assert (
        baseline.tags == {"kind": "eval"} and baseline.end_time is not None and baseline.end_time >= baseline.start_time
    )
    assert baseline.versions["agentgrad"] == ag.__version__ and baseline.versions["python"].startswith("3.")
    assert baseline.machine["cpus"] >= 1 and baseline.machine["host"]
    assert baseline.final["val/reward_mean"] == 0.5 and baseline.best == {"val/reward_mean": 0.5, "step": 0}
    assert climb.config["steps"] == 4 and climb.best == {"val/accuracy": 0.5, "step": 2}
    assert abs(climb.final["val/accuracy"] - 0.4) < 1e-9
    points = asyncio.run(store.query_metrics("val/accuracy", run_id=climb.run_id))
    assert [m.step for m in points] == [0, 1, 2, 3]
    assert [m.run_id for m in asyncio.run(store.query_metrics("val/reward_mean"))] == [baseline.run_id]


def test_a_run_that_raises_is_recorded_failed_with_its_error(tmp_path: Path) -> None:
    class Broken(Algorithm[None]):
        async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> None:
            self.bind(ctx)
            raise RuntimeError("out of memory at step 3")

    store = ag.MemoryStore()
    with pytest.raises(RuntimeError):
        ag.Trainer(Broken(), store=store, run_name="broken").fit(half_agent, TASKS)
    (run,) = asyncio.run(store.query_runs())
    assert run.status is RunStatus.FAILED and run.error == "RuntimeError: out of memory at step 3"


def test_git_state_names_the_commit_and_whether_the_checkout_has_changes(tmp_path: Path) -> None:
    assert git_state(tmp_path) is None  # not a checkout
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "agent.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "agent.py"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "agent"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert git_state(tmp_path) == {"commit": head, "dirty": False, "path": str(tmp_path)}
    (tmp_path / "agent.py").write_text("x = 2\n")
    assert git_state(tmp_path)["dirty"] is True  # type: ignore[index]


@pytest.mark.slow
def test_runs_ls_show_and_compare_print_the_records(tmp_path: Path) -> None:
    store = two_runs(tmp_path / "store.db")
    baseline, climb = asyncio.run(store.query_runs())
    path = str(tmp_path / "store.db")

    listed = agentgrad_cli("runs", "ls", "--store", path)
    assert listed.returncode == 0, listed.stderr
    for expected in (baseline.run_id, climb.run_id, "Baseline", "Climb", "succeeded", "val/accuracy 0.5 @ 2"):
        assert expected in listed.stdout, expected

    shown = agentgrad_cli("runs", "show", "climb", "--store", path)
    assert shown.returncode == 0, shown.stderr
    assert climb.run_id in shown.stdout and "best at step 2" in shown.stdout
    assert f"agentgrad {ag.__version__}" in shown.stdout and "steps" in shown.stdout

    compared = agentgrad_cli("runs", "compare", baseline.run_id, "climb", "--store", path)
    assert compared.returncode == 0, compared.stderr
    assert "algorithm" in compared.stdout and "success_threshold" in compared.stdout
    assert "final val/accuracy" in compared.stdout and "final val/reward_mean" in compared.stdout

    missing = agentgrad_cli("runs", "show", "nope", "--store", path)
    assert missing.returncode != 0 and "no run with id or name 'nope'" in missing.stdout + missing.stderr
    alone = agentgrad_cli("runs", "compare", "climb", "--store", path)
    assert alone.returncode != 0 and "two runs or more" in alone.stdout + alone.stderr


def test_runs_show_puts_each_roles_figures_side_by_side(tmp_path: Path) -> None:
    """A GRPO run with `roles` logs `train/<role>/<figure>`; `runs show` gives them a table, a row per role."""

    class TwoRoles(Algorithm[None]):
        async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> None:
            self.bind(ctx)
            figures = {"train/reward_mean": 0.5, "train/solver/reward_mean": 0.25, "train/solver/loss": 0.125,
                       "train/verifier/reward_mean": 0.75, "train/verifier/calls": 4}  # fmt: skip
            await self.log_metrics(1, figures)

    path = tmp_path / "store.db"
    ag.Trainer(TwoRoles(), store=ag.SqliteStore(path), run_name="roles").fit(half_agent, TASKS)
    shown = agentgrad_cli("runs", "show", "roles", "--store", str(path))
    assert shown.returncode == 0, shown.stderr
    table = shown.stdout[shown.stdout.index("Roles (2), final") :]
    rows = {line.split()[1]: line.split()[2:] for line in table.splitlines() if "solver" in line or "verifier" in line}
    assert rows["solver"][:3] == ["│", "0.25", "│"] and "0.125" in rows["solver"]
    assert rows["verifier"][:3] == ["│", "0.75", "│"] and "4" in rows["verifier"]


def checkpoint_folders(root: Path, *steps: int) -> list[Path]:
    """Complete `step-N` folders (a trainer state in each) as GRPO writes them."""
    folders = []
    for step in steps:
        (root / f"step-{step}").mkdir(parents=True)
        (root / f"step-{step}" / TRAINER_STATE).write_bytes(b"state")
        folders.append(root / f"step-{step}")
    return folders


def test_the_best_checkpoint_is_the_best_validated_one_and_pruning_spares_it(tmp_path: Path) -> None:
    one, two, three, four = checkpoint_folders(tmp_path, 1, 2, 3, 4)
    best = BestCheckpoint()
    assert best.consider(one, 1, 0.25) and best.consider(two, 2, 0.75)
    assert not best.consider(three, 3, 0.75) and not best.consider(four, 4, None)  # a tie stays earlier; unvalidated
    assert (best.path, best.figures()) == (str(two), {"val/accuracy": 0.75, "step": 2.0})
    assert prune_checkpoints(tmp_path, 1, spare=best.path) == [one, three]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-4"]
    assert BestCheckpoint.restored(best.state()) == best  # a resumed run knows it
    shutil.rmtree(two)
    assert BestCheckpoint.restored(best.state()).path is None  # ... unless it was deleted


def test_the_run_record_names_the_results_best_checkpoint_or_the_one_noted_before_a_failure() -> None:
    run = Run(run_id="run-1", name="r", algorithm="GRPO")
    metrics = [Metric(name="val/accuracy", step=s, value=v, run_id="run-1") for s, v in [(0, 0.5), (1, 0.9), (2, 0.4)]]
    best = BestCheckpoint(path="/c/step-1", step=1, value=0.9)
    result = GRPOResult(steps=2, initial=None, final=None, checkpoint="/c/step-2", best_checkpoint=best,
                        checkpoints=["/c/step-1", "/c/step-2"])
    ended = end_record(run, RunStatus.SUCCEEDED, metrics, result, None)
    assert ended.best_checkpoint == "/c/step-1" and ended.checkpoints == ["/c/step-1", "/c/step-2"]
    assert ended.best_checkpoint_validation == {"val/accuracy": 0.9, "step": 1.0} and ended.best["step"] == 1
    unvalidated = GRPOResult(steps=2, initial=None, final=None, checkpoint="/c/step-2", checkpoints=["/c/step-2"])
    assert end_record(run, RunStatus.SUCCEEDED, metrics, unvalidated, None).best_checkpoint is None
    noted = run.model_copy(update={"best_checkpoint": "/c/step-1", "best_checkpoint_validation": best.figures()})
    failed = end_record(noted, RunStatus.FAILED, metrics, None, "RuntimeError: boom")
    assert failed.best_checkpoint == "/c/step-1" and failed.checkpoints == ["/c/step-1"]


def test_runs_show_and_compare_name_the_best_checkpoint_and_its_figure(tmp_path: Path) -> None:
    store = ag.SqliteStore(tmp_path / "store.db")
    asyncio.run(store.put_run(Run(run_id="run-a", name="a", algorithm="GRPO", status=RunStatus.SUCCEEDED,
                                  checkpoints=["/c/step-1", "/c/step-3"], best_checkpoint="/c/step-1",
                                  best_checkpoint_validation={"val/accuracy": 0.75, "step": 1})))
    asyncio.run(store.put_run(Run(run_id="run-b", name="b", algorithm="SFT", checkpoints=["/d/step-2"])))
    shown = agentgrad_cli("runs", "show", "a", "--store", str(tmp_path / "store.db"))
    assert "checkpoint: /c/step-1 (best on validation)" in shown.stdout
    assert "best checkpoint: /c/step-1 (val/accuracy 0.75 at step 1)" in shown.stdout, shown.stdout
    compared = agentgrad_cli("runs", "compare", "a", "b", "--store", str(tmp_path / "store.db"))
    assert "/c/step-1 (val/accuracy 0.75 at step 1)" in compared.stdout and "none validated" in compared.stdout
