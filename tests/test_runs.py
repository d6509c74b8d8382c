"""Runs as records in the store: every fit writes one (configuration, versions, machine, git, figures), and
`agentgrad runs ls | show | compare` prints them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import agentgrad as ag
from agentgrad.algorithms.base import Algorithm, RunContext
from agentgrad.algorithms.baseline import Baseline
from agentgrad.train.runs import git_state
from agentgrad.types import RunStatus
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
