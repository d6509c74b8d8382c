"""Emitters write spans into the current attempt, and do nothing outside one."""

from __future__ import annotations

import pytest

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.algorithms.roles import role_reward
from agentgrad.rollout.runner import Runner
from agentgrad.types import AttemptStatus, RolloutStatus, Span


async def run_once(agent) -> list[Span]:  # type: ignore[no-untyped-def]
    store = ag.MemoryStore()
    queued = await store.enqueue_rollout({"x": 1})
    await Runner(agent, store, max_rollouts=1).run()
    return await store.query_spans(queued.rollout_id)


async def test_reward_dimensions_keep_a_primary_that_becomes_the_final_reward() -> None:
    def agent(task: dict) -> None:
        ag.emit_reward({"correct": 1.0, "format": 0.5}, primary="correct")

    spans = await run_once(agent)
    (reward,) = [s for s in spans if s.name == "agentgrad.reward"]
    assert reward.attributes == {
        "agentgrad.reward": 1.0,
        "agentgrad.reward.correct": 1.0,
        "agentgrad.reward.format": 0.5,
        "agentgrad.reward.primary": "correct",
    }


async def test_a_returned_reward_keyed_by_role_is_recorded_as_emitting_it_with_the_first_key_primary() -> None:
    store = ag.MemoryStore()
    returned, emitted = await store.enqueue_rollouts([{"input": "returned"}, {"input": "emitted"}])

    def agent(task: str) -> dict[str, float] | None:
        if task == "emitted":
            ag.emit_reward({"solver": 1.0, "verifier": 0.0}, primary="solver")
            return None
        return {"solver": 1.0, "verifier": 0.0}  # the same reward, returned

    await Runner(agent, store, max_rollouts=2).run()
    recorded = []
    for queued in (returned, emitted):
        rollout = await store.get_rollout(queued.rollout_id)
        (reward,) = [s for s in await store.query_spans(queued.rollout_id) if s.name == sc.REWARD_SPAN]
        recorded.append((rollout.status, rollout.reward, reward.attributes))
        assert role_reward([reward], "verifier", "^verifier$", fallback=0.5) == 0.0  # the verifier trains on its own
    assert recorded[0] == recorded[1] == (RolloutStatus.SUCCEEDED, 1.0, {
        "agentgrad.reward": 1.0, "agentgrad.reward.solver": 1.0, "agentgrad.reward.verifier": 0.0,
        "agentgrad.reward.primary": "solver",
    })  # fmt: skip


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({}, "returned an empty dict"),
        ({"solver": "1"}, "each is a non-empty name and a finite number"),
        ({"solver": float("nan")}, "each is a non-empty name and a finite number"),
        ({"": 1.0}, "each is a non-empty name and a finite number"),
    ],
    ids=["empty", "not-a-number", "nan", "no-name"],
)
async def test_a_returned_reward_dict_that_is_not_names_and_numbers_fails_the_attempt_saying_so(
    value: dict[str, object], says: str
) -> None:
    store = ag.MemoryStore()
    queued = await store.enqueue_rollout("t")
    await Runner(lambda task: value, store, max_rollouts=1).run()
    (attempt,) = await store.query_attempts(queued.rollout_id)
    assert attempt.status is AttemptStatus.FAILED and says in (attempt.error or "")


def test_reward_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="name the one to train on"):
        ag.emit_reward({"a": 1.0, "b": 0.0})
    with pytest.raises(ValueError, match="'c' is not among"):
        ag.emit_reward({"a": 1.0}, primary="c")
    with pytest.raises(TypeError, match="not str"):
        ag.emit_reward("1.0")  # type: ignore[arg-type]


async def test_messages_objects_annotations_and_operations_are_recorded() -> None:
    @ag.operation
    def lookup(key: str, default: int = 0) -> dict:
        return {"key": key, "value": 42}

    @ag.operation("renamed")
    async def fetch(n: int) -> int:
        return n + 1

    async def agent(task: dict) -> float:
        ag.emit_message("thinking", step=1)
        ag.emit_object({"plan": ["a", "b"]})
        ag.emit_annotation({"judge": "good", "tags": ["x"]})
        lookup("k")
        await fetch(1)
        try:
            with ag.operation("risky"):
                raise KeyError("missing")
        except KeyError:
            pass
        return 0.0

    spans = {s.name: s for s in await run_once(agent)}
    assert spans["agentgrad.message"].attributes == {"agentgrad.message.body": "thinking", "step": 1}
    assert spans["agentgrad.object"].attributes["agentgrad.object.json"] == '{"plan": ["a", "b"]}'
    assert spans["agentgrad.annotation"].attributes == {
        "agentgrad.annotation.judge": "good",
        "agentgrad.annotation.tags": '["x"]',
    }
    assert spans["lookup"].attributes["agentgrad.operation.input"] == '{"key": "k"}'
    assert spans["lookup"].attributes["agentgrad.operation.output"] == '{"key": "k", "value": 42}'
    assert spans["renamed"].attributes["agentgrad.operation.output"] == "2"
    assert spans["risky"].status.code == "ERROR" and spans["risky"].attributes["exception.type"] == "KeyError"


def test_emitters_outside_a_rollout_do_nothing_and_decorated_functions_still_work() -> None:
    @ag.operation
    def double(x: int) -> int:
        return 2 * x

    ag.emit_reward(1.0)
    ag.emit_message("nobody listens")
    assert double(4) == 8


async def test_emit_span_records_a_finished_span_with_its_times_and_error_under_the_attempt() -> None:
    def agent(task: dict) -> float:
        ag.emit_span("lookup", {"query": "q", "hits": [1, 2], "meta": {"k": 3}}, start_time=100.0, end_time=102.5)
        ag.emit_span("fetch", error="timed out")
        return 1.0

    spans = await run_once(agent)
    by_name = {s.name: s for s in spans}
    lookup, fetch, root = by_name["lookup"], by_name["fetch"], by_name[sc.ROLLOUT_SPAN]
    assert (lookup.start_time, lookup.end_time) == (100.0, 102.5)
    assert lookup.attributes == {"query": "q", "hits": "[1, 2]", "meta": '{"k": 3}'}
    assert (fetch.status.code, fetch.status.description) == ("ERROR", "timed out")
    assert lookup.parent_id == fetch.parent_id == root.span_id


async def test_the_standard_opentelemetry_api_inside_an_attempt_lands_in_it() -> None:
    from opentelemetry import trace

    def agent(task: dict) -> float:
        with trace.get_tracer("my.app").start_as_current_span("step", attributes={"n": 1}):
            pass
        return 1.0

    spans = await run_once(agent)
    (step,) = [s for s in spans if s.name == "step"]
    (root,) = [s for s in spans if s.name == sc.ROLLOUT_SPAN]
    assert step.attributes == {"n": 1} and step.parent_id == root.span_id


async def test_a_frameworks_own_model_call_span_stays_a_step_but_is_not_read_as_a_model_call() -> None:
    from opentelemetry import trace

    def agent(task: dict) -> float:
        with trace.get_tracer("some.framework").start_as_current_span("chat m", attributes={sc.GEN_AI_OPERATION: "chat"}):
            pass
        return 1.0

    (step,) = [s for s in await run_once(agent) if s.name == "chat m"]
    assert not sc.is_llm_call(step) and step.attributes[sc.FRAMEWORK_OPERATION] == "chat"
