"""MLflow: the run's figures as metrics, its configuration as parameters, its tags, the curve as an artifact.

Written through `MlflowClient` (no global active run, so two runs in one process stay apart), to the tracking
URI given, else MLflow's own default (`MLFLOW_TRACKING_URI`, or `sqlite:///mlflow.db` here). Extra: `agentgrad[mlflow]`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentgrad.tracking.base import RunInfo, flatten, import_tracker_library

MAX_PARAM_LENGTH = 6000
"""MLflow refuses longer parameter values; a longer one is cut and says so."""

STATUSES = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
"""agentgrad's run status → MLflow's."""


class MLflowTracker:
    """`report_to=["mlflow"]`, or `MLflowTracker(tracking_uri="sqlite:///runs.db", experiment="calc")` for a place of
    its own; `artifact_location` is where a new experiment keeps its files (MLflow's default: `./mlruns`)."""

    name = "mlflow"

    def __init__(
        self, tracking_uri: str | None = None, experiment: str | None = None, artifact_location: str | None = None
    ) -> None:
        self.tracking_uri = tracking_uri
        self.artifact_location = artifact_location
        self.experiment = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "agentgrad"
        self.run_id: str | None = None
        self._client: Any = None

    def start(self, run: RunInfo) -> None:
        import_tracker_library("mlflow", "mlflow", self.name)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        found = self._client.get_experiment_by_name(self.experiment)
        experiment_id = (
            found.experiment_id
            if found
            else self._client.create_experiment(self.experiment, artifact_location=self.artifact_location)
        )
        self.run_id = self._client.create_run(experiment_id, run_name=run.name, tags=dict(run.tags)).info.run_id
        params = [Param(key, param_value(value)) for key, value in flatten(run.config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
            self._client.log_batch(self.run_id, params=params[i : i + 100])

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(name, float(value), stamp, step) for name, value in values.items()]
        self._client.log_batch(self._require_run(), metrics=metrics)

    def log_artifact(self, path: Path) -> None:
        self._client.log_artifact(self._require_run(), str(path))

    def finish(self, summary: Mapping[str, float], status: str) -> None:
        if self.run_id is None:
            return
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        if summary:
            self._client.log_batch(self.run_id, metrics=[Metric(k, float(v), stamp, 0) for k, v in summary.items()])
        self._client.set_terminated(self.run_id, STATUSES.get(status, "FINISHED"))

    def _require_run(self) -> str:
        if self.run_id is None:
            raise RuntimeError("MLflowTracker: start(run) first; the trainer does it when fit begins")
        return self.run_id


def param_value(value: Any) -> str:
    text = "None" if value is None else str(value)
    return text if len(text) <= MAX_PARAM_LENGTH else text[: MAX_PARAM_LENGTH - 20] + "... (cut)"
