"""The CLI as a user runs it: a subprocess on a store file."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import agentgrad as ag
from agentgrad.store import SqliteStore


def agentgrad_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "agentgrad.cli", *args], capture_output=True, text=True, env=env, timeout=60)


def test_rollouts_ls_and_show_print_what_the_store_holds(tmp_path: Path) -> None:
    path = tmp_path / "run.db"

    def agent(task: dict) -> float:
        with ag.operation("solve", question=task["q"]) as op:
            op.set_output("4")
        if task["q"] == "boom":
            raise RuntimeError("exploded on purpose")
        return 1.0

    ag.Trainer(n_runners=2, store=SqliteStore(path)).fit(agent, [{"q": "2+2"}, {"q": "boom"}])
    rollouts = asyncio.run(SqliteStore(path).query_rollouts())

    listing = agentgrad_cli("rollouts", "ls", "--store", str(path))
    assert listing.returncode == 0, listing.stderr
    for rollout in rollouts:
        assert rollout.rollout_id in listing.stdout
    assert "succeeded" in listing.stdout and "failed" in listing.stdout and "1.000" in listing.stdout

    failed = next(r for r in rollouts if r.input["q"] == "boom")
    shown = agentgrad_cli("rollouts", "show", failed.rollout_id, "--store", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "RuntimeError: exploded on purpose" in shown.stdout
    assert "agentgrad.rollout" in shown.stdout and "solve" in shown.stdout and "agentgrad.exception" in shown.stdout
    assert '{"question": "boom"}' in shown.stdout

    only_failed = agentgrad_cli("rollouts", "ls", "--store", str(path), "--status", "failed")
    assert failed.rollout_id in only_failed.stdout and "succeeded " not in only_failed.stdout.split("by status")[0]


def test_unknown_ids_and_missing_files_are_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    SqliteStore(path)
    missing = agentgrad_cli("rollouts", "show", "ro-nothere", "--store", str(path))
    assert missing.returncode == 2 and "no rollout with id 'ro-nothere'" in missing.stdout
    no_file = agentgrad_cli("rollouts", "ls", "--store", str(tmp_path / "absent.db"))
    assert no_file.returncode == 2 and "no store file" in no_file.stdout
    assert not (tmp_path / "absent.db").exists()
