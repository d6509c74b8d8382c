"""One GRPO run that trains every role of a multi-agent system: one LoRA adapter per role on one frozen base.

`GRPOConfig(roles={"solver": "^solver$", "verifier": "^verifier$"}, lora_rank=8)` maps each role to the
agent names it trains (a regex, as `agent_match` takes). The engine serves every role's adapter over
the one base held once in memory (`agentgrad.engine.adapters`); with `engine="vllm"` the vLLM servers do,
each adapter loaded under its role's name and synced after every step (`agentgrad.policy.vllm`). This module
turns a step's rollouts into one batch per role and updates each adapter with its own optimizer:

- a role's batch is exactly its agents' calls (`to_trajectories(agent_match=pattern)`); with `default_role`, that
  role's adapter also serves the agents no role matches (and unnamed calls), and its batch takes their calls too;
- a role's reward in a rollout is the last reward emitted for it (`ag.emit_reward(value, agent=role)`),
  else the last reward's dimension named after the role (`ag.emit_reward({"solver": 1.0, "verifier": 0.0},
  primary="solver")`), else the rollout's reward; rollouts in which the role made no call leave its batch and its baseline;
- advantages are computed per role within each task's group, by the run's credit rule: `credit="final"` gives
  each call the advantage of the role's reward; `credit="per_turn"` pays each of the role's calls the rewards that
  follow it (the role's own, and the rollout's: its dimension named after the role where it has one), and the role's
  reward at its last call when no span pays it;
- `updates.RoleUpdate` trains each role's adapter with its own optimizer; checkpoints hold one subfolder per role
  (the adapter, a PEFT folder, and its optimizer state), and metrics go under `train/<role>/...`.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgrad import semconv as sc
from agentgrad.adapters import agent_of, to_trajectories
from agentgrad.algorithms.credit import CreditRule, Member, Pairs, unpaid_reward
from agentgrad.engine.adapters import Adapters
from agentgrad.types import Rollout, Span


def check_roles(roles: Mapping[str, str], cfg: Any) -> None:
    """What training several roles at once needs of a GRPO config; a ValueError that says what to change."""
    Adapters(dict(roles), cfg.default_role)  # names, patterns, and the default among them
    problems = [
        (cfg.policy.lora_rank < 1, "lora_rank >= 1 (one LoRA adapter per role on one base)"),
        (
            cfg.policy.engine == "vllm" and cfg.policy.vllm_transport not in ("auto", "lora"),
            "vllm_transport='lora' or 'auto' (each role's adapter travels to vLLM under its name)",
        ),
        (cfg.agent_match is not None, "agent_match=None (each role's pattern selects its calls)"),
        (cfg.train_processes != 1, "train_processes=1 (a sharded update trains full weights, not adapters)"),
    ]
    missing = [need for failed, need in problems if failed]
    if missing:
        raise ValueError(f"roles={dict(roles)} needs {'; '.join(missing)}")


def role_reward(spans: Sequence[Span], role: str, pattern: str, fallback: float) -> float:
    """This role's reward in a rollout: the last one emitted for it (`emit_reward(value, agent=...)` naming the role
    or an agent its pattern matches), else the rollout's last reward's dimension named after the role
    (`emit_reward({"solver": 1.0, "verifier": 0.0}, primary="solver")`), else `fallback` (the rollout's reward)."""
    paid, named = role_rewards(spans, role, pattern)
    return paid[-1][1] if named else fallback


def role_rewards(spans: Sequence[Span], role: str, pattern: str) -> tuple[list[tuple[Span, float]], bool]:
    """The reward spans that make this role's reward, each with its value for the role, in the order they ended:
    its own rewards if it has any, else the rollout's rewards that have a dimension named after it, else the
    rollout's rewards; and whether they name the role (the first two), rather than being the rollout's."""
    rewards = sorted(
        (s for s in spans if s.name == sc.REWARD_SPAN and sc.reward(s) is not None),
        key=lambda s: (s.end_time or s.start_time, s.sequence_id),
    )
    own = [
        (s, sc.reward(s) or 0.0)
        for s in rewards
        if (agent := sc.reward_agent(s)) is not None and (agent == role or re.search(pattern, agent))
    ]
    if own:
        return own, True
    rollouts = [s for s in rewards if sc.reward_agent(s) is None]
    dimensions = [(s, value) for s in rollouts if (value := sc.reward_dimension(s, role)) is not None]
    if dimensions:
        return dimensions, True
    return [(s, sc.reward(s) or 0.0) for s in rollouts], False


def paying_spans(spans: Sequence[Span], role: str, pattern: str) -> list[Span]:
    """`spans` with only the reward spans that make this role's reward (`role_rewards`), each as a reward of the
    rollout's with the role's value: per-turn credit pays each to the role's last call before it."""
    paid, _ = role_rewards(spans, role, pattern)
    as_rollouts = [
        s.model_copy(
            update={"attributes": {**{k: v for k, v in s.attributes.items() if k != sc.REWARD_AGENT}, sc.REWARD: value}}
        )
        for s, value in paid
    ]
    return [s for s in spans if s.name != sc.REWARD_SPAN] + as_rollouts


def role_calls(spans: Sequence[Span], role: str, roles: Mapping[str, str], default_role: str | None) -> list[Span]:
    """`spans` less the model calls this role does not train: the default role (the adapter that serves every agent no
    role matches) keeps, beside its own agents' calls, every call no other role's pattern takes; any other role keeps
    them all (`to_trajectories(agent_match=pattern)` selects its calls)."""
    if role != default_role:
        return list(spans)
    others = [re.compile(p) for name, p in roles.items() if name != role]
    own = re.compile(roles[role])

    def trained_here(span: Span) -> bool:
        caller = agent_of(span)
        return bool(own.search(caller)) or not any(p.search(caller) for p in others)

    return [s for s in spans if not sc.is_llm_call(s) or trained_here(s)]


@dataclass
class RoleBatch:
    """One role's share of a GRPO step."""

    scored: Pairs = field(default_factory=list)  # what its adapter's update trains on
    rewards: list[float] = field(default_factory=list)  # of each successful rollout in which the role made a call
    groups_kept: int = 0  # groups whose role rewards differ (all when skip_uniform_groups is off)


def role_batches(
    members: Sequence[tuple[Rollout, Hashable, Sequence[Span]]],
    roles: Mapping[str, str],
    default_role: str | None,
    credit: CreditRule,
) -> dict[str, RoleBatch]:
    """Per role, the (trajectory, advantage) pairs of its calls in these rollouts (rollout, task group, spans)."""
    batches: dict[str, RoleBatch] = {}
    for role, pattern in roles.items():
        taking: list[Member] = []
        default = role == default_role  # takes the calls of every agent no role matches: no pattern selects them
        for rollout, group, spans in members:
            reward = role_reward(spans, role, pattern, rollout.reward or 0.0)
            calls = paying_spans(role_calls(spans, role, roles, default_role), role, pattern)
            trajectories = to_trajectories(
                calls, reward=reward, agent_match=None if default else pattern, skip_forced=True
            )
            if trajectories:
                taking.append(Member(calls, reward, trajectories, group, unpaid_reward(calls, reward)))
        scored, kept = credit.pairs(taking, None if default else pattern)
        batches[role] = RoleBatch(scored, [m.reward for m in taking], kept)
    return batches


def role_metrics(batches: Mapping[str, RoleBatch], success_threshold: float) -> dict[str, float]:
    """`train/<role>/reward_mean`, `reward_std`, `accuracy`, `groups_used`, `calls` for each role."""
    metrics: dict[str, float] = {}
    for role, batch in batches.items():
        rewards = batch.rewards
        metrics |= {
            f"train/{role}/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
            f"train/{role}/reward_std": statistics.pstdev(rewards) if rewards else 0.0,
            f"train/{role}/accuracy": sum(r >= success_threshold for r in rewards) / max(len(rewards), 1),
            f"train/{role}/groups_used": batch.groups_kept,
            f"train/{role}/calls": sum(len(t.span_ids) for t, _ in batch.scored),
        }
    return metrics
