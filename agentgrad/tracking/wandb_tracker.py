"""Weights & Biases: the run's figures by step, its configuration, tags and summary, the curve as a file.

`mode` is W&B's own ("online", "offline": run files written under `dir`, synced later with `wandb sync`;
default: `WANDB_MODE`, else W&B's default). Extra: `agentgrad[wandb]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentgrad.tracking.base import RunInfo, import_tracker_library

STATUSES = {"succeeded": 0, "failed": 1, "cancelled": 1}
"""agentgrad's run status → the exit code W&B records."""


class WandbTracker:
    """`report_to=["wandb"]`, or `WandbTracker(project="calc", mode="offline", dir="wandb-runs")`."""

    name = "wandb"

    def __init__(self, project: str | None = None, mode: str | None = None, dir: str | Path | None = None) -> None:
        self.project = project or "agentgrad"
        self.mode = mode
        self.dir = Path(dir) if dir is not None else None
        self.run: Any = None

    def start(self, run: RunInfo) -> None:
        wandb = import_tracker_library("wandb", "wandb", self.name)
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=self.project,
            name=run.name,
            config=dict(run.config),
            tags=[f"{k}:{v}" if v else k for k, v in run.tags.items()],
            mode=self.mode,
            dir=str(self.dir) if self.dir is not None else None,
            reinit="create_new",
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        # W&B's own step only grows; the store's step goes in as `step`, the x axis the metrics are defined on
        self._require_run().log({"step": step, **{k: float(v) for k, v in values.items()}})

    def log_artifact(self, path: Path) -> None:
        self._require_run().save(str(path), base_path=str(path.parent), policy="now")

    def finish(self, summary: Mapping[str, float], status: str) -> None:
        if self.run is None:
            return
        self.run.summary.update(dict(summary))
        self.run.finish(exit_code=STATUSES.get(status, 0))
        self.run = None
        wandb = import_tracker_library("wandb", "wandb", self.name)
        if wandb.setup().most_recent_active_run is None:  # `wandb.run` is None here even when one is open
            # finish() returns before W&B's service has written the run file (an offline run read right
            # after fit could hold only its header); stopping the service writes it. Skipped while the
            # user has a run of their own open: stopping the service would finish theirs too.
            wandb.teardown()

    def _require_run(self) -> Any:
        if self.run is None:
            raise RuntimeError("WandbTracker: start(run) first; the trainer does it when fit begins")
        return self.run
