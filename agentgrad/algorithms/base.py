"""What every algorithm shares: the context it runs in, running a batch of tasks, logging metrics."""

from __future__ import annotations

import asyncio
import math
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar, Unpack

from rich.console import Console

from agentgrad import semconv as sc
from agentgrad.algorithms.config import RunConfig
from agentgrad.redact import RedactingConsole
from agentgrad.serving import Listen
from agentgrad.store import Store
from agentgrad.tracking.base import RunTrackers
from agentgrad.types import Metric, NamedResources, Resource, Rollout, RolloutConfig, RolloutStatus

if TYPE_CHECKING:
    from agentgrad.distributed.group import TrainingGroup

DEFAULT_CONSOLE: Console = RedactingConsole()
"""Where an algorithm reports when its context names no console."""


@dataclass(frozen=True)
class RunContext:
    """What an algorithm runs in, laid out by the trainer's strategy and passed to `Algorithm.run`.

    `store`: where rollouts are queued and spans read. `gateway_port`: where an algorithm that serves
    the model it trains (GRPO, SFT) puts its gateway (0: any free port); the runners'
    `OPENAI_BASE_URL` points there. `listen`: the address that gateway binds and the one runners on
    other hosts reach it by (loopback by default). `console`: where progress is printed. `launcher`: what starts the
    training ranks of a sharded update (`train_processes > 1`): None for local processes, Ray's
    `RayGroup` under `strategy="ray"`. `trackers`: where every metric goes too (`report_to`), besides the store. `run_id`: the run
    (`store.get_run`) the metrics are logged under.
    """

    store: Store
    gateway_port: int = 0
    listen: Listen = field(default_factory=Listen)
    console: Console = field(default=DEFAULT_CONSOLE)
    launcher: Callable[..., TrainingGroup] | None = None
    trackers: RunTrackers | None = None
    run_id: str | None = None


@dataclass(frozen=True)
class Evaluation:
    """How a batch of rollouts went. Failed rollouts, and those that ended with no reward
    (`RolloutConfig(missing_reward="zero")`), count as reward 0 in `reward_mean`; `no_reward` says how many
    ended with none (failed for it or counted as 0)."""

    n: int
    succeeded: int
    reward_mean: float
    success_rate: float
    no_reward: int = 0

    @classmethod
    def of(cls, rollouts: Sequence[Rollout], success_threshold: float = 1.0) -> Evaluation:
        rewards = cls.rewards(rollouts)
        return cls(
            n=len(rollouts),
            succeeded=sum(r.status is RolloutStatus.SUCCEEDED for r in rollouts),
            reward_mean=statistics.fmean(rewards) if rewards else 0.0,
            success_rate=sum(reward >= success_threshold for reward in rewards) / len(rewards) if rewards else 0.0,
            no_reward=count_no_reward(rollouts),
        )

    @staticmethod
    def rewards(rollouts: Sequence[Rollout]) -> list[float]:
        """Each rollout's reward as `reward_mean` counts it: 0 for one that failed or ended with none."""
        return [r.reward if r.status is RolloutStatus.SUCCEEDED and r.reward is not None else 0.0 for r in rollouts]


GUARD_ALPHA = 0.05
"""The chance that `beats` takes a prompt of no use for a better one (one-sided), shared among the prompts compared."""


def beats(challenger: Sequence[float], current: Sequence[float], compared: int = 1) -> bool:
    """Whether a prompt's rewards beat the current prompt's on the same validation tasks by more than chance: the mean
    of the per-task differences past z standard errors of that mean, z for `GUARD_ALPHA` shared among the `compared`
    prompts the challenger was the best of (1.645 for one, 1.96 for two, 2.58 for ten): the best of several scores
    high by chance more often than one does. A tie never beats, nor a win of a few tasks that others lost (18 against
    15 of 32 with 7 won and 4 lost: the mean difference is under one error)."""
    differences = [a - b for a, b in zip(challenger, current, strict=True)]
    mean = statistics.fmean(differences) if differences else 0.0
    if mean <= 0:
        return False
    if len(differences) < 2:
        return True
    z = statistics.NormalDist().inv_cdf(1 - GUARD_ALPHA / max(compared, 1))
    return mean > z * statistics.stdev(differences) / math.sqrt(len(differences))


def count_no_reward(rollouts: Sequence[Rollout]) -> int:
    """How many rollouts ended with no reward: their agent returned none and emitted none (the runner marks them)."""
    return sum(bool(r.metadata.get(sc.NO_REWARD)) for r in rollouts)


NO_MODEL_CALLS_FIX = (
    "the agent's client calls another URL than the gateway of the model being trained. Build the client inside the "
    "agent from the `llm` resource (OpenAI(base_url=llm.base_url, api_key=llm.api_key)), or let it read "
    "OPENAI_BASE_URL when it is created during the rollout (a client built at import time, or given its own "
    "base_url, keeps calling that URL); ag.instrument_openai() then names each call's attempt"
)
"""What to do when rewarded rollouts recorded no model call through the gateway."""


