"""The loop's checkpoints: where a run resumes, when it saves `step-N`, which are pruned, and the run's `Result` from
them. The folders themselves (written atomically, found, pruned, the best spared) are `policy/checkpoints.py`'s."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agentgrad.algorithms.base import Algorithm, Evaluation, Result
from agentgrad.algorithms.config import LoopConfig
from agentgrad.algorithms.rollback import RollbackGuard
from agentgrad.algorithms.updates import Update
from agentgrad.algorithms.validation import Validation
from agentgrad.engine.threads import in_own_thread
from agentgrad.policy.checkpoints import BestCheckpoint, complete_checkpoints, latest_checkpoint, prune_checkpoints


class Checkpoints:
    """`step-N` checkpoints under `checkpoint_dir`: where a run resumes, when to save, the newest kept and the
    best-validated one spared."""

    def __init__(self, cfg: LoopConfig) -> None:
        self.cfg = cfg
        self.directory = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        self.best = BestCheckpoint()

    def resume(self, update: Update, algorithm: Algorithm[Any]) -> tuple[int, list[dict[str, float]], dict[str, Any]]:
        """From the newest checkpoint, if any: (the step it saved, the run's history, its state); else a new run."""
        found = latest_checkpoint(self.directory)
        if found is None:
            return 0, [], {}
        state = in_own_thread(update.load, found)
        self.best = BestCheckpoint.restored(state.get("best_checkpoint"))  # kept from pruning; serve it
        algorithm.console.print(f"resumed from {found} (step {state['step']})")
        return int(state["step"]), list(state.get("history", [])), state

    def due(self, step: int) -> bool:
        every = self.cfg.checkpoint_every
        return self.directory is not None and (bool(every and step % every == 0) or step == self.cfg.steps)

    async def save(
        self, algorithm: Algorithm[Any], update: Update, step: int, score: float | None, state: dict[str, Any]
    ) -> None:
        """`step-N`, scored by this step's validation (None: none ran); the best is spared from pruning."""
        assert self.directory is not None
        saved = self.directory / f"step-{step}"
        improved = self.best.consider(saved, step, score)
        await asyncio.to_thread(in_own_thread, update.save, saved, {**state, "best_checkpoint": self.best.state()})
        prune_checkpoints(self.directory, self.cfg.keep_checkpoints, spare=self.best.path)
        if improved:
            await algorithm.note_best_checkpoint(self.best)

    def result(
        self,
        steps: int,
        initial: Evaluation | None,
        validation: Validation,
        guard: RollbackGuard | None,
        history: list[dict[str, float]],
    ) -> Result:
        if guard is not None and guard.best_path is not None and guard.best_step is not None:
            self.best.consider(guard.best_path, guard.best_step, guard.best)  # rollback's copy of the best weights
        last = latest_checkpoint(self.directory)
        return Result(
            steps=steps,
            initial=initial,
            final=validation.final,
            best=validation.best,
            checkpoint=str(last) if last else None,
            best_checkpoint=self.best if self.best.path else None,
            checkpoints=[str(p) for p in complete_checkpoints(self.directory)],
            history=history,
        )
