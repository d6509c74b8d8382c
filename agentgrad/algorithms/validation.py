"""The loop's validation: the held-out tasks run on schedule, each result logged and handed to the rollback guard;
the last and the best kept for the run's `Result`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentgrad.algorithms.base import Algorithm, Evaluation
from agentgrad.algorithms.config import LoopConfig
from agentgrad.algorithms.rollback import RollbackGuard
from agentgrad.algorithms.updates import Update


class Validation:
    """Validation on the held-out tasks before the first step, every `val_every` steps and after the last; after
    each, the rollback guard's verdict (`stop` when it says so). Remembers the last and the best (`train` keeps
    the first)."""

    def __init__(self, algorithm: Algorithm[Any], cfg: LoopConfig, tasks: Sequence[Any], resources_id: str) -> None:
        self.algorithm, self.cfg, self.tasks, self.resources_id = algorithm, cfg, list(tasks), resources_id
        self.final: Evaluation | None = None
        self.best: Evaluation | None = None
        self.stop = False

    def due(self, step: int) -> bool:
        return bool(self.cfg.val_every and step % self.cfg.val_every == 0) or step == self.cfg.steps

    async def run(
        self, step: int, guard: RollbackGuard | None, update: Update, *, announce: bool = False
    ) -> Evaluation | None:
        """Validate after `step` (the run's start: `announce` prints it); None when there are no validation tasks."""
        if not self.tasks:
            return None
        rollouts = await self.algorithm.run_rollouts(
            self.tasks,
            mode="val",
            resources_id=self.resources_id,
            config=self.cfg.rollout_config(),
            metadata=[{"step": step}] * len(self.tasks),
        )
        result = Evaluation.of(rollouts, self.cfg.success_threshold)
        await self.record(step, result, guard, update, f"validation before step {step}" if announce else None)
        return result

    async def restore(self, step: int, result: Evaluation, guard: RollbackGuard | None, update: Update) -> Evaluation:
        """A resumed run's validation at its checkpoint's `step`, as the checkpoint saved it: not run again, so its
        rollouts are not in the store twice (a curve by step would count them twice) and no time goes to it."""
        await self.record(step, result, guard, update, f"validation at step {step}, saved with its checkpoint")
        return result

    async def record(
        self, step: int, result: Evaluation, guard: RollbackGuard | None, update: Update, said: str | None = None
    ) -> None:
        """Log `result` (this run's metrics: a resumed run's too; printed after `said` when given), keep it as the
        last (and maybe the best) and hand it to the rollback guard."""
        if said is not None:
            self.algorithm.console.print(
                f"{said}: accuracy {result.success_rate:.3f} reward {result.reward_mean:.3f} ({result.n} tasks)"
            )
        await self.algorithm.log_metrics(
            step,
            {
                "val/accuracy": result.success_rate,
                "val/reward_mean": result.reward_mean,
                "val/no_reward": result.no_reward,
            },
        )
        self.final = result
        if self.best is None or result.success_rate > self.best.success_rate:
            self.best = result
        if guard is not None:
            self.stop = await guard.after_validation(self.algorithm, step, result.success_rate, update)
