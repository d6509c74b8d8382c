"""Per-turn credit: the rewards an agent emits mid-run, turned into one advantage per model call.

GRPO's default (`credit="final"`) broadcasts the attempt's final reward to every call. With
`credit="per_turn"`, each reward span pays the model call that precedes it (span order), each call
is credited with its discounted return-to-go G_t = r_t + gamma r_{t+1} + ..., and its advantage is
G_t minus a leave-one-out baseline: the mean return at the same turn index over the *other*
rollouts of the task's group. That baseline is computed from rollouts sampled independently of
this one, so it cannot depend on the action taken at this turn, and E[(G_t - b) grad log pi] is
the policy gradient exactly (unbiased).

Why not normalise per turn index, as verl's RFC #7244 discusses: subtracting the mean *including*
the rollout itself and dividing by the std at that index makes the baseline and the scale functions
of the rollout's own return, hence of its own action, which biases the gradient (the same argument
Dr. GRPO makes against the std division); and the std at an index is computed over whichever
rollouts reached it, a set chosen by earlier actions. We divide by nothing: a rollout alone at its
turn index (the others ended earlier) keeps its return as the advantage, baseline 0, still unbiased.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from agentgrad import semconv as sc
from agentgrad.adapters import Trajectory, llm_calls, reward_spans
from agentgrad.types import Span

Credit = Literal["final", "per_turn"]
Advantage = float | list[float]  # one per trajectory (final), or one per response token (per_turn)
Pairs = list[tuple[Trajectory, Advantage]]
"""What a GRPO update trains on: each trajectory with its advantage."""


@dataclass
class Member:
    """One successful rollout of a step as credit assignment reads it: its spans, its reward (a role's own, under
    roles), its trajectories, its task group, and the part of its reward no span pays (`unpaid`: per-turn credit
    adds it at the last call)."""

    spans: Sequence[Span]
    reward: float
    trajectories: list[Trajectory]
    group: Hashable
    unpaid: float = 0.0


class CreditRule(Protocol):
    """How a step's members become (trajectory, advantage) pairs; also how many task groups they came from."""

    def pairs(self, members: Sequence[Member], agent_match: str | None) -> tuple[Pairs, int]: ...


@dataclass(frozen=True)
class FinalCredit:
    """`credit="final"`: every call of a rollout gets its reward's advantage within the task's group."""

    normalize_std: bool = True
    skip_uniform: bool = True

    def pairs(self, members: Sequence[Member], agent_match: str | None) -> tuple[Pairs, int]:
        rewards, groups = [m.reward for m in members], [m.group for m in members]
        useful = useful_groups(rewards, groups, self.skip_uniform)
        advantages = group_advantages(rewards, groups, self.normalize_std)
        pairs: Pairs = [
            (trajectory, advantage)
            for advantage, member in zip(advantages, members)
            if member.group in useful
            for trajectory in member.trajectories
        ]
        return pairs, len(useful)


@dataclass(frozen=True)
class PerTurnCredit:
    """`credit="per_turn"`: each call its discounted return-to-go minus a leave-one-out baseline (this module's
    docstring)."""

    gamma: float = 1.0
    skip_uniform: bool = True

    def pairs(self, members: Sequence[Member], agent_match: str | None) -> tuple[Pairs, int]:
        by_group: dict[Hashable, list[Member]] = {}
        for member in members:
            by_group.setdefault(member.group, []).append(member)
        pairs: Pairs = []
        kept = 0
        for group in by_group.values():
            returns = [returns_to_go(paid_turns(m, agent_match), self.gamma) for m in group]
            # uniform: every call's advantage is 0 (same final reward is not enough: a member that failed a query
            # and fixed it ends like one that wrote it right at once)
            flat = not any(a for row in leave_one_out_advantages(returns) for a in row)
            if len(group) < 2 or (self.skip_uniform and flat):
                continue
            kept += 1
            pairs += per_turn_pairs(group, returns, agent_match)
        return pairs, kept


def credit_rule(credit: Credit, *, gamma: float, normalize_std: bool, skip_uniform: bool) -> CreditRule:
    """The rule `credit` names."""
    if credit == "per_turn":
        return PerTurnCredit(gamma, skip_uniform)
    return FinalCredit(normalize_std, skip_uniform)


