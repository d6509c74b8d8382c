"""Baseline: run the agent over the data as it is and report how it does. No training."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from agentgrad.algorithms.base import Algorithm, Evaluation, RunContext
from agentgrad.types import RolloutConfig


class Baseline(Algorithm["dict[str, Evaluation]"]):
    """Evaluate each split once; write `<split>/reward_mean`, `<split>/success_rate` metrics.

    A rollout is a success when its reward reaches `success_threshold`. One whose agent reported no reward
    fails (`RolloutConfig.missing_reward`, default 'fail'; 'zero' counts it as 0); the table says how many had none.
    """

    def __init__(
        self, success_threshold: float = 1.0, config: RolloutConfig | None = None, report_to: Sequence[str] = ()
    ) -> None:
        self.success_threshold = success_threshold
        self.config = config
        self.report_to = tuple(report_to)  # trackers that get the figures too: "mlflow", "tensorboard", "wandb"

    async def run(
        self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None
    ) -> dict[str, Evaluation]:
        self.bind(ctx)
        results: dict[str, Evaluation] = {}
        for split, data in (("train", train_data), ("val", val_data)):
            if not data:
                continue
            rollouts = await self.run_rollouts(data, mode=split, config=self.config)
            result = Evaluation.of(rollouts, self.success_threshold)
            await self.log_metrics(
                0,
                {
                    f"{split}/reward_mean": result.reward_mean,
                    f"{split}/success_rate": result.success_rate,
                    f"{split}/completed_rate": result.succeeded / result.n,
                    f"{split}/no_reward": result.no_reward,
                },
            )
            results[split] = result
        self.console.print(results_table(results))
        return results


def results_table(results: dict[str, Evaluation], title: str = "Baseline") -> Table:
    table = Table(title=title)
    for column in ("split", "rollouts", "completed", "no reward", "reward mean", "success rate"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for split, r in results.items():
        table.add_row(
            split, str(r.n), str(r.succeeded), str(r.no_reward), f"{r.reward_mean:.3f}", f"{r.success_rate:.1%}"
        )
    return table
