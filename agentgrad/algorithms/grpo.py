"""GRPO: group relative policy optimization of a local model, through the real agent.

Each step: sample tasks, run each `group_size` times through runners → gateway → engine,
turn each rollout's spans into token sequences (the exact ids the engine sampled, with their
logprobs), normalize rewards within each task's group, and take a clipped policy-gradient
step on the response tokens. The engine serves the new weights from the next request on.

This file is the loop, read top to bottom: collect, adapt, optimize, log, validate and checkpoint.
The hyper-parameters are `GRPOConfig` (grpo_config.py); the math of the update (group advantages,
the clipped per-token loss, the truncated importance-sampling weights, their token mean over the
step) and its local, sharded and per-role forms are in grpo_update.py.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentgrad.adapters import Trajectory, final_answer, to_trajectories
from agentgrad.algorithms.async_rollouts import RolloutPipeline
from agentgrad.algorithms.base import (
    Algorithm,
    Evaluation,
    RunContext,
    count_no_reward,
    flag_no_model_calls,
    no_model_calls_error,
    with_overrides,
)
from agentgrad.algorithms.credit import Advantage, per_turn_pairs, useful_groups
from agentgrad.algorithms.grpo_config import GRPOConfig
from agentgrad.algorithms.grpo_update import LocalUpdate, ShardedUpdate, group_advantages, open_update
from agentgrad.algorithms.roles import RoleBatch, RoleUpdate, role_batches, role_metrics
from agentgrad.algorithms.rollback import RollbackGuard, after_validation
from agentgrad.distributed.group import follow
from agentgrad.engine import Engine
from agentgrad.engine.threads import in_own_thread
from agentgrad.gateway.sampling import SamplingPlan
from agentgrad.policy.checkpoints import (
    BestCheckpoint,
    complete_checkpoints,
    latest_checkpoint,
    prune_checkpoints,
)
from agentgrad.policy.config import PolicyConfig, make_policy
from agentgrad.policy.local import LocalPolicy
from agentgrad.semconv import is_llm_call
from agentgrad.types import Rollout, RolloutConfig, RolloutStatus

GroupReward = Callable[[Any, Sequence[str]], Awaitable[Sequence[float]]]
"""Rewards for one group: (the task, each successful rollout's final answer) -> one reward each (`GRPO(group_reward=...)`)."""

IDENTICAL_STEPS = 3
"""Steps in a row whose every group sampled identical rollouts before GRPO says so (once)."""


def rollback_guard(cfg: GRPOConfig, checkpoint_dir: Path | None, update: Any) -> RollbackGuard | None:
    """The guard of `rollback_on_drop`, keeping the best beside the run's checkpoints; None when it is off."""
    if cfg.rollback_on_drop is None:
        return None
    if not hasattr(update, "optimizer"):
        raise ValueError("rollback_on_drop needs the update in this process (train_processes=1)")
    return RollbackGuard(cfg.rollback_on_drop, cfg.rollback_action, cfg.rollback_lr_factor, checkpoint_dir)


# ----------------------------------------------------------------------------- the loop


@dataclass
class GRPOResult:
    steps: int
    initial: Evaluation | None
    final: Evaluation | None
    checkpoint: str | None
    history: list[dict[str, float]] = field(default_factory=list)
    best_checkpoint: BestCheckpoint | None = None  # the kept checkpoint that validated best
    checkpoints: list[str] = field(default_factory=list)  # every checkpoint kept, oldest first


@dataclass
class StepBatch:
    """One step's rollouts turned into training data."""

    scored: list[tuple[Trajectory, Advantage]]  # (trajectory, advantage) of the groups kept, what the update trains on
    rewards: list[float]  # of every rollout that succeeded
    groups_kept: int  # groups whose rewards differ (all of them when skip_uniform_groups is off)
    sampled: list[Trajectory]  # every trajectory of a successful rollout, kept or not
    rewarded: int = 0  # successful rollouts
    model_calls: int = 0  # LLM-call spans of the successful rollouts
    groups_compared: int = 0  # groups with at least two successful rollouts
    groups_identical: int = 0  # ... whose rollouts all sampled the same tokens
    roles: dict[str, RoleBatch] = field(default_factory=dict)  # under `roles`: each role's batch (`scored` joins them)


class GRPO(Algorithm["GRPOResult"]):
    """`GRPO(GRPOConfig(...), local_engine=..., name=value, ...)`; without an engine, loads `model` (default SmolLM2).

    Keyword overrides copy the config (`dataclasses.replace`), never change it; a `PolicyConfig`
    field name (`engine="vllm"`, `lora_rank=8`, `tis_cap=2.0`, ...) sets `config.policy`'s.
    `local_engine` is a built-in `Engine` already loaded in this process, whose weights are trained.
    `group_reward` (`agentgrad.judge.GroupJudge`, or any async `(task, final answers) -> rewards`) replaces the
    agents' rewards of each group's successful rollouts with ones scored side by side (a judge, for tasks
    with no checker).
    """

    serves_gateway = True

    def __init__(
        self,
        config: GRPOConfig | None = None,
        *,
        local_engine: Engine | None = None,
        model: str | None = None,
        group_reward: GroupReward | None = None,
        **overrides: Any,
    ) -> None:
        self.config = with_overrides(config or GRPOConfig(), overrides, "GRPO", {"policy": PolicyConfig})
        self.local_engine = local_engine
        self.model_name = model
        self.group_reward = group_reward

    async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> GRPOResult:
        self.bind(ctx)
        cfg = self.config
        if not train_data:
            raise ValueError("GRPO needs training tasks")
        with make_policy(
            cfg.policy,
            ctx.store,
            self.local_engine,
            self.model_name,
            gateway_port=ctx.gateway_port,
            roles=cfg.roles,
            default_role=cfg.default_role,
        ) as policy:
            # ---- the update sharded over several processes (agentgrad.distributed), when asked
            update = open_update(policy, cfg, ctx.launcher)
            try:
                return await self._train(policy, update, list(train_data), list(val_data or [])[: cfg.val_size])
            finally:
                update.close()

    def follow(self) -> None:
        """A rank past 0 under torchrun: build this rank's shard and join each update rank 0 runs."""
        from agentgrad.engine.model import load_model

        follow(lambda: self.local_engine.model if self.local_engine is not None else load_model(self.model_name)[0])

    async def _train(
        self,
        policy: LocalPolicy,
        update: LocalUpdate | ShardedUpdate | RoleUpdate,
        train_data: list[Any],
        val_data: list[Any],
    ) -> GRPOResult:
        cfg = self.config
        engine = policy.engine
        # ---- resources: the agent's other resources, plus the policy behind the gateway
        train_id = await self.publish_with(
            cfg.resource_name,
            policy.llm(temperature=cfg.temperature, max_tokens=cfg.max_tokens),
            {"algorithm": "grpo", "purpose": "train"},
        )
        val_id = await self.publish_with(
            cfg.resource_name,
            policy.llm(temperature=0.0, max_tokens=cfg.max_tokens),
            {"algorithm": "grpo", "purpose": "val"},
        )
        # ---- the trainer's sampling, applied by the gateway to each call whatever the agent asks
        policy.set_sampling(SamplingPlan.for_training(cfg.temperature, cfg.top_p, cfg.max_tokens, cfg.sampling))
        rollout_config = RolloutConfig(timeout_seconds=cfg.rollout_timeout, missing_reward=cfg.missing_reward)

        # ---- resume from the newest checkpoint, if any
        checkpoint_dir = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        start, history, state = 0, [], {}
        if (found := latest_checkpoint(checkpoint_dir)) is not None:
            state = in_own_thread(update.load, found)
            start, history = state["step"], state.get("history", [])
            self.console.print(f"resumed from {found} (step {start})")
        best = BestCheckpoint.restored(state.get("best_checkpoint"))  # kept from pruning; serve it
        pipeline = RolloutPipeline.of(self, cfg, train_data, start, train_id, rollout_config, state.get("queued"))

        async def validate(step: int) -> Evaluation | None:
            if not val_data:
                return None
            rollouts = await self.run_rollouts(
                val_data,
                mode="val",
                resources_id=val_id,
                config=rollout_config,
                metadata=[{"step": step}] * len(val_data),
            )
            result = Evaluation.of(rollouts, cfg.success_threshold)
            await self.log_metrics(
                step,
                {
                    "val/accuracy": result.success_rate,
                    "val/reward_mean": result.reward_mean,
                    "val/no_reward": result.no_reward,
                },
            )
            return result

        initial = await validate(start)
        guard = rollback_guard(cfg, checkpoint_dir, update)
        if guard is not None and initial is not None:
            await after_validation(self, guard, start, initial.success_rate, update)
        if initial is not None:
            self.console.print(
                f"validation before step {start}: accuracy {initial.success_rate:.3f} "
                f"reward {initial.reward_mean:.3f} ({initial.n} tasks)"
            )
        final = initial
        failed_steps = identical_steps = 0
        stop = False
        progress = Progress(
            TextColumn("GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            transient=False,
        )
        with progress:
            bar = progress.add_task("", total=cfg.steps, completed=start)
            for step in range(start + 1, cfg.steps + 1):
                began = time.perf_counter()
                # ---- collect: group_size rollouts of each sampled task (async: queued ahead, running meanwhile)
                collected = await pipeline.collect(step, engine.version)
                rollouts = collected.rollouts
                rollout_seconds = time.perf_counter() - began
                failed_steps = failed_steps + 1 if all(r.status is not RolloutStatus.SUCCEEDED for r in rollouts) else 0
                if cfg.max_failed_steps and failed_steps >= cfg.max_failed_steps:
                    failures = self.last_failures.describe("train", self.store) if self.last_failures else ""
                    raise RuntimeError(
                        f"GRPO stopped at step {step}: every rollout failed in {failed_steps} step(s) in a "
                        f"row (max_failed_steps={cfg.max_failed_steps})\n{failures}"
                    )

                # ---- adapt: spans → trajectories; advantages within each task's group (async: the fresh groups)
                batch = await self._batch(*collected.trained)
                if batch.rewarded and not batch.model_calls:
                    raise no_model_calls_error("GRPO", batch.rewarded)
                identical_steps = identical_steps + 1 if batch.groups_compared == batch.groups_identical > 0 else 0
                if identical_steps == IDENTICAL_STEPS:
                    self.console.print(
                        f"for {IDENTICAL_STEPS} steps in a row every group's rollouts sampled the same tokens, so GRPO "
                        "has nothing to compare: the calls run greedily (an agent pinning temperature=0 under "
                        "sampling='agent', or a backend ignoring the temperature)",
                        highlight=False,
                        markup=False,
                    )
                generated = sum(t.response_length for t in batch.sampled)  # every rollout's, kept or not

                # ---- optimize: clipped policy gradient over the response tokens
                update_began = time.perf_counter()
                work: Any = batch.scored
                if isinstance(update, RoleUpdate):  # each role's adapter on its own batch
                    work = {role: b.scored for role, b in batch.roles.items()}
                stats = await asyncio.to_thread(in_own_thread, update.step, work) if batch.scored else {}
                update_seconds = time.perf_counter() - update_began
                await pipeline.published(step)  # async: the runners go on through validation and checkpointing
                sync_seconds = stats.pop("sync_seconds", 0.0)  # of update_seconds: new weights into the engine

                # ---- log
                rewards = batch.rewards
                finished = [r for r in rollouts if r.status is RolloutStatus.SUCCEEDED]
                metrics = {
                    "train/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
                    "train/reward_std": statistics.pstdev(rewards) if rewards else 0.0,
                    "train/accuracy": sum(r >= cfg.success_threshold for r in rewards) / max(len(rewards), 1),
                    "train/groups_used": batch.groups_kept,
                    "train/failed_rollouts": len(rollouts) - len(finished),
                    "train/no_reward": count_no_reward(rollouts),
                    "train/response_length": generated / max(len(batch.sampled), 1),
                    **{f"train/{k}": v for k, v in stats.items()},
                    "perf/rollout_seconds": rollout_seconds,
                    "perf/update_seconds": update_seconds,
                    "perf/sync_seconds": sync_seconds,
                    "perf/step_seconds": time.perf_counter() - began,
                    "perf/tokens_per_s": generated / max(rollout_seconds, 1e-9),
                    "perf/peak_memory_gib": engine.peak_memory_bytes() / 2**30,
                    "train/model_version": engine.version,
                    **collected.metrics(),  # async: staleness distribution, dropped groups
                    **role_metrics(batch.roles, cfg.success_threshold),  # train/<role>/...: roles only
                }
                await self.log_metrics(step, metrics)
                history.append({"step": step, **metrics})
                description = (
                    f"reward {metrics['train/reward_mean']:.2f} acc {metrics['train/accuracy']:.2f} "
                    f"loss {stats.get('loss', 0.0):+.3f} groups {batch.groups_kept}/{cfg.prompts_per_step} "
                    f"{metrics['perf/step_seconds']:.1f}s"
                )

                # ---- validate and checkpoint
                score = None  # this step's validation accuracy, the score of a checkpoint saved at it
                if (cfg.val_every and step % cfg.val_every == 0) or step == cfg.steps:
                    final = await validate(step)
                    if final is not None:
                        description += f" | val acc {final.success_rate:.3f}"
                        score = final.success_rate
                    if guard is not None and final is not None:
                        stop = await after_validation(self, guard, step, final.success_rate, update)
                progress.update(bar, advance=1, description=description)
                progress.console.print(f"step {step}/{cfg.steps}: {description}", highlight=False)
                if checkpoint_dir and (
                    (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == cfg.steps
                ):
                    saved = checkpoint_dir / f"step-{step}"
                    improved = best.consider(saved, step, score)
                    update.save(
                        saved,
                        {
                            "step": step,
                            "history": history,
                            "config": asdict(cfg),
                            "queued": pipeline.state(),
                            "best_checkpoint": best.state(),
                        },
                    )
                    prune_checkpoints(checkpoint_dir, cfg.keep_checkpoints, spare=best.path)
                    if improved:
                        await self.note_best_checkpoint(best)
                if stop:
                    break
        if guard is not None and guard.best_path is not None and guard.best_step is not None:
            best.consider(guard.best_path, guard.best_step, guard.best)  # rollback's copy of the best weights
        last = latest_checkpoint(checkpoint_dir)
        return GRPOResult(
            steps=cfg.steps,
            initial=initial,
            final=final,
            checkpoint=str(last) if last else None,
            history=history,
            best_checkpoint=best if best.path else None,
            checkpoints=[str(p) for p in complete_checkpoints(checkpoint_dir)],
        )

    async def _batch(self, rollouts: list[Rollout], groups: list[int]) -> StepBatch:
        """The step's trajectories with their advantages; groups whose rewards are all equal are dropped."""
        cfg = self.config
        scored: list[tuple[Rollout, int, list[Trajectory]]] = []
        calls: list[int] = []
        succeeded = [(r, g) for r, g in zip(rollouts, groups) if r.status is RolloutStatus.SUCCEEDED]
        spans_of = [await self.store.query_spans(r.rollout_id) for r, _ in succeeded]  # failed: no reward to learn
        if self.group_reward is not None:
            succeeded = await self._judged(succeeded, spans_of)
        for (rollout, group), spans in zip(succeeded, spans_of):
            calls.append(sum(is_llm_call(s) for s in spans))
            # tokens a grammar forced are no choice of the policy's: out of the loss (docs/constrained-decoding.md)
            trajectories = to_trajectories(
                spans, reward=rollout.reward or 0.0, agent_match=cfg.agent_match, skip_forced=True
            )
            scored.append((rollout, group, trajectories))
        flagged = await flag_no_model_calls(self.store, [r for r, _, _ in scored], calls)
        if flagged and sum(calls):
            self.console.print(
                f"{flagged} of {len(scored)} rewarded rollouts made no model call through the gateway "
                f"(marked in their metadata): some agent calls bypass it",
                highlight=False,
                markup=False,
            )
        samples: dict[int, set[tuple[tuple[int, ...], ...]]] = {}
        sizes: dict[int, int] = {}
        for _, group, trajectories in scored:
            samples.setdefault(group, set()).add(tuple(tuple(t.token_ids) for t in trajectories))
            sizes[group] = sizes.get(group, 0) + 1
        compared = [g for g, size in sizes.items() if size > 1]
        rewards = [r.reward or 0.0 for r, _, _ in scored]
        advantages = group_advantages(rewards, [g for _, g, _ in scored], cfg.normalize_std)
        useful = useful_groups(rewards, [g for _, g, _ in scored], cfg.skip_uniform_groups)
        roles: dict[str, RoleBatch] = {}
        pairs: list[tuple[Trajectory, Advantage]]
        if cfg.roles:  # one batch per role, with the role's own rewards and advantages (algorithms/roles.py)
            with_spans = [(r, g, spans) for (r, g, _), spans in zip(scored, spans_of)]
            roles = role_batches(with_spans, cfg.roles, cfg, group_advantages)
            pairs = [pair for role_batch in roles.values() for pair in role_batch.scored]
        elif cfg.credit == "per_turn":  # each call its own return-to-go's advantage (algorithms/credit.py)
            members = [(spans, r.reward or 0.0, t, g) for (r, g, t), spans in zip(scored, spans_of)]
            pairs = [
                p
                for g in useful
                for p in per_turn_pairs([m[:3] for m in members if m[3] == g], cfg.gamma, cfg.agent_match)
            ]
        else:
            pairs = [
                (trajectory, advantage)
                for advantage, (_, group, trajectories) in zip(advantages, scored)
                if group in useful
                for trajectory in trajectories
            ]
        return StepBatch(
            pairs,
            rewards,
            len(useful),
            [t for _, _, trajectories in scored for t in trajectories],
            rewarded=len(scored),
            model_calls=sum(calls),
            groups_compared=len(compared),
            groups_identical=sum(len(samples[g]) == 1 for g in compared),
            roles=roles,
        )

    async def _judged(
        self, succeeded: list[tuple[Rollout, int]], spans_of: list[list[Any]]
    ) -> list[tuple[Rollout, int]]:
        """The rollouts with the rewards `group_reward` gives each group's final answers, side by side."""
        members: dict[int, list[int]] = {}
        for i, (_, group) in enumerate(succeeded):
            members.setdefault(group, []).append(i)
        judged = list(succeeded)
        for indices in members.values():
            answers = [final_answer(spans_of[i], self.config.agent_match) for i in indices]
            rewards = list(await self.group_reward(succeeded[indices[0]][0].input, answers))  # type: ignore[misc]
            if len(rewards) != len(indices):
                raise ValueError(f"group_reward returned {len(rewards)} rewards for a group of {len(indices)}")
            for i, reward in zip(indices, rewards):
                judged[i] = (succeeded[i][0].model_copy(update={"reward": float(reward)}), succeeded[i][1])
        return judged
