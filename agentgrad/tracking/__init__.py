"""Trackers: a run's metrics, configuration, tags and final figures sent to MLflow, TensorBoard or W&B.

`report_to=["mlflow", "tensorboard", "wandb"]` (on a `Trainer`, on an algorithm's config, `--report-to` on the
command line) names them; a `Tracker` object configures one (`MLflowTracker(tracking_uri=...)`). Each library
is an optional extra (`agentgrad[mlflow]`, `agentgrad[tensorboard]`, `agentgrad[wandb]`), imported only when asked.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentgrad.tracking.base import MissingTrackerError, RunInfo, RunTrackers, Tracker
from agentgrad.tracking.mlflow_tracker import MLflowTracker
from agentgrad.tracking.tensorboard_tracker import TensorBoardTracker
from agentgrad.tracking.wandb_tracker import WandbTracker

TRACKERS: dict[str, type[MLflowTracker] | type[TensorBoardTracker] | type[WandbTracker]] = {
    "mlflow": MLflowTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
}
"""The names `report_to` takes, each with its tracker's defaults."""

ReportTo = Iterable["str | Tracker"]


def open_trackers(report_to: ReportTo) -> RunTrackers:
    """The trackers `report_to` names (a name once; "none" or nothing: no tracker); an unknown name is a ValueError."""
    chosen: dict[str, Tracker] = {}
    for item in report_to:
        if isinstance(item, str):
            name = item.strip().lower()
            if name in ("", "none"):
                continue
            if name not in TRACKERS:
                raise ValueError(f"report_to names an unknown tracker {item!r}: use {', '.join(TRACKERS)} (or 'none')")
            chosen.setdefault(name, TRACKERS[name]())
        elif isinstance(item, Tracker):
            chosen[item.name] = item
        else:
            raise TypeError(
                f"report_to takes tracker names ({', '.join(TRACKERS)}) or Tracker objects, not {type(item).__name__}"
            )
    return RunTrackers(list(chosen.values()))


__all__ = [
    "TRACKERS",
    "MLflowTracker",
    "MissingTrackerError",
    "RunInfo",
    "RunTrackers",
    "TensorBoardTracker",
    "Tracker",
    "WandbTracker",
    "open_trackers",
]
