"""The ray strategy on a local Ray cluster the test starts (loopback, 2 CPUs)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

import agentgrad as ag
from agentgrad.algorithms.baseline import Baseline
from agentgrad.algorithms.grpo import GRPO, GRPOConfig
from agentgrad.engine import Engine
from agentgrad.types import AttemptStatus, RolloutStatus
from tests import ray_agents

pytestmark = pytest.mark.distributed  # a process group of its own: `make test-fast` leaves it out

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield
    ray.shutdown()


def test_a_grpo_run_on_ray_trains_with_two_training_actors_and_leaves_metrics_and_a_checkpoint(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    engine = Engine(tiny_model_dir, sampling_dtype="float32")
    config = GRPOConfig(steps=2, prompts_per_step=2, group_size=2, max_tokens=8, val_every=0, train_processes=2,
                        skip_uniform_groups=False, checkpoint_dir=str(tmp_path / "ckpt"), learning_rate=1e-3)
    trainer = ag.Trainer(GRPO(config, local_engine=engine), n_runners=2, strategy="ray", store="memory")
    result = trainer.fit(ray_agents.even_length, [{"q": "hi"}, {"q": "hello"}, {"q": "hey"}])
    assert [h["step"] for h in result.history] == [1, 2]
    assert all(h["train/failed_rollouts"] == 0 for h in result.history)
    assert all(h["train/groups_used"] == 2 for h in result.history)  # every step updated the weights
    assert engine.version >= 2  # each update published to the serving engine
    checkpoint = Path(result.checkpoint)
    assert checkpoint.name == "step-2" and (checkpoint / "dcp" / ".metadata").exists()
    assert (checkpoint / "model.safetensors").exists() and (checkpoint / "tokenizer.json").exists()
    Engine(checkpoint, sampling_dtype="float32").close()  # the export serves
    metrics = asyncio.run(trainer.store.query_metrics())
    assert {"train/reward_mean", "perf/update_seconds", "perf/sync_seconds"} <= {m.name for m in metrics}


def test_a_runner_actor_killed_mid_attempt_is_replaced_and_its_rollout_finishes_exactly_once(
    ray_cluster: None, tmp_path: Path
) -> None:
    started, finished = tmp_path / "started", tmp_path / "finished"
    tasks = [{"hang": True, "started": str(started), "finished": str(finished)}] + [{"finished": str(finished)}] * 3
    trainer = ag.Trainer(Baseline(), n_runners=2, strategy="ray", store="memory")
    outcome: dict[str, object] = {}
    fit = threading.Thread(target=lambda: outcome.setdefault("result", trainer.fit(ray_agents.hangs_on_first_attempt, tasks)))
    fit.start()
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline:  # the first attempt is under way
        time.sleep(0.05)
    assert started.exists(), "the hanging attempt never started"
    os.kill(int(started.read_text()), signal.SIGKILL)  # the runner actor's process, mid-attempt
    fit.join(120)
    assert not fit.is_alive()
    assert outcome["result"]["train"].succeeded == 4
    lines = finished.read_text().split()
    assert len(lines) == 4 and len(set(lines)) == 4  # every rollout finished once, the killed one too
    store = trainer.store
    hung = next(r for r in asyncio.run(store.query_rollouts()) if r.input.get("hang"))
    assert hung.status is RolloutStatus.SUCCEEDED
    attempts = asyncio.run(store.query_attempts(hung.rollout_id))
    assert [a.status for a in attempts] == [AttemptStatus.UNRESPONSIVE, AttemptStatus.SUCCEEDED]
    assert "restarted" in (attempts[0].error or "")  # given up by its replacement, not by the heartbeat timeout



def test_ray_runners_take_the_trainers_hooks_and_isolation_and_n_runners_is_their_total(
    ray_cluster: None, tmp_path: Path
) -> None:
    hooked, pids = tmp_path / "hooked", tmp_path / "pids"
    trainer = ag.Trainer(Baseline(), n_runners=3, strategy="ray", store="memory",
                         hooks=[ray_agents.RunnerLog(str(hooked))], runner_isolation="process")
    result = trainer.fit(ray_agents.writes_its_pid, [{"pids": str(pids)}] * 6)
    assert result["train"].succeeded == 6
    runs = [line.split() for line in hooked.read_text().splitlines()]
    assert len(runs) == 6 and {worker for worker, _ in runs} <= {"runner-0", "runner-1", "runner-2"}  # 3 in all
    workers = {int(pid) for _, pid in runs}  # the runner actors' processes, where the hook ran
    agents = {int(pid) for pid in pids.read_text().split()}
    assert len(agents) == 6 and not agents & workers  # each attempt in a process of its own
