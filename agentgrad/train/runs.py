"""Runs as records in the store: what a `fit` ran, where, and how it went, written when it starts and ends.

A run names its algorithm and full configuration (secrets redacted), its seed, the versions of agentgrad,
Python and the key packages, the machine, the git commit and dirty flag of the working directory (when it is a
checkout), its start and end, status, final and best figures (from the store's metrics of the run) and checkpoints.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from agentgrad.algorithms.base import Result
from agentgrad.tracking.base import summarize
from agentgrad.tracking.session import algorithm_config
from agentgrad.types import Metric, Run, RunStatus, now

KEY_PACKAGES = ("torch", "transformers", "peft", "vllm", "openai", "ray")
"""Packages whose versions a run records, those installed."""

GIT_SECONDS = 5.0
"""How long the git commands that read the working directory's commit may take."""


def versions() -> dict[str, str]:
    """agentgrad's, Python's and the installed key packages' versions (read from metadata, nothing imported)."""
    found = {"python": platform.python_version()}
    for name in ("agentgrad", *KEY_PACKAGES):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def machine() -> dict[str, Any]:
    """Host, platform, CPUs, and the accelerator when torch is already loaded with one."""
    info: dict[str, Any] = {"host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count()}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def git_state(folder: Path | None = None) -> dict[str, Any] | None:
    """The commit and dirty flag of the git checkout `folder` (default: the working directory) is in; None outside one."""
    where = str(folder or Path.cwd())
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=GIT_SECONDS
        )
        if commit.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=GIT_SECONDS,
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip()), "path": where}


def start_record(algorithm: Any, name: str, tags: dict[str, str], layout: dict[str, Any]) -> Run:
    """The record of a run starting now."""
    config = algorithm_config(algorithm)
    seed = config.get("seed")
    return Run(
        run_id=f"run-{uuid.uuid4().hex[:12]}",
        name=name,
        algorithm=type(algorithm).__name__,
        config={**config, "trainer": layout},
        seed=seed if isinstance(seed, int) else None,
        tags=tags,
        versions=versions(),
        machine=machine(),
        git=git_state(),
    )


def end_record(run: Run, status: RunStatus, metrics: list[Metric], result: Any, error: str | None) -> Run:
    """The record of `run` ended with `status`: final and best figures from its metrics, its checkpoints and the one
    that validated best (the result's `best_checkpoint`; for a run that failed, or an algorithm of the user's that
    returns no `Result`, the best its algorithm noted in `run` on the way)."""
    summary = summarize(_history(metrics))
    final = {k.removeprefix("final/"): v for k, v in summary.items() if k.startswith("final/")}
    best = {k.removeprefix("best/"): v for k, v in summary.items() if k.startswith("best/")}
    best_checkpoint, validation = run.best_checkpoint, run.best_checkpoint_validation
    kept: list[str] = []
    if isinstance(result, Result):
        kept = list(result.checkpoints) or ([result.checkpoint] if result.checkpoint else [])
        chosen = result.best_checkpoint
        best_checkpoint = chosen.path if chosen is not None else None
        validation = chosen.figures() if chosen is not None else {}
    if best_checkpoint and best_checkpoint not in kept:
        kept.append(best_checkpoint)
    return run.model_copy(
        update={
            "status": status,
            "end_time": now(),
            "final": final,
            "best": best,
            "checkpoints": kept,
            "best_checkpoint": best_checkpoint,
            "best_checkpoint_validation": validation,
            "error": error,
        }
    )


def _history(metrics: list[Metric]) -> dict[str, list[tuple[int, float]]]:
    history: dict[str, list[tuple[int, float]]] = {}
    for m in metrics:
        history.setdefault(m.name, []).append((m.step, m.value))
    return history
