"""One run's trackers from start to finish: what the trainer calls around `fit` when `report_to` names any.

`start_run` describes the run (its algorithm's full configuration, with secrets left out, the trainer's layout,
the data sizes) and starts the trackers; `finish_run` logs the learning curve and a result file (final and best
figures, the checkpoint path) as artifacts and closes the trackers with the run's status.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentgrad.algorithms.base import Algorithm, Result
from agentgrad.redact import REDACTED, redact
from agentgrad.tracking.base import RunInfo, RunTrackers
from agentgrad.tracking.curve import draw_learning_curve

SECRET_NAME = re.compile(r"(api_?key|secret|password|(^|_)token$)", re.IGNORECASE)
"""Configuration fields whose values never reach a tracker (`token`, `hf_token`: yes; `max_tokens`: no)."""


def report_to_of(algorithm: Algorithm[Any]) -> tuple[str, ...]:
    """The trackers an algorithm's own settings name (`GRPOConfig(report_to=...)`, `APO(report_to=...)`)."""
    return tuple(algorithm.config.report_to)


def plain(value: Any) -> Any:
    """A configuration value as JSON-able data: dataclasses and pydantic models as dicts, secrets redacted."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _field(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return plain(value.model_dump(mode="json"))
    if isinstance(value, Mapping):
        return {str(k): _field(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return redact(str(value))


def _field(name: str, value: Any) -> Any:
    return REDACTED if value is not None and SECRET_NAME.search(name) else plain(value)


def algorithm_config(algorithm: Algorithm[Any]) -> dict[str, Any]:
    """The algorithm's full configuration (its config dataclass's fields, and what `Algorithm.settings` adds beside
    them), secrets redacted."""
    settings = algorithm.settings()
    return {**plain(settings.pop("config")), **plain(settings)}


def default_run_name(algorithm: Algorithm[Any]) -> str:
    return f"{type(algorithm).__name__.lower()}-{time.strftime('%Y%m%d-%H%M%S')}"


def start_run(
    trackers: RunTrackers, algorithm: Algorithm[Any], name: str, tags: Mapping[str, str], layout: Mapping[str, Any]
) -> None:
    """Start every tracker with the run's name, configuration (`algorithm`, `<algorithm's fields>`, `trainer`) and tags."""
    config = {"algorithm": type(algorithm).__name__, **algorithm_config(algorithm), "trainer": plain(dict(layout))}
    trackers.start(RunInfo(name=name, config=config, tags={"algorithm": type(algorithm).__name__, **tags}))


def result_checkpoint(result: object) -> str | None:
    """The checkpoint a run's `Result` names, if any (an algorithm of the user's may return something else)."""
    return result.checkpoint if isinstance(result, Result) else None


def finish_run(
    trackers: RunTrackers,
    name: str,
    artifacts_dir: Path,
    status: str,
    checkpoint: str | None = None,
    best_checkpoint: str | None = None,
) -> list[Path]:
    """Log the learning curve and `<name>-result.json` (summary, last and best checkpoint) as artifacts, then close
    the trackers with `status`; returns the artifacts written. An artifact that fails is reported by the tracker's
    own error."""
    written: list[Path] = []
    try:
        if status == "succeeded":
            curve = draw_learning_curve(trackers.history, artifacts_dir / f"{name}-learning_curve.png")
            if curve is not None:
                written.append(curve)
            result = artifacts_dir / f"{name}-result.json"
            result.parent.mkdir(parents=True, exist_ok=True)
            result.write_text(
                json.dumps(
                    {
                        "run": name,
                        "summary": trackers.summary(),
                        "checkpoint": checkpoint,
                        "best_checkpoint": best_checkpoint,
                    },
                    indent=2,
                )
            )
            written.append(result)
            for path in written:
                trackers.log_artifact(path)
    finally:
        trackers.finish(status)
    return written


def describe_trackers(trackers: RunTrackers) -> Iterable[str]:
    """A line per tracker for the console: where its run went."""
    for tracker in trackers.trackers:
        where = (
            getattr(tracker, "run_dir", None) or getattr(tracker, "tracking_uri", None) or getattr(tracker, "dir", None)
        )
        yield f"reporting to {tracker.name}" + (f" ({where})" if where else "")
