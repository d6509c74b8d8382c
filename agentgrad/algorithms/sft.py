"""SFT by rejection sampling: keep the rollouts that earned a reward, fine-tune on what the model wrote.

Each round: run sampled training tasks several times through runners → gateway → engine, keep
the attempts whose reward reaches `reward_threshold`, and minimize the negative log-likelihood
of their model-written tokens (the exact ids the engine sampled; tool results and prompts are
masked out). The engine serves the new weights from the next request on; validation follows.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentgrad.adapters import Trajectory, to_trajectories
from agentgrad.algorithms.async_rollouts import RolloutPipeline, StaleGroups, check_async_settings
from agentgrad.algorithms.base import (
    Algorithm,
    Evaluation,
    RunContext,
    flag_no_model_calls,
    no_model_calls_error,
    with_overrides,
)
from agentgrad.algorithms.sampling import TaskSampler
from agentgrad.distributed.fsdp import clip_grad_norm, idle_trajectory
from agentgrad.engine import Engine
from agentgrad.engine.threads import in_own_thread
from agentgrad.engine.training import ScoredSequence, sequence_logprobs
from agentgrad.gateway.sampling import SamplingPlan, SamplingSource
from agentgrad.policy.checkpoints import BestCheckpoint, complete_checkpoints, latest_checkpoint, prune_checkpoints
from agentgrad.policy.config import PolicyConfig, make_policy
from agentgrad.policy.local import LocalPolicy
from agentgrad.semconv import is_llm_call
from agentgrad.types import MissingReward, Rollout, RolloutConfig, RolloutStatus


@dataclass
class SFTConfig:
    """Every hyper-parameter of an SFT run; `SFT(config, name=value)` overrides copy it, never change it."""

    # ---- the run
    rounds: int = 3  # collect → keep the rewarded → fine-tune → validate
    tasks_per_round: int = 64  # training tasks sampled per round
    samples_per_task: int = 4  # rollouts of each task per round, at `temperature`
    seed: int = 0  # task order, batch shuffling and each collection call's sampling seed
    report_to: Sequence[str] = ()  # trackers that get the run's metrics too: "mlflow", "tensorboard", "wandb"
    # ---- sampling the rollouts
    temperature: float = 1.0  # sampling temperature of the collection rollouts; validation is greedy
    top_p: float = 1.0  # nucleus sampling of the collection rollouts
    max_tokens: int = 48  # per model call
    sampling: SamplingSource = (
        "trainer"  # the gateway applies the above to every call ("agent": only where the agent set none)
    )
    missing_reward: MissingReward = "fail"  # a rollout whose agent reports no reward fails ("zero": counts as reward 0)
    rollout_timeout: float = 600.0  # seconds an attempt may take
    resource_name: str = "llm"  # name of the LLM resource the agent asks for
    agent_match: str | None = None  # fine-tune only this agent's calls (regex on its ag.agent name; unnamed: model)
    # ---- what is kept
    reward_threshold: float = 1.0  # rollouts with at least this reward are kept
    # ---- the optimizer: NLL of the kept model-written tokens, token mean over each batch
    epochs: int = 2  # passes over each round's kept data
    batch_size: int = 16  # sequences per optimizer step
    learning_rate: float = 1e-5  # AdamW
    max_grad_norm: float = 1.0
    # ---- asynchronous training (docs/async-training.md): the next rounds' rollouts run while a round fine-tunes
    max_staleness: int | None = None  # None: synchronous; k: k rounds queued ahead, groups > k updates old dropped
    stale_groups: StaleGroups = "drop"  # a task's samples over max_staleness: "drop" (counted) or "keep"
    # ---- the policy: serving engine and LoRA (`SFT(engine="vllm")` sets policy.engine; tis_cap does not apply)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # ---- validation and checkpoint
    val_size: int | None = None  # validation tasks used (default: all)
    success_threshold: float = 1.0  # a rollout with at least this reward counts as a success (accuracy)
    checkpoint_dir: str | None = None  # where step-N checkpoints go (N: the round)
    checkpoint_every: int = 0  # save every k rounds (0: only at the end, when checkpoint_dir is set)
    keep_checkpoints: int = (
        2  # the newest k step-N folders stay, and the one that validated best; older ones are deleted (0: keep all)
    )

    def __post_init__(self) -> None:
        if not isinstance(self.policy, PolicyConfig):
            raise TypeError(f"SFTConfig.policy is a PolicyConfig, got {type(self.policy).__name__}")
        SamplingPlan(source=self.sampling)  # checks it
        RolloutConfig(missing_reward=self.missing_reward)
        check_async_settings(self.max_staleness, self.stale_groups)
        for name, zero_means in (("checkpoint_every", "only at the end"), ("keep_checkpoints", "keep all")):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: {zero_means}), got {getattr(self, name)}")
        for name in ("rounds", "tasks_per_round", "samples_per_task", "epochs", "batch_size"):
            if getattr(self, name) < (0 if name == "rounds" else 1):
                raise ValueError(f"{name} must be at least {0 if name == 'rounds' else 1}, got {getattr(self, name)}")


@dataclass
class SFTResult:
    rounds: int
    initial: Evaluation | None
    final: Evaluation | None
    checkpoint: str | None
    history: list[dict[str, float]] = field(default_factory=list)
    best_checkpoint: BestCheckpoint | None = None  # the kept checkpoint that validated best
    checkpoints: list[str] = field(default_factory=list)  # every checkpoint kept, oldest first


class SFT(Algorithm["SFTResult"]):
    """`SFT(SFTConfig(...), local_engine=..., name=value, ...)`; without an engine, loads `model` (default SmolLM2).

    Overrides copy the config as GRPO's do; a `PolicyConfig` field name sets `config.policy`'s.
    """

    serves_gateway = True

    def __init__(
        self,
        config: SFTConfig | None = None,
        *,
        local_engine: Engine | None = None,
        model: str | None = None,
        **overrides: Any,
    ) -> None:
        self.config = with_overrides(config or SFTConfig(), overrides, "SFT", {"policy": PolicyConfig})
        self.local_engine = local_engine
        self.model_name = model

    async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> SFTResult:
        self.bind(ctx)
        cfg = self.config
        if not train_data:
            raise ValueError("SFT needs training tasks")
        with make_policy(
            cfg.policy, ctx.store, self.local_engine, self.model_name, gateway_port=ctx.gateway_port, listen=ctx.listen
        ) as policy:
            return await self._train(policy, list(train_data), list(val_data or [])[: cfg.val_size])

    async def _train(self, policy: LocalPolicy, train_data: list[Any], val_data: list[Any]) -> SFTResult:
        cfg = self.config
        train_id = await self.publish_with(
            cfg.resource_name,
            policy.llm(temperature=cfg.temperature, max_tokens=cfg.max_tokens),
            {"algorithm": "sft", "purpose": "collect"},
        )
        val_id = await self.publish_with(
            cfg.resource_name,
            policy.llm(temperature=0.0, max_tokens=cfg.max_tokens),
            {"algorithm": "sft", "purpose": "val"},
        )
        policy.set_sampling(SamplingPlan.for_training(cfg.temperature, cfg.top_p, cfg.max_tokens, cfg.sampling))
        rollout_config = RolloutConfig(timeout_seconds=cfg.rollout_timeout, missing_reward=cfg.missing_reward)
        if cfg.max_staleness is not None:
            policy.train_beside_serving()  # asynchronous: generation goes on from the published weights
        optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=cfg.learning_rate)
        pipeline = RolloutPipeline(
            self,
            train_data,
            TaskSampler(len(train_data), cfg.seed),
            prompts_per_step=cfg.tasks_per_round,
            group_size=cfg.samples_per_task,
            lookahead=cfg.max_staleness or 0,
            last_step=cfg.rounds,
            resources_id=train_id,
            config=rollout_config,
            max_staleness=cfg.max_staleness,
            stale_groups=cfg.stale_groups,
            sampling_seed=cfg.seed,
        )
        shuffle = random.Random(cfg.seed)
        history: list[dict[str, float]] = []

        async def validate(round_: int) -> Evaluation | None:
            if not val_data:
                return None
            rollouts = await self.run_rollouts(
                val_data,
                mode="val",
                resources_id=val_id,
                config=rollout_config,
                metadata=[{"step": round_}] * len(val_data),
            )
            result = Evaluation.of(rollouts, cfg.success_threshold)
            await self.log_metrics(round_, {"val/accuracy": result.success_rate, "val/reward_mean": result.reward_mean})
            self.console.print(
                f"round {round_}: validation accuracy {result.success_rate:.3f} reward {result.reward_mean:.3f}"
            )
            return result

        checkpoint_dir, best = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None, BestCheckpoint()

        async def save(round_: int, validated: Evaluation | None) -> None:
            """A `step-N` checkpoint of this round, scored by its validation; the best is spared from pruning."""
            assert checkpoint_dir is not None
            saved = checkpoint_dir / f"step-{round_}"
            improved = best.consider(saved, round_, validated.success_rate if validated is not None else None)
            state = {"step": round_, "history": history, "config": asdict(cfg), "best_checkpoint": best.state()}
            policy.save(saved, optimizer, state)
            prune_checkpoints(checkpoint_dir, cfg.keep_checkpoints, spare=best.path)
            if improved:
                await self.note_best_checkpoint(best)

        initial = final = await validate(0)
        for round_ in range(1, cfg.rounds + 1):
            began = time.perf_counter()
            # ---- collect: each sampled task several times (async: queued ahead, running meanwhile)
            collected = await pipeline.collect(round_, policy.engine.version)
            rollouts = collected.rollouts
            # ---- keep: rewarded attempts, each distinct token sequence once
            kept: dict[tuple[int, ...], Trajectory] = {}
            rewards = []
            read: list[Rollout] = []
            calls: list[int] = []
            for rollout in collected.trained[0]:  # async: the samples within the staleness bound
                if rollout.status is not RolloutStatus.SUCCEEDED:
                    continue
                rewards.append(rollout.reward or 0.0)
                if (rollout.reward or 0.0) < cfg.reward_threshold:
                    continue
                spans = await self.store.query_spans(rollout.rollout_id)
                read.append(rollout)
                calls.append(sum(is_llm_call(s) for s in spans))
                for trajectory in to_trajectories(spans, reward=rollout.reward, agent_match=cfg.agent_match):
                    kept.setdefault(tuple(trajectory.token_ids), trajectory)
            await flag_no_model_calls(self.store, read, calls)
            if read and not sum(calls):
                raise no_model_calls_error("SFT", len(read))
            data = list(kept.values())
            # ---- fine-tune: NLL of the model-written tokens
            loss = (
                await asyncio.to_thread(in_own_thread, self._fine_tune, policy, optimizer, data, shuffle)
                if data
                else float("nan")
            )
            await pipeline.published(round_)  # async: the runners go on through validation
            metrics = {
                "train/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
                "train/kept": len(data),
                "train/loss": loss,
                "perf/round_seconds": time.perf_counter() - began,
                **collected.metrics(),  # async: staleness distribution, dropped groups
            }
            await self.log_metrics(round_, metrics)
            self.console.print(
                f"round {round_}: kept {len(data)} of {len(rollouts)} rollouts "
                f"(reward mean {metrics['train/reward_mean']:.3f}), loss {loss:.3f}"
            )
            final = await validate(round_)
            history.append({"round": round_, **metrics, **({"val/accuracy": final.success_rate} if final else {})})
            # ---- checkpoint: every `checkpoint_every` rounds and the last
            if checkpoint_dir and (
                (cfg.checkpoint_every and round_ % cfg.checkpoint_every == 0) or round_ == cfg.rounds
            ):
                await save(round_, final)
        if checkpoint_dir and cfg.rounds == 0:
            await save(0, final)
        last = latest_checkpoint(checkpoint_dir)
        checkpoints = [str(p) for p in complete_checkpoints(checkpoint_dir)]
        return SFTResult(
            cfg.rounds, initial, final, str(last) if last else None, history, best if best.path else None, checkpoints
        )

    def _fine_tune(
        self, policy: LocalPolicy, optimizer: torch.optim.Optimizer, data: list[Trajectory], shuffle: random.Random
    ) -> float:
        cfg = self.config
        losses = []
        with policy.training() as model:
            for _ in range(cfg.epochs):
                order = list(range(len(data)))
                shuffle.shuffle(order)
                for start in range(0, len(order), cfg.batch_size):
                    batch = [data[i] for i in order[start : start + cfg.batch_size]]
                    losses.append(
                        sft_update(model, optimizer, batch, cfg.max_grad_norm, policy.engine.tokenizer.pad_token_id)
                    )
        policy.publish()
        policy.sync()  # vLLM: the new weights reach the servers before the next round
        return statistics.fmean(losses)


def sft_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Sequence[Trajectory],
    max_grad_norm: float,
    pad_token_id: int = 0,
    *,
    total_tokens: int | None = None,
) -> float:
    """One AdamW step on the NLL of the model-written tokens of `batch`, the mean over those tokens.

    One rank of a sharded update passes its share as `batch` and the whole batch's `total_tokens`
    (an empty share runs an idle sequence with zero weight, to join the collectives).
    """

    items = list(batch) or [idle_trajectory(pad_token_id)]
    logprobs = sequence_logprobs(
        model, [ScoredSequence(t.token_ids, t.prompt_length) for t in items], 1.0, pad_token_id
    )
    masks = [
        torch.tensor(t.loss_mask[t.prompt_length :], dtype=torch.float32, device=lp.device)
        for t, lp in zip(items, logprobs)
    ]
    tokens = total_tokens or sum(float(m.sum()) for m in masks)
    loss = -sum((lp * m).sum() for lp, m in zip(logprobs, masks)) / tokens
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[union-attr]
    clip_grad_norm([p for p in model.parameters() if p.requires_grad], max_grad_norm)
    optimizer.step()
    return float(loss.detach())  # type: ignore[union-attr]
