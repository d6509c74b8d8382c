"""torchrun without Ray: the same GRPO script on every rank, rank 0 runs the algorithm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentgrad.distributed.group import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.distributed  # a process group of its own: `make test-fast` leaves it out


def test_under_torchrun_rank_0_runs_grpo_and_the_other_rank_joins_every_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), str(REPO / "tests" / "distributed" / "torchrun_grpo.py"),
               str(tiny_model_dir), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    lead = json.loads((tmp_path / "rank-0.json").read_text())
    follower = json.loads((tmp_path / "rank-1.json").read_text())
    assert [h["step"] for h in lead["history"]] == [1, 2] and lead["version"] >= 2
    assert follower == {"rank": 1, "followed": True}
    assert (Path(lead["checkpoint"]) / "dcp" / ".metadata").exists()