def group_advantages(
    rewards: Sequence[float], groups: Sequence[Hashable], normalize_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """Each reward minus its group's mean, divided by the group's std (population) when asked.

    `normalize_std=True` is GRPO's advantage; False keeps only the mean-centring (Dr. GRPO), which
    does not up-weight the groups whose rewards barely differ.
    """
    members: dict[Hashable, list[float]] = {}
    for reward, group in zip(rewards, groups):
        members.setdefault(group, []).append(reward)
    stats = {g: (statistics.fmean(v), statistics.pstdev(v)) for g, v in members.items()}
    advantages = []
    for reward, group in zip(rewards, groups):
        mean, std = stats[group]
        advantages.append((reward - mean) / (std + eps) if normalize_std else reward - mean)
    return advantages


def unpaid_reward(spans: Sequence[Span], final: float) -> float:
    """The part of a rollout's final reward no reward span pays: all of it when the rollout emitted none, or when
    the last it emitted differs (a judge's, or one set outside the spans); else nothing."""
    emitted = reward_spans(spans)  # the rollout's, not a role's own
    return final if not emitted or sc.reward(emitted[-1]) != final else 0.0


def useful_groups(rewards: Sequence[float], groups: Sequence[Hashable], skip_uniform: bool) -> set[Hashable]:
    """The task groups a GRPO step learns from: two members or more and, with `skip_uniform`, rewards that differ
    (a group whose members all scored alike has advantage 0 everywhere)."""
    by_group: dict[Hashable, list[float]] = {}
    for reward, group in zip(rewards, groups):
        by_group.setdefault(group, []).append(reward)
    return {g for g, values in by_group.items() if len(values) > 1 and (max(values) > min(values) or not skip_uniform)}


def turn_rewards(spans: Sequence[Span], agent_match: str | None = None) -> list[float]:
    """Per model call (as `llm_calls` orders them), the sum of the rewards emitted after it and before the next.

    A reward emitted before any call pays the first call. Calls of other agents (outside
    `agent_match`) are not turns: a reward after one pays the last matching call before it. A role's
    own reward (`emit_reward(value, agent="reviewer")`) pays only that agent's last call before it,
    and nothing when there is none among these calls.
    """
    calls = llm_calls(spans, agent_match)
    rewards = [0.0] * len(calls)
    if not calls:
        return rewards
    starts = [(c.span.start_time, c.span.sequence_id) for c in calls]
    for span in spans:
        value = sc.reward(span) if span.name == sc.REWARD_SPAN else None
        if value is None:
            continue
        owner = sc.reward_agent(span)
        at = (span.start_time, span.sequence_id)
        before = [i for i, start in enumerate(starts) if start < at and (owner is None or calls[i].agent == owner)]
        if before:
            rewards[before[-1]] += value
        elif owner is None:
            rewards[0] += value
    return rewards


def returns_to_go(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = r_t + gamma * G_{t+1}: what the call at turn t is credited with."""
    returns = [0.0] * len(rewards)
    following = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        following = rewards[t] + gamma * following
        returns[t] = following
    return returns


def leave_one_out_advantages(group_returns: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per rollout of one task's group, per turn: its return minus the mean return at that turn of the others.

    Rollouts may take different numbers of turns; a turn index no other rollout reached has baseline 0.
    """
    advantages = []
    for i, returns in enumerate(group_returns):
        row = []
        for t, value in enumerate(returns):
            others = [r[t] for j, r in enumerate(group_returns) if j != i and len(r) > t]
            row.append(value - (sum(others) / len(others) if others else 0.0))
        advantages.append(row)
    return advantages


def token_advantages(trajectory: Trajectory, call_advantage: dict[str, float]) -> list[float]:
    """Per response token of `trajectory` (from `prompt_length` on), the advantage of the call that wrote it.

    A trajectory may hold several calls merged by `to_trajectories`; `call_starts[k]` is where call
    k's response begins. Tokens between calls (tool results) are masked out of the loss anyway.
    """
    per_token = [0.0] * (len(trajectory.token_ids) - trajectory.prompt_length)
    bounds = [*trajectory.call_starts, len(trajectory.token_ids)]
    for k, span_id in enumerate(trajectory.span_ids):
        value = call_advantage[span_id]
        for p in range(bounds[k], bounds[k + 1]):
            per_token[p - trajectory.prompt_length] = value
    return per_token


def paid_turns(member: Member, agent_match: str | None) -> list[float]:
    """Per model call of `member`, the rewards emitted after it (`turn_rewards`), its `unpaid` reward (its final
    reward when no span pays it: a judge's, or one set outside the spans) added at its last call, so the emitted
    rewards stay as intermediate ones."""
    rewards = turn_rewards(member.spans, agent_match)
    if rewards:
        rewards[-1] += member.unpaid
    return rewards


def per_turn_pairs(
    members: Sequence[Member], group_returns: Sequence[Sequence[float]], agent_match: str | None
) -> list[tuple[Trajectory, list[float]]]:
    """One task group's (trajectory, per-token advantages) under per-turn credit, from each member's returns-to-go
    (`returns_to_go` of its `paid_turns`)."""
    ids = [[c.span.span_id for c in llm_calls(member.spans, agent_match)] for member in members]
    advantages = leave_one_out_advantages(group_returns)
    pairs = []
    for member, span_ids, row in zip(members, ids, advantages):
        by_call = dict(zip(span_ids, row))
        pairs += [(t, token_advantages(t, by_call)) for t in member.trajectories]
    return pairs
