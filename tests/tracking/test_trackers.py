"""Trackers with the real libraries, offline: what a run sends to MLflow, TensorBoard and W&B, read back with
each library's own reader, at the steps the store has."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import agentgrad as ag
from agentgrad.algorithms.base import Algorithm, Evaluation, RunContext
from agentgrad.algorithms.baseline import Baseline
from agentgrad.algorithms.config import RunConfig
from agentgrad.tracking import MissingTrackerError, MLflowTracker, TensorBoardTracker, WandbTracker, open_trackers
from tests.tracking import wandb_files


@ag.rollout
def half_agent(task: dict) -> float:
    """Reward 1 for even tasks, 0 for odd ones: a success rate of one half."""
    return 1.0 if task["n"] % 2 == 0 else 0.0


TASKS = [{"n": n} for n in range(6)]


@dataclass
class ClimbConfig(RunConfig):
    steps: int = 4


class Climb(Algorithm["list[float]"]):
    """A run of `steps` steps: each runs the tasks and logs `val/accuracy` rising to a peak at step 2, then
    falling, so best and final differ; enough to check steps and figures without loading a model. Configured as
    every algorithm is: a `RunConfig` of its own."""

    def __init__(self, steps: int = 4, report_to: Sequence[str] = ()) -> None:
        self.config = ClimbConfig(steps=steps, report_to=report_to)

    async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> list[float]:
        self.bind(ctx)
        curve = []
        for step in range(self.config.steps):
            result = Evaluation.of(await self.run_rollouts(train_data, mode="train"))
            accuracy = 0.25 * step if step <= 2 else 0.5 - 0.1 * (step - 2)
            await self.log_metrics(step, {"train/reward_mean": result.reward_mean, "val/accuracy": accuracy})
            curve.append(accuracy)
        return curve


def store_steps(store: ag.Store, name: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in asyncio.run(store.query_metrics(name))]


@pytest.mark.slow
def test_an_mlflow_run_on_sqlite_holds_the_baselines_metrics_params_tags_and_artifacts(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = ag.SqliteStore(tmp_path / "store.db")
    trainer = ag.Trainer(
        Baseline(success_threshold=0.5),
        store=store,
        report_to=[MLflowTracker(tracking_uri=uri, experiment="calc", artifact_location=str(tmp_path / "artifacts"))],
        run_name="baseline-1",
        tags={"team": "h4"},
    )
    results = trainer.fit(half_agent, TASKS, TASKS[:4])
    assert results["train"].success_rate == 0.5

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("calc").experiment_id])
    assert run.info.run_name == "baseline-1" and run.info.status == "FINISHED"
    assert run.data.tags["team"] == "h4" and run.data.tags["algorithm"] == "Baseline"
    assert run.data.params["algorithm"] == "Baseline" and run.data.params["success_threshold"] == "0.5"
    assert run.data.params["trainer.train_size"] == "6" and run.data.params["trainer.val_size"] == "4"
    history = client.get_metric_history(run.info.run_id, "train/success_rate")
    assert [(m.step, m.value) for m in history] == store_steps(store, "train/success_rate") == [(0, 0.5)]
    assert run.data.metrics["final/val/reward_mean"] == 0.5 and run.data.metrics["best/val/reward_mean"] == 0.5
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"baseline-1-learning_curve.png", "baseline-1-result.json"}
    assert any((tmp_path / "artifacts").rglob("baseline-1-result.json"))  # where the experiment was told
    local = Path(client.download_artifacts(run.info.run_id, "baseline-1-result.json", str(tmp_path / "dl")))
    assert json.loads(local.read_text())["summary"]["final/train/success_rate"] == 0.5
    png = Path(client.download_artifacts(run.info.run_id, "baseline-1-learning_curve.png", str(tmp_path / "dl")))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_run_that_raises_is_failed_in_mlflow_and_its_error_reaches_the_caller(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    class Broken(Climb):
        async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> list[float]:
            self.bind(ctx)
            await self.log_metrics(0, {"val/accuracy": 0.1})
            raise RuntimeError("diverged at step 1")

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    trainer = ag.Trainer(
        Broken(),
        store="memory",
        report_to=[MLflowTracker(uri, artifact_location=str(tmp_path / "a"))],
        run_name="broken",
    )
    with pytest.raises(RuntimeError, match="diverged at step 1"):
        trainer.fit(half_agent, TASKS)
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("agentgrad").experiment_id])
    assert run.info.status == "FAILED" and run.data.metrics["val/accuracy"] == 0.1
    assert client.list_artifacts(run.info.run_id) == []  # no curve for a run that did not finish


def test_tensorboard_event_files_hold_every_step_the_store_has_the_config_and_the_curve(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store = ag.MemoryStore()
    trainer = ag.Trainer(
        Climb(steps=5), store=store, report_to=[TensorBoardTracker(log_dir=tmp_path / "tb")], run_name="climb"
    )
    trainer.fit(half_agent, TASKS)

    events = EventAccumulator(str(tmp_path / "tb" / "climb"), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    accuracy = [(e.step, round(e.value, 6)) for e in events.Scalars("val/accuracy")]
    assert accuracy == [(s, round(v, 6)) for s, v in store_steps(store, "val/accuracy")]
    assert [s for s, _ in accuracy] == [0, 1, 2, 3, 4]
    assert events.Scalars("best/val/accuracy")[-1].value == 0.5 and events.Scalars("best/step")[-1].value == 2
    assert abs(events.Scalars("final/val/accuracy")[-1].value - 0.3) < 1e-6
    config = json.loads(events.Tensors("run/config")[0].tensor_proto.string_val[0].decode())
    assert config["config"]["algorithm"] == "Climb" and config["config"]["steps"] == 5
    assert events.Tensors("run/status")[0].tensor_proto.string_val[0] == b"succeeded"
    (image,) = events.Images("artifacts/climb-learning_curve")
    assert image.encoded_image_string[:4] == b"\x89PNG" and image.width == 720


@pytest.mark.slow
def test_wandb_offline_writes_a_run_file_with_the_metrics_by_step_config_and_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / variable.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    store = ag.MemoryStore()
    climb = Climb(steps=4)
    trainer = ag.Trainer(
        climb, store=store, report_to=[WandbTracker(mode="offline", dir=tmp_path / "wb")], run_name="climb-wb"
    )
    trainer.fit(half_agent, TASKS)

    (run_dir,) = (tmp_path / "wb" / "wandb").glob("offline-run-*")
    (run_file,) = run_dir.glob("run-*.wandb")
    rows = [r for r in wandb_files.history(run_file) if "val/accuracy" in r]
    assert [(r["step"], round(r["val/accuracy"], 6)) for r in rows] == [
        (s, round(v, 6)) for s, v in store_steps(store, "val/accuracy")
    ]
    assert wandb_files.config(run_file)["steps"] == 4
    summary = wandb_files.summary(run_file)
    assert summary["best/val/accuracy"] == 0.5 and summary["best/step"] == 2
    assert (run_dir / "files" / "climb-wb-learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    (run_record,) = [r for r in wandb_files.records(run_file) if r.WhichOneof("record_type") == "run"]
    assert run_record.run.display_name == "climb-wb" and "algorithm:Climb" in run_record.run.tags


@pytest.mark.slow
def test_wandb_leaves_a_run_the_user_opened_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / variable.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    users_run = wandb.init(project="mine", mode="offline", dir=str(tmp_path / "mine"), reinit="create_new")
    try:
        tracker = WandbTracker(mode="offline", dir=tmp_path / "wb")
        ag.Trainer(Climb(steps=2), store=ag.MemoryStore(), report_to=[tracker]).fit(half_agent, TASKS)
        # the tracker finished its own run and did not stop W&B's service under the user's (logging would raise)
        assert wandb.setup().most_recent_active_run is users_run
        users_run.log({"still": 1.0})
    finally:
        users_run.finish()
        wandb.teardown()


def test_an_algorithms_own_report_to_names_its_trackers_and_the_trainers_configure_them(tmp_path: Path) -> None:
    tracker = TensorBoardTracker(log_dir=tmp_path / "tb")
    ag.Trainer(Climb(steps=2, report_to=["tensorboard"]), store="memory", report_to=[tracker], run_name="r").fit(
        half_agent, TASKS
    )
    assert tracker.run_dir == tmp_path / "tb" / "r" and any(tracker.run_dir.glob("events.out.tfevents.*"))


def test_no_tracker_named_writes_nothing_and_leaves_the_context_without_trackers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    seen: list[object] = []

    class Peek(Climb):
        async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> list[float]:
            seen.append(ctx.trackers)
            return await super().run(ctx, train_data, val_data)

    ag.Trainer(Peek(steps=1), store="memory").fit(half_agent, TASKS)
    assert seen == [None] and list(tmp_path.iterdir()) == []


def test_an_unknown_tracker_is_refused_when_the_trainer_is_built_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown tracker 'neptune': use mlflow, tensorboard, wandb"):
        ag.Trainer(store="memory", report_to=["neptune"])
    assert not open_trackers(["none"])


def test_a_tracker_whose_library_is_missing_says_which_extra_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(MissingTrackerError, match=r"pip install 'agentgrad\[wandb\]'"):
        ag.Trainer(Climb(steps=1), store="memory", report_to=["wandb"]).fit(half_agent, TASKS)


def test_secrets_in_an_algorithms_config_never_reach_a_tracker(tmp_path: Path) -> None:
    from agentgrad.tracking.session import algorithm_config

    @dataclass
    class KeyedConfig(ClimbConfig):
        api_key: str = "sk-live-0123456789abcdef"
        hf_token: str = "hf_0123456789abcdef"
        max_tokens: int = 48

    class Keyed(Climb):
        def __init__(self) -> None:
            self.config = KeyedConfig(steps=1)

    config = algorithm_config(Keyed())
    assert config["api_key"] == "[redacted]" and config["steps"] == 1
    assert config["hf_token"] == "[redacted]" and config["max_tokens"] == 48  # a token count is no secret


def test_the_training_commands_take_report_to_and_refuse_an_unknown_tracker(capsys: pytest.CaptureFixture[str]) -> None:
    from agentgrad.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(["demo", "--report-to", "mlflow", "tensorboard"]).report_to == ["mlflow", "tensorboard"]
    assert parser.parse_args(["apo", "--base-url", "u", "--model", "m", "--report-to", "wandb"]).report_to == ["wandb"]
    assert parser.parse_args(["demo"]).report_to == []
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--report-to", "neptune"])
    assert "invalid choice: 'neptune'" in capsys.readouterr().err
