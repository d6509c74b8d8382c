"""The planner -> executor -> verifier example: each agent on its own route, the send-back on a wrong verdict, and
a grader that pays each role for its own job. Against a scripted upstream (the engine trains it in
`python -m examples.pev.train`)."""

from __future__ import annotations

from typing import Any

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.rollout.runner import Runner
from examples.pev.agents import EXECUTOR, PLANNER, VERIFIER, Outcome, grade, make_splits, plan_execute_verify, value_of
from tests.conftest import Served, Upstream

TASK = {"question": "Eli has 4 boxes of 11 apples and eats 3 apples. How many apples are left?", "answer": 41}


def answer(content: str) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion", "model": "policy", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}


async def test_a_wrong_verdict_sends_the_plan_back_once_and_each_agent_calls_on_its_own_route(
    upstream: Upstream, served: Served
) -> None:
    script = ["Plan: 4 + 11 - 3", "Verdict: wrong", "Plan: 4 * 11 - 3", "calculate: 4 * 11 - 3", "Answer: 41"]
    upstream.fake.answers.extend(answer(reply) for reply in script)
    queued = await served.store.enqueue_rollout(TASK)
    await served.store.add_resources({"llm": ag.LLM(base_url=served.url + "/v1", model="policy", proxied=True)})
    await Runner(plan_execute_verify, served.store, max_rollouts=1).run()
    await served.gateway.flush()
    spans = await served.store.query_spans(queued.rollout_id)
    agents = [s.attributes.get(sc.AGENT_NAME) for s in sorted(spans, key=lambda s: s.start_time) if sc.is_llm_call(s)]
    assert agents == [PLANNER, VERIFIER, PLANNER, EXECUTOR, EXECUTOR]
    (reward,) = [s for s in spans if s.name == sc.REWARD_SPAN]
    assert {k: v for k, v in reward.attributes.items() if k.startswith("agentgrad.reward.")} == {
        "agentgrad.reward.answer": 1.0, "agentgrad.reward.planner": 1.0, "agentgrad.reward.executor": 1.0,
        "agentgrad.reward.verifier": 1.0, "agentgrad.reward.primary": "answer"}  # the verifier was right: 4+11-3 != 41
    assert (await served.store.get_rollout(queued.rollout_id)).reward == 1.0


def test_each_role_is_paid_for_its_own_job() -> None:
    wrong_plan_executed = grade(TASK, Outcome("4 + 11 - 3", True, "4 + 11 - 3", 12))
    assert wrong_plan_executed == {"answer": 0.0, PLANNER: 0.0, EXECUTOR: 1.0, VERIFIER: 0.0}  # faithful, fooled
    right_plan_miscomputed = grade(TASK, Outcome("4 * 11 - 3", None, "4 * 11 - 3", 40))
    assert right_plan_miscomputed == {"answer": 0.0, PLANNER: 1.0, EXECUTOR: 0.0, VERIFIER: 0.0}  # no verdict: 0


def test_the_problems_are_distinct_positive_and_split_without_overlap() -> None:
    train, val = make_splits(n_train=200, n_val=40)
    assert {t["question"] for t in train}.isdisjoint({t["question"] for t in val})
    assert all(t["answer"] == value_of(t["plan"]) and t["answer"] > 0 for t in train + val)
    assert make_splits(n_train=200, n_val=40) == (train, val)
