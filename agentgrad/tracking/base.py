"""What a tracker is (MLflow, TensorBoard, W&B, ...), and the fan-out that feeds the trackers of one run.

A tracker receives, in this order: `start(run)` (name, configuration, tags), `log_metrics(step, values)` for
every figure the algorithm writes to the store (same names, same steps), `log_artifact(path)` for the learning
curve and the best checkpoint's path, and `finish(summary, status)` with the run's final and best figures.
The tracking libraries are optional extras, imported only when a tracker starts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunInfo:
    """What a tracker is told when a run starts: its name, its full configuration (flattened) and its tags."""

    name: str
    config: Mapping[str, Any] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class Tracker(Protocol):
    """One destination of a run's metrics; `name` is what `report_to` calls it ("mlflow", "tensorboard", "wandb")."""

    name: str

    def start(self, run: RunInfo) -> None: ...

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def finish(self, summary: Mapping[str, float], status: str) -> None: ...


class MissingTrackerError(ImportError):
    """A tracker was asked for whose library is not installed."""


def import_tracker_library(module: str, extra: str, tracker: str) -> Any:
    """Import a tracker's library, or fail with the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingTrackerError(
            f"report_to={tracker!r} needs the {module!r} package, which is not installed ({exc}): "
            f"pip install 'agentgrad[{extra}]'"
        ) from exc


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"policy": {"engine": "local"}}` → `{"policy.engine": "local"}`: what trackers show as parameters."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            flat[name] = ",".join(map(str, value))
        else:
            flat[name] = value
    return flat


BEST_KEYS = ("val/accuracy", "val/reward_mean", "apo/best_score", "train/reward_mean")
"""The figure whose maximum a run's `best/` figures report, the first of these the run logged."""


def summarize(history: Mapping[str, Sequence[tuple[int, float]]]) -> dict[str, float]:
    """`final/<name>`: each figure's last value (by step); `best/<name>` and `best/step` for the first of
    `BEST_KEYS` logged (the earliest step of its maximum)."""
    figures = {f"final/{name}": sorted(points, key=lambda p: p[0])[-1][1] for name, points in history.items() if points}
    key = next((k for k in BEST_KEYS if history.get(k)), None)
    if key is not None:
        step, value = max(history[key], key=lambda point: (point[1], -point[0]))
        figures[f"best/{key}"] = value
        figures["best/step"] = float(step)
    return figures


@dataclass
class RunTrackers:
    """The trackers of one run: every call goes to each of them; the history of figures is kept to
    summarize the run (last and best values) and draw its learning curve."""

    trackers: Sequence[Tracker]
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def start(self, run: RunInfo) -> None:
        for tracker in self.trackers:
            tracker.start(run)

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self.history.setdefault(name, []).append((step, float(value)))
        for tracker in self.trackers:
            tracker.log_metrics(step, values)

    def log_artifact(self, path: Path) -> None:
        for tracker in self.trackers:
            tracker.log_artifact(path)

    def summary(self) -> dict[str, float]:
        return summarize(self.history)

    def finish(self, status: str, extra: Mapping[str, float] | None = None) -> None:
        """Close every tracker with the run's summary; one that fails to close is logged, the others still close."""
        summary = {**self.summary(), **(extra or {})}
        for tracker in self.trackers:
            try:
                tracker.finish(summary, status)
            except Exception:  # a tracker that cannot close must not hide the run's result or its error
                log.exception("tracker %s failed to finish", tracker.name)