async def flag_no_model_calls(store: Store, rollouts: Sequence[Rollout], calls: Sequence[int]) -> int:
    """Mark (in their metadata) the rollouts that reported a reward but recorded no model call; returns how many."""
    flagged = [r for r, n in zip(rollouts, calls) if n == 0 and r.reward is not None]
    for rollout in flagged:
        await store.update_rollout(rollout.rollout_id, metadata={sc.NO_MODEL_CALLS: True})
    return len(flagged)


def no_model_calls_error(algorithm: str, rollouts: int) -> RuntimeError:
    """The error of a training step none of whose `rollouts` (rewarded) recorded a model call: nothing to train on."""
    return RuntimeError(
        f"{algorithm}: none of the step's {rollouts} rewarded rollouts made a model call through the "
        f"gateway, so there is nothing to train on: {NO_MODEL_CALLS_FIX}"
    )


TOP_ERRORS = 3
"""How many distinct error messages a failure report prints."""


@dataclass(frozen=True)
class Failures:
    """The rollouts of a batch that did not succeed, with their most frequent errors (first lines)."""

    failed: int
    total: int
    errors: list[tuple[str, int]] = field(default_factory=list)
    """(error, occurrences), most frequent first, at most `TOP_ERRORS`."""

    def describe(self, label: str, store: Store) -> str:
        """A few lines for the console; when every rollout failed, the command that lists them."""
        if self.failed == 0:
            return ""
        head = (
            f"every one of the {self.total} {label} rollouts failed"
            if self.failed == self.total
            else f"{self.failed} of {self.total} {label} rollouts failed"
        )
        lines = [head + (":" if self.errors else "")]
        lines += [f"  {count}× {error}" for error, count in self.errors]
        if self.failed == self.total:
            lines.append(f"  see them with: agentgrad rollouts ls --store {store_location(store)} --status failed")
        return "\n".join(lines)


def store_location(store: Store) -> str:
    """What `--store` takes to open this store again: a SQLite path or a server URL."""
    return str(getattr(store, "path", None) or getattr(store, "url", None) or store)


async def collect_failures(store: Store, rollouts: Sequence[Rollout]) -> Failures:
    """Count the rollouts that did not succeed and read why from their latest attempts."""
    failed = [r for r in rollouts if r.status is not RolloutStatus.SUCCEEDED]
    reasons: Counter[str] = Counter()
    for rollout in failed:
        attempts = await store.query_attempts(rollout.rollout_id) if rollout.num_attempts else []
        error = next((a.error for a in reversed(attempts) if a.error), None)
        if error is None:
            error = f"attempt {attempts[-1].status.value}" if attempts else f"rollout {rollout.status.value}"
        reasons[error.strip().splitlines()[0][:300] if error.strip() else "(empty error)"] += 1
    return Failures(len(failed), len(rollouts), reasons.most_common(TOP_ERRORS))


class QueueOptions(TypedDict, total=False):
    """How `Algorithm.enqueue` queues a batch of rollouts: the resources they run with (default: the latest), their
    retry policy, and each one's metadata (one dict per task)."""

    resources_id: str | None
    config: RolloutConfig | None
    metadata: Sequence[dict[str, Any]] | None


R = TypeVar("R", covariant=True)


