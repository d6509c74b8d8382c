"""End to end: a Trainer with several runners over a dataset, everything found in the store afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import agentgrad as ag
from agentgrad.store import SqliteStore
from agentgrad.types import AttemptStatus, RolloutConfig, RolloutStatus


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
    algorithm = ag.Baseline(config=RolloutConfig(max_attempts=2))
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
