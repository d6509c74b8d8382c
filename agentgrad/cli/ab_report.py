"""`agentgrad ab report`: how the arms of an A/B split did over the rollouts seen so far.

Each rollout's arm is the one its model calls name (`agentgrad.ab.arm` on their spans); a rollout whose calls
name two arms is counted apart (it breaks stickiness). Per arm: rollouts, reward mean and standard deviation,
success rate; between the arms: the difference of reward means (second - first), its 95% confidence interval
and a two-sided p-value, by the normal approximation with Welch's standard error.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from agentgrad import semconv as sc
from agentgrad.store import Store
from agentgrad.types import RolloutStatus

Z_95 = 1.959963984540054
"""The normal quantile of a two-sided 95% interval."""


@dataclass(frozen=True)
class Arm:
    name: str
    rollouts: int
    reward_mean: float
    reward_std: float
    success_rate: float


@dataclass(frozen=True)
class ABReport:
    arms: list[Arm]
    difference: float | None  # reward mean of the second arm minus the first's
    interval: tuple[float, float] | None  # its 95% confidence interval
    p_value: float | None  # two-sided, of no difference
    mixed: int  # rollouts whose calls went to more than one arm
    unsplit: int  # finished rollouts with no call through a split


def compare(
    rewards: Mapping[str, Sequence[float]], success_threshold: float = 1.0, mixed: int = 0, unsplit: int = 0
) -> ABReport:
    """The report of the arms' rewards ({arm: [reward per rollout]}), arms in name order."""
    arms = [
        Arm(
            name,
            len(values),
            statistics.fmean(values) if values else 0.0,
            statistics.stdev(values) if len(values) > 1 else 0.0,
            sum(v >= success_threshold for v in values) / len(values) if values else 0.0,
        )
        for name, values in sorted(rewards.items())
    ]
    if len(arms) != 2 or min(a.rollouts for a in arms) < 2:
        return ABReport(arms, None, None, None, mixed, unsplit)
    first, second = arms
    difference = second.reward_mean - first.reward_mean
    se = math.sqrt(first.reward_std**2 / first.rollouts + second.reward_std**2 / second.rollouts)
    if se == 0:
        return ABReport(arms, difference, (difference, difference), 1.0 if difference == 0 else 0.0, mixed, unsplit)
    p_value = math.erfc(abs(difference / se) / math.sqrt(2))
    return ABReport(arms, difference, (difference - Z_95 * se, difference + Z_95 * se), p_value, mixed, unsplit)


async def collect(store: Store, mode: str | None = None, success_threshold: float = 1.0) -> ABReport:
    """The report over the store's finished rollouts (of `mode`, when given) whose calls went through a split."""
    rewards: dict[str, list[float]] = {}
    mixed = unsplit = 0
    succeeded = [r for r in await store.query_rollouts(mode=mode) if r.status is RolloutStatus.SUCCEEDED]
    spans_of = await store.query_spans_of([r.rollout_id for r in succeeded])
    for rollout in succeeded:
        arms = {s.attributes[sc.AB_ARM] for s in spans_of[rollout.rollout_id] if sc.AB_ARM in s.attributes}
        if not arms:
            unsplit += 1
        elif len(arms) > 1:
            mixed += 1
        else:
            rewards.setdefault(str(arms.pop()), []).append(rollout.reward or 0.0)
    return compare(rewards, success_threshold, mixed, unsplit)


async def print_report(console: Console, store: Store, mode: str | None, success_threshold: float) -> None:
    report = await collect(store, mode, success_threshold)
    table = Table(title="A/B arms")
    for column in ("arm", "rollouts", "reward mean", "reward std", "success rate"):
        table.add_column(column, justify="left" if column == "arm" else "right")
    for arm in report.arms:
        table.add_row(
            arm.name, str(arm.rollouts), f"{arm.reward_mean:.4f}", f"{arm.reward_std:.4f}", f"{arm.success_rate:.1%}"
        )
    console.print(table)
    if report.difference is None or report.interval is None or report.p_value is None:
        console.print("not enough rollouts on both arms to compare them (two or more each)", highlight=False)
    else:
        second, first = report.arms[1].name, report.arms[0].name
        low, high = report.interval
        console.print(
            f"reward {second} - {first}: {report.difference:+.4f}, 95% CI [{low:+.4f}, {high:+.4f}], "
            f"p = {report.p_value:.3g} (normal approximation, Welch's standard error)",
            highlight=False,
        )
    if report.mixed:
        console.print(f"{report.mixed} rollout(s) had calls on both arms and are left out", highlight=False)
