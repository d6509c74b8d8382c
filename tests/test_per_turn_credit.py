"""Per-turn credit (`credit="per_turn"`): rewards emitted mid-run pay the model calls before them, each call
is trained with its discounted return-to-go minus a leave-one-out baseline at its turn index.

The two-turn tests train a tabular softmax policy (no model) with the same advantage functions GRPO
uses, on tasks whose correct credit is known by construction: only one turn's choice earns reward.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from typing import Any

import pytest

import agentgrad as ag
from agentgrad.adapters import Trajectory
from agentgrad.algorithms.credit import (
    PerTurnCredit,
    leave_one_out_advantages,
    returns_to_go,
    token_advantages,
    turn_rewards,
)
from agentgrad.algorithms.grpo import GRPOConfig
from agentgrad.algorithms.roles import role_batches
from agentgrad.rollout.runner import Runner
from agentgrad.rollout.tracer import get_tracer
from agentgrad.store import MemoryStore
from agentgrad.types import Rollout, RolloutStatus, Span
from tests.helpers import grpo_batch

# ----------------------------------------------------------------------------- the pure functions, by hand


def test_returns_to_go_discount_later_rewards() -> None:
    assert returns_to_go([1.0, 0.0, 2.0], gamma=0.5) == [1.0 + 0.25 * 2.0, 1.0, 2.0]
    assert returns_to_go([1.0, 0.0, 2.0], gamma=1.0) == [3.0, 2.0, 2.0]
    assert returns_to_go([], gamma=0.9) == []


def test_the_baseline_is_the_mean_of_the_other_rollouts_at_the_same_turn() -> None:
    # three rollouts; the third ended after one turn
    advantages = leave_one_out_advantages([[3.0, 1.0], [1.0, 2.0], [2.0]])
    assert advantages[0] == [3.0 - (1.0 + 2.0) / 2, 1.0 - 2.0]
    assert advantages[1] == [1.0 - (3.0 + 2.0) / 2, 2.0 - 1.0]
    assert advantages[2] == [2.0 - (3.0 + 1.0) / 2]


def test_a_turn_no_other_rollout_reached_keeps_its_return() -> None:
    assert leave_one_out_advantages([[1.0, 5.0], [1.0]]) == [[0.0, 5.0], [0.0]]


def test_each_response_token_of_a_merged_trajectory_gets_its_calls_advantage() -> None:
    # prompt [1, 2], call a wrote [10, 11], a tool result [90], call b wrote [20]
    trajectory = Trajectory(
        token_ids=[1, 2, 10, 11, 90, 20], loss_mask=[0, 0, 1, 1, 0, 1], logprobs=[0.0] * 6, prompt_length=2,
        span_ids=["a", "b"], call_starts=[2, 5],
    )
    assert token_advantages(trajectory, {"a": 0.5, "b": -1.0}) == [0.5, 0.5, 0.5, -1.0]  # the result is masked


def test_credit_and_gamma_are_checked() -> None:
    with pytest.raises(ValueError, match="credit is 'final' or 'per_turn'"):
        GRPOConfig(credit="per_step")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma"):
        GRPOConfig(credit="per_turn", gamma=1.5)


# ----------------------------------------------------------------------------- rewards attach to the calls before them


def model_call(name: str, prompt: list[int], response: list[int], agent: str | None = None) -> None:
    """What the gateway records for a model call: a chat span with its token ids (written by the agent here)."""
    attributes: dict = {"agentgrad.agent.name": agent} if agent else {}
    attributes |= {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "policy",
        "gen_ai.input.messages": json.dumps([{"role": "user", "content": name}]),
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": name}]),
        "agentgrad.llm.prompt_token_ids": prompt, "agentgrad.llm.response_token_ids": response,
        "agentgrad.llm.response_logprobs": [-0.1] * len(response),
    }
    with get_tracer().start_as_current_span("chat", attributes=attributes):
        pass


async def test_an_emitted_reward_pays_the_calls_made_before_it_not_after() -> None:
    def agent(task: dict) -> None:
        model_call("plan", [1], [10])
        ag.emit_reward(0.5)  # "the plan was accepted"
        model_call("query", [2], [20])
        model_call("answer", [3], [30])
        ag.emit_reward(1.0)  # the final reward

    store = MemoryStore()
    queued = await store.enqueue_rollout({"x": 1})
    await Runner(agent, store, max_rollouts=1).run()
    spans = await store.query_spans(queued.rollout_id)
    assert turn_rewards(spans) == [0.5, 0.0, 1.0]
    assert returns_to_go(turn_rewards(spans), gamma=1.0) == [1.5, 1.0, 1.0]


async def test_a_roles_own_reward_pays_that_roles_last_call_and_is_not_the_rollouts_reward() -> None:
    def agent(task: dict) -> float:
        model_call("draft", [1], [10], agent="writer")
        model_call("review", [2], [20], agent="reviewer")
        ag.emit_reward(1.0, agent="reviewer")  # the reviewer's verdict was right
        model_call("fix", [3], [30], agent="writer")
        ag.emit_reward(0.25, agent="writer")
        return 0.5  # the rollout's reward: the runner emits it, untagged, after the last call

    store = MemoryStore()
    queued = await store.enqueue_rollout({"x": 1})
    await Runner(agent, store, max_rollouts=1).run()
    rollout = await store.get_rollout(queued.rollout_id)
    assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward == 0.5  # not the last role reward
    spans = await store.query_spans(queued.rollout_id)
    assert turn_rewards(spans) == [0.0, 1.0, 0.25 + 0.5]
    assert turn_rewards(spans, agent_match="writer") == [0.0, 0.75]  # the reviewer's reward pays no writer call
    assert turn_rewards(spans, agent_match="reviewer") == [1.0 + 0.5]  # the untagged final pays its last call


async def test_under_roles_per_turn_credit_pays_each_role_only_the_rewards_that_make_its_reward() -> None:
    roles = {"writer": "^writer$", "reviewer": "^reviewer$"}

    def agent_with(review: float, final: float) -> Any:
        def agent(task: dict) -> float:
            model_call("draft", [1], [10], agent="writer")
            model_call("review", [2], [20], agent="reviewer")
            ag.emit_reward(review, agent="reviewer")  # the reviewer's own reward: it pays the review, only
            model_call("fix", [3], [30], agent="writer")
            return final  # the rollout's reward: the writer's (it emits none of its own), paid to its last call

        return agent

    store = MemoryStore()
    members = []
    for review, final in ((1.0, 0.5), (0.0, 1.0)):  # one task group of two rollouts
        queued = await store.enqueue_rollout({"x": 1})
        await Runner(agent_with(review, final), store, max_rollouts=1).run()
        members.append((await store.get_rollout(queued.rollout_id), 0, await store.query_spans(queued.rollout_id)))
    parts = role_batches(members, roles, None, PerTurnCredit(gamma=1.0, skip_uniform=False))
    # writer: returns (0.5, 0.5) and (1.0, 1.0), each minus the other rollout's at its turn
    assert [(t.token_ids[-1], a) for t, a in parts["writer"].scored] == [(10, [-0.5]), (30, [-0.5]), (10, [0.5]), (30, [0.5])]
    # reviewer: its own 1.0 and 0.0, not the rollout's reward after it (that is the writer's)
    assert [(t.token_ids[-1], a) for t, a in parts["reviewer"].scored] == [(20, [1.0]), (20, [-1.0])]
    assert parts["reviewer"].rewards == [1.0, 0.0] and parts["writer"].rewards == [0.5, 1.0]


def test_a_roles_reward_names_its_role() -> None:
    with pytest.raises(ValueError, match="agent names the role"):
        ag.emit_reward(1.0, agent="")


# ----------------------------------------------------------------------------- GRPO's batch under per-turn credit


def span(rollout: Rollout, attempt_id: str, t: float, name: str, attributes: dict) -> Span:
    return Span(
        rollout_id=rollout.rollout_id, attempt_id=attempt_id, span_id=f"{rollout.rollout_id}-{t}", name=name,
        start_time=t, end_time=t + 0.5, attributes=attributes,
    )


def call_attributes(prompt: list[int], response: list[int]) -> dict:
    return {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "policy", "gen_ai.request.temperature": 1.0,
        "gen_ai.input.messages": json.dumps([{"role": "user", "content": "q"}]),
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": "a"}]),
        "agentgrad.llm.prompt_token_ids": prompt, "agentgrad.llm.response_token_ids": response,
        "agentgrad.llm.response_logprobs": [-0.1] * len(response),
    }


async def test_grpo_trains_each_call_of_a_merged_trajectory_with_its_own_turn_advantage() -> None:
    first_prompt, tool_call, result, answer = [1, 2, 3], [20, 21], [90], [30]
    second_prompt = first_prompt + tool_call + result
    # (events of each attempt): a call, or a reward emitted; final reward = the last one
    attempts = [
        [("call", first_prompt, tool_call), ("reward", 1.0), ("call", second_prompt, answer), ("reward", 0.0)],
        [("call", first_prompt, [40]), ("reward", 0.0), ("call", [*first_prompt, 40, *result], [50]), ("reward", 1.0)],
    ]
    store = MemoryStore()
    rollouts = await store.enqueue_rollouts([{"input": {"i": i}} for i in range(2)])
    finished = []
    for rollout, events in zip(rollouts, attempts):
        attempted = await store.dequeue_rollout("runner-0")
        assert attempted is not None
        spans = [
            span(rollout, attempted.attempt.attempt_id, t, "chat", call_attributes(e[1], e[2]))  # type: ignore[arg-type]
            if e[0] == "call"
            else span(rollout, attempted.attempt.attempt_id, t, "agentgrad.reward", {"agentgrad.reward": e[1]})
            for t, e in enumerate(events)
        ]
        await store.add_spans(spans)
        finished.append(rollout.model_copy(update={"status": RolloutStatus.SUCCEEDED, "reward": events[-1][1]}))
    batch = await grpo_batch(GRPOConfig(credit="per_turn", gamma=0.5), store, finished, [0, 0])
    (one, a1), (_, a2) = batch.data
    # returns-to-go: rollout 1 [1 + 0.5*0, 0] , rollout 2 [0 + 0.5*1, 1]; baselines: the other rollout's
    assert one.token_ids == second_prompt + answer and one.call_starts == [3, 6]
    assert a1 == [0.5, 0.5, 0.5, -1.0] and a2 == [-0.5, -0.5, 1.0]
    # the final reward's broadcast: one advantage per trajectory
    (_, b1), (_, b2) = (await grpo_batch(GRPOConfig(), store, finished, [0, 0])).data
    assert b1 == pytest.approx(-1.0, abs=1e-5) and b2 == pytest.approx(1.0, abs=1e-5)


async def test_a_group_that_ends_alike_is_trained_when_its_calls_earned_differently() -> None:
    query, fix, answer = ([1, 2], [20]), ([1, 2, 20, 90], [21]), ([5], [30])
    # both end right (final reward 1.0); the first ran a failing query before its fix; the last two, identical
    attempts = [
        [("call", *query), ("reward", 0.0), ("call", *fix), ("reward", 1.0), ("call", *answer), ("reward", 1.0)],
        [("call", query[0], [21]), ("reward", 1.0), ("call", *answer), ("reward", 1.0)],
        [("call", query[0], [21]), ("reward", 1.0), ("call", *answer), ("reward", 1.0)],
        [("call", query[0], [21]), ("reward", 1.0), ("call", *answer), ("reward", 1.0)],
    ]
    store = MemoryStore()
    rollouts = await store.enqueue_rollouts([{"input": {"i": i}} for i in range(len(attempts))])
    finished = []
    for rollout, events in zip(rollouts, attempts):
        attempted = await store.dequeue_rollout("runner-0")
        assert attempted is not None
        await store.add_spans([
            span(rollout, attempted.attempt.attempt_id, t, "chat", call_attributes(e[1], e[2]))  # type: ignore[misc]
            if e[0] == "call"
            else span(rollout, attempted.attempt.attempt_id, t, "agentgrad.reward", {"agentgrad.reward": e[1]})
            for t, e in enumerate(events)
        ])
        finished.append(rollout.model_copy(update={"status": RolloutStatus.SUCCEEDED, "reward": 1.0}))
    per_turn = await grpo_batch(GRPOConfig(credit="per_turn", gamma=0.0), store, finished, [0, 0, 1, 1])
    assert per_turn.metrics["train/groups_used"] == 1  # group 0; group 1's calls earned the same, turn by turn
    fixed = next(a for t, a in per_turn.data if t.token_ids == [1, 2, 20, 90, 21])  # the query and its fix, merged
    assert fixed[0] == -1.0 and fixed[-1] == 0.0  # the failing query against the other's right one at turn 0
    assert (await grpo_batch(GRPOConfig(), store, finished, [0, 0, 1, 1])).metrics["train/groups_used"] == 0


# ----------------------------------------------------------------------------- a two-turn task, credit known by construction


def softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    return [w / sum(weights) for w in weights]


def train_two_turns(
    credit: str, deciding: int, noise: float, seed: int, steps: int, group: int = 8, gamma: float = 0.5
) -> tuple[list[float], int]:
    """REINFORCE (learning rate 0.5) on a two-turn, two-choice tabular softmax policy.

    Choice 1 at the `deciding` turn earns reward 1, emitted right after that turn; the other turn's
    choice earns nothing, but the environment pays `noise` times a fair coin after it, whatever was chosen.
    `final`: the attempt's total reward minus the mean of the others' (the same baseline and scale as
    per-turn, so only the credit differs; n/(n-1) times GRPO's mean-centred advantage), for every turn;
    `per_turn`: leave-one-out advantages of each turn's return-to-go. Returns P(choice 1) at each turn
    after `steps` steps, and the step after which the deciding turn's P(choice 1) stayed >= 0.9.
    """
    rng, lr = random.Random(seed), 0.5
    logits = [[0.0, 0.0], [0.0, 0.0]]
    settled = 0
    for step in range(steps):
        samples = []
        for _ in range(group):
            choices = [int(rng.random() >= softmax(logits[t])[0]) for t in range(2)]
            rewards = [0.0, 0.0]
            rewards[deciding] = float(choices[deciding] == 1)
            rewards[1 - deciding] = noise * float(rng.random() < 0.5)
            samples.append((choices, rewards))
        if credit == "final":
            advantages = [[a, a] for (a,) in leave_one_out_advantages([[sum(r)] for _, r in samples])]
        else:
            advantages = leave_one_out_advantages([returns_to_go(r, gamma) for _, r in samples])
        for (choices, _), advantage in zip(samples, advantages):
            for t in range(2):
                probabilities = softmax(logits[t])
                for k in range(2):
                    logits[t][k] += lr * advantage[t] * ((k == choices[t]) - probabilities[k]) / group
        if softmax(logits[deciding])[1] < 0.9:
            settled = step + 1
    return [softmax(logits[t])[1] for t in range(2)], settled


@pytest.mark.parametrize("deciding", [0, 1], ids=["first-turn-decides", "second-turn-decides"])
def test_per_turn_credit_settles_on_the_deciding_turn_in_fewer_steps_than_broadcast(deciding: int) -> None:
    """The other turn's coin is noise in every broadcast advantage; per-turn keeps it out of the deciding
    turn's (second decides) or discounts it by gamma (first decides): a lower-variance gradient."""
    settled = {
        credit: [train_two_turns(credit, deciding, 2.0, seed, 80, group=4)[1] for seed in range(30)]
        for credit in ("final", "per_turn")
    }
    assert statistics.fmean(settled["per_turn"]) < statistics.fmean(settled["final"]) - 1.0, settled
    assert max(settled["per_turn"]) <= max(settled["final"]), settled


def test_per_turn_credit_leaves_an_irrelevant_later_turn_exactly_unreinforced() -> None:
    drift = []
    for seed in range(10):
        per_turn, _ = train_two_turns("per_turn", 0, 0.0, seed, 40)
        broadcast, _ = train_two_turns("final", 0, 0.0, seed, 40)
        assert per_turn[0] > 0.9 and per_turn[1] == 0.5  # the second turn's policy never moved
        assert broadcast[0] > 0.9
        drift.append(abs(broadcast[1] - 0.5))
    assert statistics.fmean(drift) > 0.02  # broadcast pushed it around with the first turn's reward


def test_per_turn_credit_reinforces_an_irrelevant_earlier_turn_less_than_broadcast() -> None:
    drift = {
        credit: statistics.fmean(abs(train_two_turns(credit, 1, 0.0, seed, 40)[0][0] - 0.5) for seed in range(20))
        for credit in ("final", "per_turn")
    }
    assert drift["per_turn"] < 0.75 * drift["final"], drift


def test_the_update_takes_one_advantage_per_response_token() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentgrad.algorithms.grpo_update import grpo_update
    from agentgrad.engine.training import ScoredSequence, sequence_logprobs

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    ))
    prompt, first_call, tool_result, second_call = [1, 2, 3], [20, 21], [5], [30, 31]
    tokens = prompt + first_call + tool_result + second_call
    sequence = [ScoredSequence(tokens, len(prompt))]

    def logprobs() -> list[float]:
        with torch.no_grad():
            return sequence_logprobs(model, sequence)[0].tolist()

    before = logprobs()
    trajectory = Trajectory(
        token_ids=tokens, loss_mask=[0, 0, 0, 1, 1, 0, 1, 1], logprobs=[0.0] * 3 + before, prompt_length=3,
        span_ids=["a", "b"], call_starts=[3, 6],
    )
    per_token = token_advantages(trajectory, {"a": 1.0, "b": -1.0})
    grpo_update(model, torch.optim.AdamW(model.parameters(), lr=1e-2), [(trajectory, per_token)], GRPOConfig())
    after = logprobs()
    assert after[0] > before[0] and after[1] > before[1]  # the first call's tokens, advantage +1: raised
    assert after[3] < before[3] and after[4] < before[4]  # the second call's, advantage -1: lowered
