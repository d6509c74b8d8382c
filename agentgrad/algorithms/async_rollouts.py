"""Asynchronous rollouts: the next steps' groups run while a step trains, within a bound on staleness.

`RolloutPipeline` queues each step's groups (`group_size` rollouts of each of `prompts_per_step`
tasks) `lookahead` steps ahead of the one training, so runners never wait for an update: with
`lookahead=0` it is the synchronous loop (queue a step, wait for it, train), with `k` the rollouts
of steps s+1..s+k run while step s trains, and step s+k+1 is queued as soon as step s's weights are
published (`published`), so the runners go on through validation and checkpointing. A group's
version is the oldest weights version among its calls (every call's span names the version that
sampled it); `fresh_groups` drops, and counts, the
groups more than `max_staleness` updates behind the weights about to be trained (or keeps them, for
the importance weights to correct), and the attempts whose calls straddle a weights swap (the policy's
publish waits for attempts mid-flight, so only those it gave up on). A checkpoint keeps the queued steps (`state()`), so a resumed run
trains the groups already sampled instead of sampling them again, and none twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentgrad import semconv as sc
from agentgrad.algorithms.base import Algorithm
from agentgrad.algorithms.config import StaleGroups
from agentgrad.algorithms.sampling import TaskSampler, rollout_seed
from agentgrad.store import Store
from agentgrad.types import Rollout, RolloutConfig, RolloutStatus, Span


class PipelineSettings(Protocol):
    """The settings of a config (`LoopConfig`) that a pipeline reads."""

    steps: int
    prompts_per_step: int
    group_size: int
    seed: int
    max_staleness: int | None
    stale_groups: StaleGroups

    def rollout_config(self) -> RolloutConfig: ...


@dataclass(frozen=True)
class StepRollouts:
    """One step's finished rollouts in the order they were queued, with each one's group (task) index, and
    those to train on: the groups within the staleness bound (`fresh`: None when synchronous, all of them)."""

    step: int
    rollouts: list[Rollout]
    groups: list[int]
    fresh: Freshness | None = None

    @property
    def trained(self) -> tuple[list[Rollout], list[int]]:
        return (self.fresh.rollouts, self.fresh.groups) if self.fresh else (self.rollouts, self.groups)

    def metrics(self) -> dict[str, float]:
        return self.fresh.metrics() if self.fresh else {}


class RolloutPipeline:
    """Queues training rollouts `lookahead` steps ahead of the step being trained; `collect(step)` waits for one.

    `queued` (from a checkpoint's `state()`) are steps queued by an earlier run and not trained yet: they
    are adopted (re-queued from their task indices if the store no longer has them), and the sampler
    skips their tasks, so the run goes on with the same task order.
    """

    def __init__(
        self,
        algorithm: Algorithm[Any],
        train_data: Sequence[Any],
        sampler: TaskSampler,
        *,
        prompts_per_step: int,
        group_size: int,
        lookahead: int,
        last_step: int,
        resources_id: str,
        config: RolloutConfig,
        queued: Mapping[str, Mapping[str, list[Any]]] | None = None,
        max_staleness: int | None = None,
        stale_groups: StaleGroups = "drop",
        sampling_seed: int | None = None,
    ) -> None:
        self.algorithm, self.train_data, self.sampler = algorithm, train_data, sampler
        self.sampling_seed = sampling_seed  # each rollout's calls sample from `rollout_seed` (None: unseeded)
        self.prompts_per_step, self.group_size, self.lookahead = prompts_per_step, group_size, lookahead
        self.max_staleness, self.stale_groups = max_staleness, stale_groups
        self.last_step, self.resources_id, self.config = last_step, resources_id, config
        self.queued: dict[int, dict[str, list[Any]]] = {
            int(step): {"ids": list(q["ids"]), "tasks": list(q["tasks"])} for step, q in (queued or {}).items()
        }
        self.sampler.take(len(self.queued) * prompts_per_step)  # their tasks were drawn by the earlier run
        self.adopted = False

    @classmethod
    def of(
        cls,
        algorithm: Algorithm[Any],
        cfg: PipelineSettings,
        train_data: Sequence[Any],
        start: int,
        resources_id: str,
        queued: Mapping[str, Mapping[str, list[Any]]] | None = None,
        drawn: int | None = None,
    ) -> RolloutPipeline:
        """The pipeline of a run at `cfg`'s settings resumed after step `start` (0: a new run): the synchronous
        loop when `cfg.max_staleness` is None, else `max_staleness` steps queued ahead. `drawn`: the tasks the
        run had taken (its checkpoint's; dynamic sampling takes more than `prompts_per_step` a step)."""
        queued_tasks = len(queued or {}) * cfg.prompts_per_step  # taken again below, by the constructor
        skip = drawn - queued_tasks if drawn is not None else start * cfg.prompts_per_step
        return cls(
            algorithm,
            train_data,
            TaskSampler(len(train_data), cfg.seed, skip=skip),
            prompts_per_step=cfg.prompts_per_step,
            group_size=cfg.group_size,
            lookahead=cfg.max_staleness or 0,
            last_step=cfg.steps,
            resources_id=resources_id,
            config=cfg.rollout_config(),
            queued=queued,
            max_staleness=cfg.max_staleness,
            stale_groups=cfg.stale_groups,
            sampling_seed=cfg.seed,
        )

    async def collect(self, step: int, current_version: int = 0) -> StepRollouts:
        """Queue steps `step`..`step + lookahead` not queued yet, then wait for `step`'s rollouts; asynchronous,
        mark which groups are within `max_staleness` updates of `current_version` (the weights about to train)."""
        await self._adopt()
        await self._queue_steps(step, step + self.lookahead)
        queued = self.queued.pop(step)
        rollouts = await self.algorithm.gather(queued["ids"], mode="train")
        groups = [i // self.group_size for i in range(len(rollouts))]
        if self.max_staleness is None:
            return StepRollouts(step, rollouts, groups)
        store = self.algorithm.store
        fresh = await fresh_groups(store, rollouts, groups, current_version, self.max_staleness, self.stale_groups)
        return StepRollouts(step, rollouts, groups, fresh)

    async def published(self, step: int) -> None:
        """The weights trained at `step` are served now: queue ahead what `collect(step + 1)` would, so the runners
        sample on through what follows the update (validation, a checkpoint) instead of idling until the next
        collect. The bound holds: those rollouts are sampled by the weights `step + 1` trains. Synchronous
        (`lookahead=0`), nothing: the next step's rollouts are queued when it begins, as before."""
        if self.lookahead:
            await self._queue_steps(step + 1, step + 1 + self.lookahead)

    async def _queue_steps(self, first: int, last: int) -> None:
        """Queue the steps `first`..`last` not queued yet, in order (none past the run's last step)."""
        for ahead in range(first, min(last, self.last_step) + 1):
            if ahead not in self.queued:
                await self._queue(ahead, self.sampler.take(self.prompts_per_step))

    def state(self) -> dict[str, dict[str, list[Any]]]:
        """The steps queued and not trained yet (rollout ids and task indices), for a checkpoint."""
        return {
            str(step): {"ids": list(q["ids"]), "tasks": list(q["tasks"])} for step, q in sorted(self.queued.items())
        }

    async def draw_more(self, collected: StepRollouts) -> StepRollouts:
        """Dynamic sampling (synchronous runs): `prompts_per_step` more tasks' groups for `collected`'s step, queued
        now on the current weights and waited for, after the step's own (group indices and seeds go on from them)."""
        first = len(collected.rollouts)
        ids = await self._enqueue(collected.step, self.sampler.take(self.prompts_per_step), first)
        rollouts = await self.algorithm.gather(ids, mode="train")
        groups = [(first + i) // self.group_size for i in range(len(rollouts))]
        return StepRollouts(collected.step, collected.rollouts + rollouts, collected.groups + groups)

    async def _queue(self, step: int, task_indices: list[int]) -> None:
        self.queued[step] = {"ids": await self._enqueue(step, task_indices), "tasks": task_indices}

    async def _enqueue(self, step: int, task_indices: list[int], first: int = 0) -> list[str]:
        """Queue `group_size` rollouts of each task for `step`, the `first`-th of the step's rollouts onwards."""
        requests = [self.train_data[i] for i in task_indices for _ in range(self.group_size)]
        return await self.algorithm.enqueue(
            requests,
            mode="train",
            resources_id=self.resources_id,
            config=self.config,
            metadata=[self._metadata(step, first + i) for i in range(len(requests))],
        )

    def _metadata(self, step: int, index: int) -> dict[str, Any]:
        """The metadata of the `index`-th rollout queued for `step`: its step and group, and its sampling seed."""
        metadata: dict[str, Any] = {"step": step, "group": index // self.group_size}
        if self.sampling_seed is not None:
            metadata[sc.SAMPLING_SEED] = rollout_seed(self.sampling_seed, step, index)
        return metadata

    async def _adopt(self) -> None:
        """Re-queue, from their tasks, the adopted steps whose rollouts this store does not have."""
        if self.adopted:
            return
        self.adopted = True
        for step, queued in sorted(self.queued.items()):
            found = await self.algorithm.store.query_rollouts(rollout_ids=queued["ids"])
            if len(found) != len(queued["ids"]):
                await self._queue(step, queued["tasks"])


@dataclass
class Freshness:
    """The groups a step trains on after the staleness bound, and what the metrics say about them."""

    rollouts: list[Rollout]  # those kept, in order
    groups: list[int]
    max_staleness: int
    staleness: list[int] = field(default_factory=list)  # updates behind, per group with a recorded version
    dropped: int = 0  # groups over the bound, left out
    mixed: int = 0  # rollouts left out: their calls carry more than one version (published between them)

    def metrics(self) -> dict[str, float]:
        """`async/...`: the staleness distribution (groups per lag, up to the bound and over it), mean, max, dropped."""
        max_staleness = self.max_staleness
        counts = Counter(min(s, max_staleness + 1) for s in self.staleness)
        return {
            "async/staleness_mean": sum(self.staleness) / len(self.staleness) if self.staleness else 0.0,
            "async/staleness_max": max(self.staleness, default=0),
            **{f"async/staleness_{lag}": counts[lag] for lag in range(max_staleness + 1)},
            "async/staleness_over": counts[max_staleness + 1],
            "async/dropped_groups": self.dropped,
            "async/mixed_version_rollouts": self.mixed,
        }


def call_versions(spans: Sequence[Span]) -> list[int]:
    """The weights version of each of a rollout's model calls that names one, in order."""
    return [v for s in spans if sc.is_llm_call(s) and (v := sc.weights_version(s)) is not None]


async def fresh_groups(
    store: Store,
    rollouts: Sequence[Rollout],
    groups: Sequence[int],
    current_version: int,
    max_staleness: int,
    stale_groups: StaleGroups = "drop",
) -> Freshness:
    """The groups within `max_staleness` updates of `current_version` (all of them under `stale_groups="keep"`),
    less the rollouts whose calls carry two versions or more (a swap the publish could not wait out landed
    between them): every trained attempt was sampled by one version, and the mixed ones are counted.

    A group's staleness is `current_version` minus the oldest version among its successful rollouts' calls;
    a group with no recorded version counts as fresh. Failed rollouts pass through (the step counts them).
    """
    oldest: dict[int, int] = {}
    mixed: set[str] = set()
    spans = await store.query_spans_of([r.rollout_id for r in rollouts if r.status is RolloutStatus.SUCCEEDED])
    for rollout, group in zip(rollouts, groups):
        if rollout.status is not RolloutStatus.SUCCEEDED:
            continue
        versions = call_versions(spans[rollout.rollout_id])
        if len(set(versions)) > 1:
            mixed.add(rollout.rollout_id)
        if versions:
            oldest[group] = min(oldest.get(group, versions[0]), *versions)
    staleness = {g: max(current_version - v, 0) for g, v in oldest.items()}
    stale = {g for g, lag in staleness.items() if lag > max_staleness} if stale_groups == "drop" else set()
    kept = [(r, g) for r, g in zip(rollouts, groups) if g not in stale and r.rollout_id not in mixed]
    return Freshness(
        [r for r, _ in kept],
        [g for _, g in kept],
        max_staleness,
        [lag for g, lag in sorted(staleness.items())],
        dropped=len(stale),
        mixed=len(mixed),
    )
