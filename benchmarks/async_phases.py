"""Where a GRPO step's time goes, read back from the store, and the speedup asynchronous training can reach.

`benchmarks/async_grpo.py` calls `step_phases` at the end of each run (the store still open) and `speedup_bound`
on the synchronous runs' phases. The phases of step s, in wall-clock seconds:

- `interval`: from step s-1's metrics to step s's (what steps per hour count; step s-1's validation is in it);
- `waited`: the trainer waiting for step s's rollouts (`perf/rollout_seconds`);
- `update`: the optimizer step (`perf/update_seconds` less `perf/sync_seconds`);
- `publish`: new weights into the engine, waiting for the attempts under way included (`perf/sync_seconds`);
- `validation`: the held-out evaluation after step s-1, when it ran;
- `tool`: time some rollout of step s was before its first model call (the agent's wait on its tool);
- `decode`: time some model call of step s was in flight (a held call counts from when it was made);
- `runners_idle`: time in the interval no training rollout of any step was running;
- `tool_hidden`: time some training rollout was before its first model call while the trainer updated or published
  (the wait asynchronous training hides behind the update).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from agentgrad import semconv as sc
from agentgrad.store import Store

PHASES = ("interval", "waited", "update", "publish", "validation", "tool", "decode", "runners_idle", "tool_hidden")


@dataclass(frozen=True)
class StepPhases:
    step: int
    interval: float
    waited: float
    update: float
    publish: float
    validation: float
    tool: float
    decode: float
    runners_idle: float
    tool_hidden: float


@dataclass(frozen=True)
class StepClock:
    """When the trainer logged a step's metrics (epoch seconds), and its validation's, if it validated."""

    step: int
    logged: float
    validated: float | None = None


def union_seconds(intervals: Iterable[tuple[float, float]], within: tuple[float, float] | None = None) -> float:
    """The length of the union of `intervals`, clipped to `within` when given."""
    if within is not None:
        intervals = ((max(a, within[0]), min(b, within[1])) for a, b in intervals)
    total, end = 0.0, float("-inf")
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


async def step_phases(
    store: Store, history: Sequence[Mapping[str, float]], clocks: Sequence[StepClock]
) -> list[StepPhases]:
    """Each trained step's phases (see the module's docstring), from its logged metrics and the store's rollouts
    and spans; the first step has no interval (nothing before it to measure from) and is left out."""
    rollouts = [r for r in await store.query_rollouts(mode="train") if r.start_time and r.end_time]
    tools: dict[int, list[tuple[float, float]]] = {}  # per step: each rollout's time before its first model call
    calls: dict[int, list[tuple[float, float]]] = {}  # per step: each model call's time in flight
    for rollout in rollouts:
        step = int(rollout.metadata.get("step", 0))
        spans = [s for s in await store.query_spans(rollout.rollout_id) if sc.is_llm_call(s) and s.end_time]
        first_call = min((s.start_time for s in spans), default=rollout.end_time or 0.0)
        tools.setdefault(step, []).append((rollout.start_time or 0.0, first_call))
        calls.setdefault(step, []).extend((s.start_time, s.end_time or s.start_time) for s in spans)
    every_tool = [t for step_tools in tools.values() for t in step_tools]
    running = [(r.start_time or 0.0, r.end_time or 0.0) for r in rollouts]
    metrics = {int(h["step"]): h for h in history}
    phases = []
    for before, clock in itertools.pairwise(clocks):
        h = metrics[clock.step]
        publish = h.get("perf/sync_seconds", 0.0)
        update = h.get("perf/update_seconds", 0.0) - publish
        interval = (before.logged, clock.logged)
        phases.append(
            StepPhases(
                step=clock.step,
                interval=clock.logged - before.logged,
                waited=h.get("perf/rollout_seconds", 0.0),
                update=update,
                publish=publish,
                validation=(before.validated - before.logged) if before.validated else 0.0,
                tool=union_seconds(tools.get(clock.step, [])),
                decode=union_seconds(calls.get(clock.step, [])),
                runners_idle=clock.logged - before.logged - union_seconds(running, interval),
                tool_hidden=union_seconds(every_tool, (clock.logged - update - publish, clock.logged)),
            )
        )
    return phases


def mean_phases(runs: Sequence[Sequence[Mapping[str, float]]]) -> dict[str, float]:
    """Each phase's mean over the steps of all `runs` (each a list of `StepPhases` as dicts)."""
    steps = [p for run in runs for p in run]
    return {name: statistics.fmean(p[name] for p in steps) if steps else 0.0 for name in PHASES}


def speedup_bound(sync: Mapping[str, float]) -> float:
    """The most steps per hour asynchronous training (`max_staleness=1`) can gain over `sync`'s mean phases when
    the rollouts' decode and the update share the same cores: only the tool's wait can overlap with the CPU work.

    An asynchronous step still does all of a synchronous step's CPU work (`interval - tool`), and a step's
    rollouts still take their own `tool + decode`, so the step takes at least the larger of the two.
    """
    fastest = max(sync["interval"] - sync["tool"], sync["tool"] + sync["decode"])
    return sync["interval"] / fastest if fastest > 0 else float("nan")


def as_dicts(phases: Sequence[StepPhases]) -> list[dict[str, Any]]:
    return [asdict(p) for p in phases]
