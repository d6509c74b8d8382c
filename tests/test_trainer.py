"""End to end: a Trainer with several runners over a dataset, everything found in the store afterwards."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import agentgrad as ag
from agentgrad.store import SqliteStore
from agentgrad.types import AttemptStatus, RolloutStatus, WorkerStatus


@ag.rollout
def square_agent(task: dict, prompt: ag.PromptTemplate) -> float:
    ag.emit_message(prompt.format(n=task["n"]))
    return task["n"] ** 2 / 400


def test_fit_with_four_runners_leaves_every_task_succeeded_with_reward_and_spans(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "run.db")
    trainer = ag.Trainer(n_runners=4, store=store, resources={"prompt": ag.PromptTemplate(template="square {n}")})
    results = trainer.fit(square_agent, [{"n": n} for n in range(20)])
    assert results["train"].n == 20 and results["train"].succeeded == 20

    async def check() -> None:
        rollouts = await store.query_rollouts(mode="train")
        assert sorted(r.input["n"] for r in rollouts) == list(range(20))
        workers = set()
        for rollout in rollouts:
            assert rollout.status is RolloutStatus.SUCCEEDED
            assert rollout.reward == rollout.input["n"] ** 2 / 400
            spans = await store.query_spans(rollout.rollout_id)
            names = [s.name for s in spans]
            assert names == ["agentgrad.message", "agentgrad.reward", "agentgrad.rollout"]
            assert spans[0].attributes["agentgrad.message.body"] == f"square {rollout.input['n']}"
            workers.add((await store.query_attempts(rollout.rollout_id))[0].worker_id)
        assert len(workers) > 1  # the work was shared
        metrics = {m.name: m.value for m in await store.query_metrics(prefix="train/")}
        assert metrics["train/success_rate"] == 0.0 and abs(metrics["train/reward_mean"] - sum(n * n for n in range(20)) / 400 / 20) < 1e-9

    asyncio.run(check())


@ag.rollout
def flaky_agent(task: dict, rollout: ag.Rollout) -> float:
    if task["fails"] == "always" or (task["fails"] == "once" and rollout.num_attempts == 1):
        raise ValueError(f"cannot do task {task['id']}")
    return 1.0


def test_exceptions_fail_the_attempt_with_the_traceback_recorded_and_are_retried() -> None:
    store = ag.MemoryStore()
    algorithm = ag.Baseline(max_attempts=2)
    data = [{"id": i, "fails": ["never", "once", "always"][i % 3]} for i in range(9)]
    results = ag.Trainer(algorithm, n_runners=3, store=store).fit(flaky_agent, data)
    assert results["train"].succeeded == 6 and results["train"].success_rate == 6 / 9

    async def check() -> None:
        for rollout in await store.query_rollouts():
            attempts = await store.query_attempts(rollout.rollout_id)
            kind = rollout.input["fails"]
            expected = {
                "never": [AttemptStatus.SUCCEEDED],
                "once": [AttemptStatus.FAILED, AttemptStatus.SUCCEEDED],
                "always": [AttemptStatus.FAILED, AttemptStatus.FAILED],
            }[kind]
            assert [a.status for a in attempts] == expected
            assert rollout.status is (RolloutStatus.FAILED if kind == "always" else RolloutStatus.SUCCEEDED)
            if kind != "never":
                first = attempts[0]
                assert first.error == f"ValueError: cannot do task {rollout.input['id']}"
                (exception,) = [s for s in await store.query_spans(rollout.rollout_id, first.attempt_id) if s.name == "agentgrad.exception"]
                assert exception.status.code == "ERROR"
                assert exception.attributes["exception.type"] == "ValueError"
                assert "raise ValueError" in exception.attributes["exception.stacktrace"]

    asyncio.run(check())


def test_dev_runs_the_data_once_without_the_configured_algorithm() -> None:
    class Exploding(ag.Algorithm):
        async def run(self, ctx, train_data, val_data):  # type: ignore[no-untyped-def]
            raise AssertionError("dev must not run the trainer's algorithm")

    results = ag.Trainer(Exploding(), store="memory").dev(lambda task: 0.5, [1, 2, 3])
    assert results["train"].n == 3 and results["train"].reward_mean == 0.5


def test_a_task_that_is_not_json_is_refused_with_its_index_and_value_before_anything_starts(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from agentgrad.store import StoreError

    class Point:
        def __repr__(self) -> str:
            return "Point(1, 2)"

    trainer = ag.Trainer(store="memory")

    async def no_model(agent):  # type: ignore[no-untyped-def]
        raise AssertionError("the local model was about to load")

    monkeypatch.setattr(trainer, "_local_policy", no_model)
    with pytest.raises(StoreError, match=r"task 2 of train_data\['where'\] is Point\(1, 2\), a Point"):
        trainer.fit(lambda task: 1.0, [{"where": 1}, {"where": 2}, {"where": Point()}])
    with pytest.raises(StoreError, match=r"task 0 of val_data\['n'\] is nan"):
        trainer.fit(lambda task: 1.0, [{"n": 1}], [{"n": float("nan")}])

    def asks_for_a_model(task: dict, llm: ag.LLM) -> float:
        return 1.0

    with pytest.raises(StoreError, match="task 0 of train_data"):
        trainer.dev(asks_for_a_model, [Point()])
    assert asyncio.run(trainer.store.query_rollouts()) == []  # nothing was enqueued


class DeadConnection(ag.MemoryStore):
    """A store whose connection for `worker` breaks after its first claim: that runner's loop dies with the rollout
    it claimed still running, as a runner whose store client fails does. `stopped` is set once the dead runner has
    said so (its last heartbeat)."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self.worker, self.claims, self.claimed, self.stopped = worker, 0, threading.Event(), threading.Event()

    async def dequeue_rollout(self, worker_id: str | None = None) -> Any:
        if worker_id == self.worker and self.claims:
            raise ag.StoreError(f"the store connection of {worker_id} is gone")
        claimed = await super().dequeue_rollout(worker_id)
        if worker_id == self.worker and claimed is not None:
            self.claims += 1
            self.claimed.set()
        return claimed

    async def heartbeat(self, worker_id: str, **kwargs: Any) -> Any:
        if worker_id == self.worker and kwargs.get("status") is WorkerStatus.STOPPED:
            self.stopped.set()
        return await super().heartbeat(worker_id, **kwargs)


STORE = DeadConnection("runner-0")


@ag.rollout
def outlives_its_runner(task: dict, rollout: Any) -> float:
    """Every rollout waits until the dying runner has claimed one (the other runner cannot take them all); that one
    is still running when its runner's loop has died (the attempt is left `running`)."""
    STORE.claimed.wait(30)
    if rollout.attempt.worker_id == STORE.worker:
        STORE.stopped.wait(30)
    return 1.0


def test_a_runner_thread_that_dies_has_its_attempts_given_up_and_run_by_another_runner() -> None:
    store = STORE
    results = ag.Trainer(n_runners=2, runner_concurrency=2, store=store).fit(outlives_its_runner, [{"i": i} for i in range(4)])
    assert store.stopped.is_set() and results["train"].succeeded == 4  # the dead runner's rollout ran on the other

    (orphaned,) = [r for r in asyncio.run(store.query_rollouts()) if r.num_attempts > 1]
    first, second = asyncio.run(store.query_attempts(orphaned.rollout_id))
    assert (first.worker_id, first.status, first.error) == ("runner-0", AttemptStatus.UNRESPONSIVE, "runner exited with code 1")
    assert (second.worker_id, second.status) == ("runner-1", AttemptStatus.SUCCEEDED)