class Algorithm(Generic[R]):
    """Base of algorithms, generic over what `run` returns (which `Trainer.fit` returns too).

    `run(ctx, train_data, val_data)` starts by binding its `RunContext` (`self.bind(ctx)`); the
    helpers below (`store`, `console`, `run_rollouts`, ...) read it from there.
    """

    config: RunConfig = RunConfig()
    """The algorithm's settings (each algorithm's own `...Config`, a `RunConfig`), copied when overridden."""
    ctx: RunContext | None = None
    """The context of the run in progress (or of the last one), bound by `run` itself."""
    last_failures: Failures | None = None
    """What `run_rollouts` found wrong in its latest batch."""
    serves_gateway: bool = False
    """Whether `run` serves the model it trains through a gateway on `ctx.gateway_port` (GRPO, SFT)."""

    async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> R:
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        """What a run records as its configuration: `config`, and what an algorithm made of others adds (Joint: its
        APO's settings and `prompt_every`)."""
        return {"config": self.config}

    def bind(self, ctx: RunContext) -> RunContext:
        """Take `ctx` as this run's context (the first thing `run` does); returns it."""
        if not isinstance(ctx, RunContext):
            name = type(self).__name__
            raise TypeError(
                f"{name}.run takes a RunContext first, then train_data and val_data, not a "
                f"{type(ctx).__name__}: algorithms run inside a trainer, ag.Trainer(algorithm={name}(...), "
                "n_runners=...).fit(agent, train_data, val_data), or await "
                f"{name.lower()}.run(RunContext(store=...), train_data, val_data) on a store runners serve"
            )
        self.ctx = ctx
        return ctx

    @property
    def store(self) -> Store:
        if self.ctx is None:
            name = type(self).__name__
            raise RuntimeError(
                f"{name} has no store to queue rollouts in: algorithms run inside a trainer, "
                f"ag.Trainer(algorithm={name}(...), n_runners=...).fit(agent, train_data, val_data), "
                "which also starts the runners that execute the agent (or await "
                f"{name.lower()}.run(RunContext(store=...), train_data, val_data) on a store other runners serve)"
            )
        return self.ctx.store

    @property
    def console(self) -> Console:
        return self.ctx.console if self.ctx is not None else DEFAULT_CONSOLE

    async def publish(self, resources: NamedResources, metadata: dict[str, Any] | None = None) -> str:
        """Store a new version of the resources; returns its id for the rollouts to run with."""
        return (await self.store.add_resources(resources, metadata)).resources_id

    async def publish_with(self, name: str, resource: Resource, metadata: dict[str, Any] | None = None) -> str:
        """Publish the latest resources (the agent's prompt, say) with `name` set to `resource`."""
        latest = await self.store.get_latest_resources()
        return await self.publish({**(latest.resources if latest else {}), name: resource}, metadata)

    async def run_rollouts(
        self, tasks: Sequence[Any], *, mode: str, timeout: float | None = None, **queued: Unpack[QueueOptions]
    ) -> list[Rollout]:
        """Queue one rollout per task (`enqueue`) and wait for all of them (`gather`, up to `timeout` seconds);
        returns them in task order.

        Rollouts that did not succeed are reported on the console with their most frequent errors
        (and kept in `last_failures`), so a run whose every rollout fails says why.
        """
        ids = await self.enqueue(tasks, mode=mode, **queued)
        return await self.gather(ids, mode=mode, timeout=timeout)

    async def enqueue(self, tasks: Sequence[Any], *, mode: str, **queued: Unpack[QueueOptions]) -> list[str]:
        """Queue one rollout per task without waiting for them (runners start at once); returns their ids."""
        config, metadata = queued.get("config") or RolloutConfig(), queued.get("metadata")
        requests = [
            {
                "input": task,
                "mode": mode,
                "resources_id": queued.get("resources_id"),
                "config": config,
                "metadata": metadata[i] if metadata else {},
            }
            for i, task in enumerate(tasks)
        ]
        return [r.rollout_id for r in await self.store.enqueue_rollouts(requests)]

    async def gather(self, ids: Sequence[str], *, mode: str, timeout: float | None = None) -> list[Rollout]:
        """Wait for queued rollouts and return them in the order of `ids`, reporting those that failed."""
        finished = {r.rollout_id: r for r in await self.store.wait_for_rollouts(ids, timeout=timeout)}
        rollouts = [finished.get(rid) or await self.store.get_rollout(rid) for rid in ids]
        self.last_failures = await collect_failures(self.store, rollouts)
        if self.last_failures.failed:
            self.console.print(self.last_failures.describe(mode, self.store), highlight=False, markup=False)
        return rollouts

    async def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        """Write figures as store metrics, so the dashboard and the CLI show the same numbers, and to the run's
        trackers (MLflow, TensorBoard, W&B: `report_to`) at the same steps."""
        run_id = self.ctx.run_id if self.ctx is not None else None
        await self.store.add_metrics(
            [Metric(name=name, step=step, value=float(v), run_id=run_id) for name, v in values.items()]
        )
        if self.ctx is not None and self.ctx.trackers:
            await asyncio.to_thread(self.ctx.trackers.log_metrics, step, dict(values))

    async def note_best_checkpoint(self, best: BestOnValidation) -> None:
        """Name the checkpoint that validated best so far in the run's record, so a run that stops or fails later
        still says which one to serve (the trainer's final record says it too)."""
        run_id = self.ctx.run_id if self.ctx is not None else None
        if run_id is None or best.path is None:
            return
        run = await self.store.get_run(run_id)
        update = {"best_checkpoint": best.path, "best_checkpoint_validation": best.figures()}
        await self.store.put_run(run.model_copy(update=update))


class BestOnValidation(Protocol):
    """The checkpoint that validated best (`policy.checkpoints.BestCheckpoint`), as a run record reads it."""

    path: str | None

    def figures(self) -> dict[str, float]: ...


@dataclass
class Result:
    """What a run returns, whatever the algorithm (`Trainer.fit` too): the validation before the first step, after
    the last and at its best; the checkpoints kept, the newest and the best-validated; every step's figures."""

    steps: int
    initial: Evaluation | None
    final: Evaluation | None
    best: Evaluation | None = None
    checkpoint: str | None = None
    best_checkpoint: BestOnValidation | None = None
    checkpoints: list[str] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)
