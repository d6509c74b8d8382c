"""`agentgrad demo` keeps each run in a run folder (store and checkpoints) and resumes it after a crash:
the same command again continues from the newest checkpoint, in the same store, losing no step it saved."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgrad.cli.demo import run_folder
from agentgrad.cli.main import build_parser
from agentgrad.policy.checkpoints import TRAINER_STATE
from agentgrad.store import SqliteStore
from tests.helpers import sigkill_at_checkpoint


def demo_args(*extra: str) -> object:
    return build_parser().parse_args(["demo", "--task", "plain", "--steps", "5", *extra])


def checkpoint(run: Path, step: int) -> None:
    folder = run / "checkpoints" / f"step-{step}"
    folder.mkdir(parents=True)
    (folder / TRAINER_STATE).write_bytes(b"")


def test_a_new_demo_run_gets_its_own_folder_with_the_store_and_checkpoints_in_it(tmp_path: Path) -> None:
    run = run_folder(demo_args("--run-dir", str(tmp_path / "run")))
    assert run.resume_step is None and run.path.is_dir()
    assert run.store == str(tmp_path / "run" / "store.db") and run.checkpoints == tmp_path / "run" / "checkpoints"


def test_an_interrupted_demo_run_resumes_from_its_newest_checkpoint_with_resume_or_when_the_user_says_yes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "run"
    checkpoint(path, 1)
    checkpoint(path, 2)
    (path / "checkpoints" / "step-3.partial").mkdir()  # the crash came while writing step 3
    with pytest.raises(SystemExit, match=r"resumes from step 2 .*Pass --resume to continue it, or --fresh"):
        run_folder(demo_args("--run-dir", str(path)))  # no terminal to ask: it says what to pass
    resumed = run_folder(demo_args("--run-dir", str(path), "--resume"))
    assert resumed.resume_step == 2 and resumed.store == str(path / "store.db")
    questions: list[str] = []
    asked = run_folder(demo_args("--run-dir", str(path)), ask=lambda q: questions.append(q) or "")
    assert asked.resume_step == 2 and "resume from step 2" in questions[0]
    with pytest.raises(SystemExit, match="not resumed"):
        run_folder(demo_args("--run-dir", str(path)), ask=lambda q: "n")


def test_fresh_starts_over_and_keeps_the_earlier_run_aside_and_a_finished_run_is_only_shown(tmp_path: Path) -> None:
    path = tmp_path / "run"
    checkpoint(path, 5)
    for flags in ((), ("--resume",)):  # finished: nothing to resume, with or without a terminal to ask
        finished = run_folder(demo_args("--run-dir", str(path), *flags))
        assert finished.finished and finished.resume_step == 5
    more = run_folder(demo_args("--run-dir", str(path), "--resume", "--steps", "7"))
    assert not more.finished and more.resume_step == 5  # more steps: it trains on from there
    fresh = run_folder(demo_args("--run-dir", str(path), "--fresh"))
    assert fresh.resume_step is None and not (path / "checkpoints").exists()
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run-")]
    assert (aside / "checkpoints" / "step-5" / TRAINER_STATE).exists()


@pytest.mark.model
@pytest.mark.parametrize("algorithm", ["grpo", "sft"])
def test_a_demo_sigkilled_after_a_checkpoint_resumes_at_that_step_in_the_same_store_and_then_shows_its_result(
    tmp_path: Path, algorithm: str
) -> None:
    run = tmp_path / "run"
    command = [sys.executable, "-m", "agentgrad.cli", "demo", "--task", "plain", "--steps", "3", "--val-size", "2",
               "--prompts-per-step", "2", "--group-size", "2", "--runners", "1", "--run-dir", str(run),
               "--algorithm", algorithm]
    env = {**os.environ, "COLUMNS": "200"}
    began = time.monotonic()
    saved = sigkill_at_checkpoint(command, run, step=1, env=env, timeout=600)
    killed_after = time.monotonic() - began

    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL, check=False,
                           cwd=Path(__file__).resolve().parents[1])
    assert again.returncode == 1 and "Pass --resume to continue it" in again.stderr  # asked, not guessed
    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=env, timeout=900, check=False,
                             cwd=Path(__file__).resolve().parents[1])
    took = time.monotonic() - began
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out
    assert f"resuming the run in {run} from step {saved}" in out
    assert re.search(rf"resumed from \S+step-{saved} \(step {saved}\)", out)
    assert f"step {saved + 1}/3" in out and f"step {saved}/3" not in out  # the saved steps are not run again

    store = SqliteStore(run / "store.db")
    loss_steps = [m.step for m in asyncio.run(store.query_metrics("train/reward_mean"))]
    asyncio.run(store.close())
    assert sorted(set(loss_steps)) == [1, 2, 3]  # every step in the one store
    assert (run / "checkpoints" / "step-3" / TRAINER_STATE).exists()
    print(f"killed after {killed_after:.0f} s at step {saved}; resumed and finished at {took:.0f} s")

    shown = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL,
                           check=False, cwd=Path(__file__).resolve().parents[1])  # no terminal, no flag: finished
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "already finished its 3 steps" in shown.stdout and "held-out problems" in shown.stdout
    table = resumed.stdout[resumed.stdout.index("held-out problems"):]
    before_after = [line for line in table.splitlines() if line.strip("│ ").startswith(("before", "after"))]
    assert len(before_after) == 2 and all(line in shown.stdout for line in before_after)  # the same figures
