"""What every algorithm shares: a store to work through, running a batch of tasks, logging metrics."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from rich.console import Console

from agentgrad.redact import RedactingConsole
from agentgrad.store import Store
from agentgrad.types import Metric, NamedResources, Resource, Rollout, RolloutConfig, RolloutStatus


@dataclass(frozen=True)
class Evaluation:
    """How a batch of rollouts went. Failed rollouts count as reward 0 in `reward_mean`."""

    n: int
    succeeded: int
    reward_mean: float
    success_rate: float

    @classmethod
    def of(cls, rollouts: Sequence[Rollout], success_threshold: float = 1.0) -> Evaluation:
        rewards = [r.reward if r.status is RolloutStatus.SUCCEEDED and r.reward is not None else 0.0 for r in rollouts]
        return cls(
            n=len(rollouts),
            succeeded=sum(r.status is RolloutStatus.SUCCEEDED for r in rollouts),
            reward_mean=statistics.fmean(rewards) if rewards else 0.0,
            success_rate=sum(reward >= success_threshold for reward in rewards) / len(rewards) if rewards else 0.0,
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
        head = (f"every one of the {self.total} {label} rollouts failed" if self.failed == self.total
                else f"{self.failed} of {self.total} {label} rollouts failed")
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


R = TypeVar("R", covariant=True)


class Algorithm(Generic[R]):
    """Base of algorithms, generic over what `run` returns (which `Trainer.fit` returns too).

    The trainer sets `store` (and `console`) before calling `run`.
    """

    _store: Store | None = None
    console: Console = RedactingConsole()
    last_failures: Failures | None = None
    """What `run_rollouts` found wrong in its latest batch."""
    rollout_config: RolloutConfig | None = None
    """Retry policy of rollouts queued without one; the `processes` strategy sets a heartbeat rule here."""
    serves_gateway: bool = False
    """Whether `run` serves the model it trains through a gateway on `gateway_port` (GRPO, SFT)."""
    gateway_port: int = 0
    """Where that gateway listens on loopback: the trainer sets it (`Trainer(gateway_port=...)`)."""

    @property
    def store(self) -> Store:
        if self._store is None:
            name = type(self).__name__
            raise RuntimeError(
                f"{name} has no store to queue rollouts in: algorithms run inside a trainer, "
                f"ag.Trainer(algorithm={name}(...), n_runners=...).fit(agent, train_data, val_data), "
                f"which also starts the runners that execute the agent (or set {name.lower()}.store = a Store "
                "that other runners serve, then await run(...))"
            )
        return self._store

    @store.setter
    def store(self, store: Store) -> None:
        self._store = store

    async def run(self, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> R:
        raise NotImplementedError

    async def publish(self, resources: NamedResources, metadata: dict[str, Any] | None = None) -> str:
        """Store a new version of the resources; returns its id for the rollouts to run with."""
        return (await self.store.add_resources(resources, metadata)).resources_id

    async def publish_with(self, name: str, resource: Resource, metadata: dict[str, Any] | None = None) -> str:
        """Publish the latest resources (the agent's prompt, say) with `name` set to `resource`."""
        latest = await self.store.get_latest_resources()
        return await self.publish({**(latest.resources if latest else {}), name: resource}, metadata)


    async def run_rollouts(
        self,
        tasks: Sequence[Any],
        *,
        mode: str,
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: Sequence[dict[str, Any]] | None = None,
        timeout: float | None = None,
    ) -> list[Rollout]:
        """Queue one rollout per task and wait for all of them; returns them in task order.

        Rollouts that did not succeed are reported on the console with their most frequent errors
        (and kept in `last_failures`), so a run whose every rollout fails says why.
        """
        config = config or self.rollout_config or RolloutConfig()
        requests = [
            {"input": task, "mode": mode, "resources_id": resources_id, "config": config,
             "metadata": metadata[i] if metadata else {}}
            for i, task in enumerate(tasks)
        ]
        queued = await self.store.enqueue_rollouts(requests)
        ids = [r.rollout_id for r in queued]
        finished = {r.rollout_id: r for r in await self.store.wait_for_rollouts(ids, timeout=timeout)}
        rollouts = [finished.get(rid) or await self.store.get_rollout(rid) for rid in ids]
        self.last_failures = await collect_failures(self.store, rollouts)
        if self.last_failures.failed:
            self.console.print(self.last_failures.describe(mode, self.store), highlight=False, markup=False)
        return rollouts

    async def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        """Write figures as store metrics, so the dashboard and the CLI show the same numbers."""
        await self.store.add_metrics([Metric(name=name, step=step, value=float(v)) for name, v in values.items()])


C = TypeVar("C")


def with_overrides(config: C, overrides: Mapping[str, Any], algorithm: str) -> C:
    """`config` with keyword overrides applied; an unknown name is a TypeError naming it."""
    for key, value in overrides.items():
        if not hasattr(config, key):
            raise TypeError(f"{algorithm} has no setting {key!r}; see {type(config).__name__}")
        setattr(config, key, value)
    return config
