"""Rollback on regression: keep the best-validated weights and optimizer, and return to them when validation
falls more than `drop` below its best, then go on at a lower learning rate or stop (`LoopConfig.rollback_on_drop`).

The guard works on any update (`algorithms/updates.py`: local, sharded, per role): it saves and restores it and
sets its `learning_rate`. Each best is saved as `best-step-N` beside the run's checkpoints (or in a folder of its
own), the older one deleted once the newer is written.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from agentgrad.algorithms.base import Algorithm
from agentgrad.algorithms.config import LoopConfig, RollbackAction
from agentgrad.engine.threads import in_own_thread

Verdict = Literal["best", "kept", "rolled_back", "stop"]


class Restorable(Protocol):
    """What the guard saves and restores: an update (`algorithms.updates.Update`)."""

    learning_rate: float

    def save(self, directory: Path, state: dict[str, Any]) -> None: ...

    def load(self, directory: Path) -> dict[str, Any]: ...


@dataclass
class RollbackEvent:
    """One return to the best checkpoint: when, from which figure to which best, and the learning rate after it."""

    step: int
    value: float
    best: float
    best_step: int
    learning_rate: float
    action: RollbackAction


@dataclass
class RollbackGuard:
    """Watches validation figures (higher is better); `check` says what happened at each one."""

    drop: float
    action: RollbackAction = "lower_lr"
    lr_factor: float = 0.5
    directory: Path | None = None
    best: float | None = None
    best_step: int | None = None
    best_path: Path | None = None
    learning_rate: float | None = None
    events: list[RollbackEvent] = field(default_factory=list)

    @classmethod
    def of(cls, cfg: LoopConfig, directory: Path | None) -> RollbackGuard | None:
        """The guard of `cfg.rollback_on_drop` (checked by the config), keeping the best beside the run's
        checkpoints in `directory`; None when it is off."""
        if cfg.rollback_on_drop is None:
            return None
        return cls(cfg.rollback_on_drop, cfg.rollback_action, cfg.rollback_lr_factor, directory)

    def check(self, step: int, value: float, update: Restorable) -> Verdict:
        """After a validation at `step`: save a new best, or return to the best when `value` fell more than `drop`
        below it (weights and optimizer; then a lower learning rate, or 'stop'), else keep going."""
        if self.learning_rate is None:
            self.learning_rate = update.learning_rate
        if self.best is None or value > self.best:
            self._save_best(step, value, update)
            return "best"
        if self.best - value <= self.drop or self.best_path is None or self.best_step is None:
            return "kept"
        update.load(self.best_path)
        if self.action == "lower_lr":
            self.learning_rate *= self.lr_factor
        update.learning_rate = self.learning_rate  # the checkpoint's optimizer state carries its own rate
        self.events.append(RollbackEvent(step, value, self.best, self.best_step, self.learning_rate, self.action))
        return "stop" if self.action == "stop" else "rolled_back"

    def _save_best(self, step: int, value: float, update: Restorable) -> None:
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="agentgrad-best-"))
        path = self.directory / f"best-step-{step}"
        if path.exists():
            shutil.rmtree(path)
        update.save(path, {"step": step, "best": value})
        if self.best_path is not None and self.best_path != path:
            shutil.rmtree(self.best_path, ignore_errors=True)
        self.best, self.best_step, self.best_path = value, step, path

    def describe(self, event: RollbackEvent) -> str:
        after = "stopping" if event.action == "stop" else f"going on at learning rate {event.learning_rate:.3g}"
        return (
            f"validation fell to {event.value:.3f} at step {event.step}, more than {self.drop} below its best "
            f"{event.best:.3f} (step {event.best_step}): back to {self.best_path} (weights and optimizer), {after}"
        )

    async def after_validation(self, algorithm: Algorithm[Any], step: int, value: float, update: Restorable) -> bool:
        """`check` after a validation (in a thread: it may save or load weights); a rollback is printed and recorded
        as metrics (`train/rollback` 1, `train/learning_rate`, `train/rollback_to_step`) at its step. Returns
        whether to stop."""
        verdict = await asyncio.to_thread(in_own_thread, self.check, step, value, update)
        if verdict in ("rolled_back", "stop"):
            event = self.events[-1]
            algorithm.console.print(self.describe(event), highlight=False, markup=False)
            await algorithm.log_metrics(
                step,
                {
                    "train/rollback": 1.0,
                    "train/learning_rate": event.learning_rate,
                    "train/rollback_to_step": event.best_step,
                },
            )
        return verdict == "stop"
