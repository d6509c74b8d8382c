"""Baseline: run the agent over the data as it is and report how it does. No training."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from agentgrad.algorithms.base import Algorithm, Evaluation, Result, RunContext
from agentgrad.algorithms.config import RunConfig, configured


@dataclass
class BaselineConfig(RunConfig):
    """A Baseline run's settings: the run's own (`RunConfig`), with no limit on an attempt's time by default."""

    rollout_timeout: float | None = None  # seconds one attempt may take (None: no limit)


@dataclass
class BaselineResult(Result):
    """Each split's evaluation (`result["val"]`, as `Trainer.dev` returns it), in the shape every run returns:
    `initial`, `final` and `best` are the validation split's (the training split's when there is none)."""

    splits: dict[str, Evaluation] = field(default_factory=dict)

    def __getitem__(self, split: str) -> Evaluation:
        return self.splits[split]

    def __iter__(self) -> Iterator[str]:
        return iter(self.splits)

    def __len__(self) -> int:
        return len(self.splits)


class Baseline(Algorithm[BaselineResult]):
    """Evaluate each split once: `Baseline(BaselineConfig(...), name=value)`; writes `<split>/reward_mean`,
    `<split>/success_rate` metrics.

    A rollout is a success when its reward reaches `success_threshold`. One whose agent reported no reward fails
    (`missing_reward`, default 'fail'; 'zero' counts it as 0); the table says how many had none.
    """

    config: BaselineConfig

    def __init__(self, config: BaselineConfig | None = None, **overrides: Any) -> None:
        self.config = configured(config, BaselineConfig, overrides, "Baseline")

    async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> BaselineResult:
        self.bind(ctx)
        cfg = self.config
        results: dict[str, Evaluation] = {}
        for split, data in (("train", train_data), ("val", list(val_data or [])[: cfg.val_size])):
            if not data:
                continue
            rollouts = await self.run_rollouts(data, mode=split, config=cfg.rollout_config())
            result = Evaluation.of(rollouts, cfg.success_threshold)
            metrics = {
                f"{split}/reward_mean": result.reward_mean,
                f"{split}/success_rate": result.success_rate,
                f"{split}/completed_rate": result.succeeded / result.n,
                f"{split}/no_reward": result.no_reward,
            }
            await self.log_metrics(0, metrics)
            results[split] = result
        self.console.print(results_table(results))
        shown = results.get("val") or results.get("train")
        return BaselineResult(steps=0, initial=shown, final=shown, best=shown, splits=results)


def results_table(results: dict[str, Evaluation], title: str = "Baseline") -> Table:
    table = Table(title=title)
    for column in ("split", "rollouts", "completed", "no reward", "reward mean", "success rate"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for split, r in results.items():
        table.add_row(
            split, str(r.n), str(r.succeeded), str(r.no_reward), f"{r.reward_mean:.3f}", f"{r.success_rate:.1%}"
        )
    return table
