"""GRPO: group relative policy optimization of a local model, through the real agent.

Each step the training loop (loop.py) runs `group_size` rollouts of each sampled task through runners ->
gateway -> engine; this file turns them into a batch: each rollout's spans become token sequences (the exact
ids the engine sampled, with their logprobs), rewards are compared within each task's group (a judge may score
the group side by side first), and the credit rule gives each sequence its advantage (`credit.py`: the final
reward's, or per turn), per role when several roles train (`roles.py`). The update is a clipped policy-gradient
step on the response tokens (`grpo_update.py`), run where `updates.py` says (this process, FSDP2 ranks, one
adapter per role). The hyper-parameters are `GRPOConfig` (grpo_config.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from rich.console import Console

from agentgrad.adapters import final_answer, to_trajectories
from agentgrad.algorithms.async_rollouts import StepRollouts
from agentgrad.algorithms.base import Result
from agentgrad.algorithms.credit import CreditRule, Member, credit_rule, unpaid_reward
from agentgrad.algorithms.demonstrations import Demonstration
from agentgrad.algorithms.grpo_config import GRPOConfig
from agentgrad.algorithms.grpo_update import grpo_update, sharded_grpo_step
from agentgrad.algorithms.loop import Batch, TrainsWeights
from agentgrad.algorithms.roles import role_batches, role_metrics
from agentgrad.algorithms.updates import ShardedTrain, Train
from agentgrad.engine import Engine
from agentgrad.types import Rollout, RolloutStatus, Span

GroupReward = Callable[[Any, Sequence[str]], Awaitable[Sequence[float]]]
"""Rewards for one group: (the task, each successful rollout's final answer) -> one reward each (`GRPO(group_reward=...)`)."""

IDENTICAL_STEPS = 3
"""Steps in a row whose every group sampled identical rollouts before GRPO says so (once)."""

GRPOResult = Result
"""What `GRPO.run` (and `Trainer.fit`) returns: the shape every algorithm's run returns."""


class GRPO(TrainsWeights):
    """`GRPO(GRPOConfig(...), local_engine=..., group_reward=..., name=value, ...)`; without an engine, loads `model`
    (default SmolLM2). Overrides and engines as every algorithm that trains weights takes them (`TrainsWeights`).

    `group_reward` (`agentgrad.judge.GroupJudge`, or any async `(task, final answers) -> rewards`) replaces the
    agents' rewards of each group's successful rollouts with ones scored side by side (a judge, for tasks
    with no checker).
    """

    config: GRPOConfig
    config_type = GRPOConfig

    def __init__(
        self,
        config: GRPOConfig | None = None,
        *,
        local_engine: Engine | None = None,
        model: str | None = None,
        demonstrations: Sequence[Demonstration] = (),
        group_reward: GroupReward | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(config, local_engine=local_engine, model=model, demonstrations=demonstrations, **overrides)
        if group_reward is not None and self.config.dynamic_sampling:
            raise ValueError(
                "dynamic_sampling reads the agents' rewards to tell which groups differ, before group_reward scores "
                "them: use one or the other"
            )
        self.group_reward = group_reward

    def batches(self) -> GroupBatches:
        return GroupBatches(self.config, self.console, self.group_reward)

    def losses(self) -> tuple[Train, ShardedTrain]:
        return partial(grpo_update, cfg=self.config), partial(sharded_grpo_step, cfg=self.config)

    def roles(self) -> tuple[Mapping[str, str] | None, str | None]:
        return self.config.roles, self.config.default_role

    def reference(self) -> bool:
        return self.config.kl_coef > 0


@dataclass
class GroupBatches:
    """GRPO's batch builder: each task's group of rollouts compared, each sequence given its advantage.

    Under `roles` the batch is one part per role (`{role: pairs}`, what `RoleUpdate` trains), else one list of
    (trajectory, advantage) pairs; `credit` and `group_reward` apply either way.
    """

    cfg: GRPOConfig
    console: Console
    group_reward: GroupReward | None = None
    alike: dict[int, bool] = field(default_factory=dict)  # by step: every group's rollouts sampled the same tokens
    said_alike: bool = False

    def __post_init__(self) -> None:
        cfg = self.cfg
        self.credit: CreditRule = credit_rule(
            cfg.credit, gamma=cfg.gamma, normalize_std=cfg.normalize_std, skip_uniform=cfg.skip_uniform_groups
        )

    async def build(self, step: StepRollouts, spans: Mapping[str, list[Span]]) -> Batch:
        cfg = self.cfg
        rollouts, groups = step.trained
        succeeded = [(r, g) for r, g in zip(rollouts, groups) if r.status is RolloutStatus.SUCCEEDED]
        if self.group_reward is not None:
            succeeded = await self.judged(succeeded, spans)
        members = [
            Member(
                spans[r.rollout_id],
                r.reward or 0.0,
                # tokens a grammar forced are no choice of the policy's: out of the loss (docs/constrained-decoding.md)
                to_trajectories(
                    spans[r.rollout_id], reward=r.reward or 0.0, agent_match=cfg.agent_match, skip_forced=True
                ),
                g,
                unpaid_reward(spans[r.rollout_id], r.reward or 0.0),
            )
            for r, g in succeeded
        ]
        self.note_identical(step.step, members)
        sampled = [t for m in members for t in m.trajectories]
        batch = Batch(
            data=[],
            size=0,
            rewards=[m.reward for m in members],
            generated_tokens=sum(t.response_length for t in sampled),
            sequences=len(sampled),
        )
        if cfg.roles:  # one part per role, with the role's own rewards and advantages (algorithms/roles.py)
            parts = role_batches(
                [(r, g, spans[r.rollout_id]) for r, g in succeeded], cfg.roles, cfg.default_role, self.credit
            )
            batch.data = {role: part.scored for role, part in parts.items()}
            batch.size = sum(len(part.scored) for part in parts.values())
            kept = max((part.groups_kept for part in parts.values()), default=0)
            batch.metrics = role_metrics(parts, cfg.success_threshold)
        else:
            batch.data, kept = self.credit.pairs(members, cfg.agent_match)
            batch.size = len(batch.data)
        batch.metrics["train/groups_used"] = kept
        drawn = len(set(groups))
        batch.summary = f"groups {kept}/{cfg.prompts_per_step}" + (
            f" of {drawn} drawn" if drawn > cfg.prompts_per_step else ""
        )
        return batch

    def wants_more(self, step: StepRollouts, batch: Batch) -> bool:
        """Dynamic sampling (DAPO): whether the step should draw `prompts_per_step` more tasks, its batch training
        fewer groups than that (the others' advantages all 0, by the credit rule's count) and a draw being left."""
        cfg = self.cfg
        draws = len(step.rollouts) // (cfg.prompts_per_step * cfg.group_size)
        return draws <= cfg.dynamic_sampling and batch.metrics["train/groups_used"] < cfg.prompts_per_step

    def note_identical(self, step: int, members: Sequence[Member]) -> None:
        """Say so (once) when every group's rollouts sampled the same tokens `IDENTICAL_STEPS` steps in a row: then
        GRPO has nothing to compare. A step's batch built again after a dynamic-sampling draw counts once."""
        samples: dict[Any, set[tuple[tuple[int, ...], ...]]] = {}
        for m in members:
            samples.setdefault(m.group, set()).add(tuple(tuple(t.token_ids) for t in m.trajectories))
        compared = [g for g in samples if sum(m.group == g for m in members) > 1]
        self.alike[step] = bool(compared) and all(len(samples[g]) == 1 for g in compared)
        in_a_row = 0
        while self.alike.get(step - in_a_row):
            in_a_row += 1
        if in_a_row >= IDENTICAL_STEPS and not self.said_alike:
            self.said_alike = True
            self.console.print(
                f"for {IDENTICAL_STEPS} steps in a row every group's rollouts sampled the same tokens, so GRPO "
                "has nothing to compare: the calls run greedily (an agent pinning temperature=0 under "
                "sampling='agent', or a backend ignoring the temperature)",
                highlight=False,
                markup=False,
            )

    async def judged(
        self, succeeded: list[tuple[Rollout, int]], spans: Mapping[str, list[Span]]
    ) -> list[tuple[Rollout, int]]:
        """The rollouts with the rewards `group_reward` gives each group's final answers, side by side."""
        assert self.group_reward is not None
        members: dict[int, list[int]] = {}
        for i, (_, group) in enumerate(succeeded):
            members.setdefault(group, []).append(i)
        judged = list(succeeded)
        for indices in members.values():
            answers = [final_answer(spans[succeeded[i][0].rollout_id], self.cfg.agent_match) for i in indices]
            rewards = list(await self.group_reward(succeeded[indices[0]][0].input, answers))
            if len(rewards) != len(indices):
                raise ValueError(f"group_reward returned {len(rewards)} rewards for a group of {len(indices)}")
            for i, reward in zip(indices, rewards):
                judged[i] = (succeeded[i][0].model_copy(update={"reward": float(reward)}), succeeded[i][1])
        return judged
