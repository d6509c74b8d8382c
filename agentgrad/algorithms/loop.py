"""The training loop, written once: every algorithm that trains weights (GRPO, SFT) runs `train`.

Each step: collect the step's rollouts (each sampled task `group_size` times; queued `max_staleness` steps ahead
when asynchronous; more tasks drawn while the batch builder wants them: GRPO's dynamic sampling), read their spans
in one query, turn them into a batch (the algorithm's `BatchBuilder`), update the policy (its `Update`: local,
sharded or per role), log; validate on schedule, roll back on a regression, checkpoint, and stop after
`max_failed_steps` steps in which every rollout failed. A run with a checkpoint in its `checkpoint_dir` resumes
after it. An algorithm supplies only the two objects that differ; modes (roles,
per-turn credit, sharding, judges) live inside them, so this file tests none. Validation, checkpoints and the
progress line are their own modules (`validation.py`, `checkpoints.py`, `progress.py`).
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from agentgrad.algorithms.async_rollouts import RolloutPipeline, StepRollouts
from agentgrad.algorithms.base import (
    Algorithm,
    Evaluation,
    Result,
    RunContext,
    count_no_reward,
    flag_no_model_calls,
    no_model_calls_error,
)
from agentgrad.algorithms.checkpoints import Checkpoints
from agentgrad.algorithms.config import LoopConfig, configured
from agentgrad.algorithms.demonstrations import Demonstration, one_process_only, to_trajectories, warm_start
from agentgrad.algorithms.progress import progress_bar
from agentgrad.algorithms.rollback import RollbackGuard
from agentgrad.algorithms.updates import LocalUpdate, ShardedTrain, Train, Update, open_update
from agentgrad.algorithms.validation import Validation
from agentgrad.distributed.group import follow
from agentgrad.engine import Engine
from agentgrad.engine.threads import in_own_thread
from agentgrad.gateway.sampling import SamplingPlan
from agentgrad.policy.base import Policy
from agentgrad.policy.config import make_policy
from agentgrad.semconv import is_llm_call
from agentgrad.types import Rollout, RolloutStatus, Span


@dataclass
class Batch:
    """One step's rollouts as training data: what the update trains on, and what the step reports of it."""

    data: Any  # the update's input (GRPO: (trajectory, advantage) pairs, or per role; SFT: the kept trajectories)
    size: int  # sequences to train on; 0 skips the update
    rewards: list[float]  # of the rollouts read (successful), after any judge
    generated_tokens: int  # sampled in them, trained on or not
    sequences: int  # trajectories in them, trained on or not
    metrics: dict[str, float] = field(default_factory=dict)  # the algorithm's own `train/...` figures
    summary: str = ""  # a few words for the progress line ("groups 5/8", "kept 12")


class BatchBuilder(Protocol):
    """How a step's finished rollouts become a batch (`spans`: each successful rollout's, by rollout id)."""

    async def build(self, step: StepRollouts, spans: Mapping[str, list[Span]]) -> Batch: ...

    def wants_more(self, step: StepRollouts, batch: Batch) -> bool:
        """Whether the step should draw more tasks' groups, given the batch its rollouts so far make (GRPO's dynamic
        sampling); the batch is then built again from all of them."""
        ...


@dataclass(frozen=True)
class RoundOutcome:
    """What happened to the agent's other resources after a step: whether new ones were published (the loop then
    publishes the policy again over them), the step's figures of it, and a few words for the progress line."""

    published: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    summary: str = ""


class Rounds(Protocol):
    """What changes the agent's other resources between weight steps (Joint: APO's prompt rounds), on the run's
    store; `NoRounds` for GRPO and SFT alone. Its `state()` goes into each checkpoint and `start` gets it back."""

    async def start(self, algorithm: Algorithm[Any], state: Mapping[str, Any] | None) -> None: ...

    def labels(self) -> dict[str, Any]: ...

    async def after_step(self, step: int, collected: StepRollouts, validation: Validation) -> RoundOutcome: ...

    def state(self) -> dict[str, Any]: ...


class NoRounds:
    """The agent's other resources stay as the run found them (GRPO, SFT)."""

    async def start(self, algorithm: Algorithm[Any], state: Mapping[str, Any] | None) -> None:
        return None

    def labels(self) -> dict[str, Any]:
        return {}

    async def after_step(self, step: int, collected: StepRollouts, validation: Validation) -> RoundOutcome:
        return RoundOutcome()

    def state(self) -> dict[str, Any]:
        return {}


class TrainsWeights(Algorithm[Result]):
    """An algorithm that trains a local model's weights through the loop (GRPO, SFT): it supplies its config type,
    its batch builder and its loss (`Train`, and the same on one rank of a sharded update); the policy, the update
    and the loop are built here once.

    `Algorithm(config, local_engine=..., model=..., name=value)`: keyword overrides copy the config, never change
    it; a `PolicyConfig` field name (`engine="vllm"`, `lora_rank=8`) sets `config.policy`'s. `local_engine` is a
    built-in `Engine` already loaded in this process, whose weights are trained; without it `model` is loaded
    (default SmolLM2). `demonstrations`: chats in OpenAI's fine-tuning format the policy is fine-tuned on (SFT,
    `config.warm_start_*`) after the first validation and before the first step (`demonstrations.py`).
    """

    serves_gateway = True
    config: LoopConfig
    config_type: type[LoopConfig] = LoopConfig

    def __init__(
        self,
        config: LoopConfig | None = None,
        *,
        local_engine: Engine | None = None,
        model: str | None = None,
        demonstrations: Sequence[Demonstration] = (),
        **overrides: Any,
    ) -> None:
        self.config = configured(config, self.config_type, overrides, type(self).__name__)
        self.local_engine = local_engine
        self.model_name = model
        self.demonstrations = list(demonstrations)

    def batches(self) -> BatchBuilder:
        """How this algorithm turns a step's rollouts into a batch."""
        raise NotImplementedError

    def losses(self) -> tuple[Train, ShardedTrain]:
        """Its optimizer step on a batch: in this process, and on one rank of a training group."""
        raise NotImplementedError

    def roles(self) -> tuple[Mapping[str, str] | None, str | None]:
        """One LoRA adapter per agent role (role -> agent pattern) and the default role; (None, None): one policy."""
        return None, None

    def reference(self) -> bool:
        """Whether the update keeps a frozen reference of the starting weights (a KL term)."""
        return False

    def rounds(self) -> Rounds:
        """What changes the agent's other resources between weight steps (Joint: its prompt); none by default."""
        return NoRounds()

    async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> Result:
        self.bind(ctx)
        cfg = self.config
        if not train_data:
            raise ValueError(f"{type(self).__name__} needs training tasks")
        roles, default_role = self.roles()
        with make_policy(
            cfg.policy,
            ctx.store,
            self.local_engine,
            self.model_name,
            gateway_port=ctx.gateway_port,
            listen=ctx.listen,
            roles=roles,
            default_role=default_role,
        ) as policy:
            update = open_update(policy, cfg, ctx.launcher, *self.losses(), reference=self.reference())
            try:
                data, val = list(train_data), list(val_data or [])
                warm: Callable[[], dict[str, float]] | None = None
                if self.demonstrations:  # rendered now: a bad one is an error before the first validation
                    if not isinstance(update, LocalUpdate):
                        raise ValueError(one_process_only(update))
                    shown = to_trajectories(self.demonstrations, policy.engine.tokenizer)
                    warm = functools.partial(warm_start, update, shown, cfg)
                return await train(self, cfg, policy, self.batches(), update, data, val, self.rounds(), warm)
            finally:
                update.close()

    def follow(self) -> None:
        """A rank past 0 under torchrun: build this rank's shard and join each update rank 0 runs."""
        from agentgrad.engine.model import load_model

        follow(lambda: self.local_engine.model if self.local_engine is not None else load_model(self.model_name)[0])


async def train(
    algorithm: Algorithm[Any],
    cfg: LoopConfig,
    policy: Policy,
    builder: BatchBuilder,
    update: Update,
    train_data: Sequence[Any],
    val_data: Sequence[Any],
    rounds: Rounds | None = None,
    warm: Callable[[], dict[str, float]] | None = None,
) -> Result:
    """Run `cfg.steps` steps of `algorithm` (its context bound) on the policy, `rounds` changing the agent's other
    resources between them (none by default), after `warm` (a warm start's SFT, `demonstrations.warm_start` bound)
    when the run starts at step 0; the run's `Result`."""
    name = type(algorithm).__name__
    rounds = rounds or NoRounds()
    checkpoints = Checkpoints(cfg)
    start, history, state = checkpoints.resume(update, algorithm)
    await rounds.start(algorithm, state.get("rounds"))  # resumed: the resources it had at the checkpoint
    train_id, val_id = await publish_policy(algorithm, cfg, policy, rounds.labels())
    pipeline = RolloutPipeline.of(algorithm, cfg, train_data, start, train_id, state.get("queued"), state.get("drawn"))
    validation = Validation(algorithm, cfg, val_data[: cfg.val_size], val_id)
    guard = RollbackGuard.of(cfg, checkpoints.directory)
    validated: Evaluation | None
    if state.get("validated") is not None:  # resumed at a step validated before it was saved
        validated = await validation.restore(start, Evaluation(**state["validated"]), guard, update)
    else:  # the run's start, or a resume from a step saved unvalidated: the rollback guard's baseline
        validated = await validation.run(start, guard, update, announce=True)
    await algorithm.log_metrics(start, {"train/model_version": policy.version})  # what it ran (LoRA starts at v1)
    if warm is not None and start == 0:  # a resumed run's checkpoint holds the warm-started weights
        began = time.perf_counter()
        stats = await asyncio.to_thread(in_own_thread, warm)
        await algorithm.log_metrics(0, {f"warm_start/{k}": v for k, v in stats.items()})
        algorithm.console.print(
            f"warm start: SFT on {int(stats['demonstrations'])} demonstrations "
            f"({int(stats['trained_tokens'])} trained tokens, {cfg.warm_start_epochs} epoch(s)), "
            f"loss {stats['loss']:.3f}, {time.perf_counter() - began:.0f} s; serving v{policy.version}"
        )
    initial = Evaluation(**state["initial"]) if state.get("initial") else validated  # the run's, not the resume's
    stop, failed_steps, run_began = False, 0, time.perf_counter()
    with progress_bar(name, algorithm.console, cfg.steps, start) as progress:
        for step in range(start + 1, cfg.steps + 1):
            began = time.perf_counter()
            # ---- collect: the step's rollouts (asynchronous: queued ahead, running meanwhile)
            collected = await pipeline.collect(step, policy.version)
            # ---- adapt: spans -> the algorithm's batch
            spans = await read_spans(algorithm, [r for r in collected.trained[0] if _ok(r)])
            batch = await builder.build(collected, spans)
            while builder.wants_more(collected, batch):  # dynamic sampling: more groups, on the same weights
                drawn = len(collected.rollouts)
                collected = await pipeline.draw_more(collected)
                spans |= await read_spans(algorithm, [r for r in collected.rollouts[drawn:] if _ok(r)])
                batch = await builder.build(collected, spans)
            rollout_seconds = time.perf_counter() - began  # the rollouts and the batch built from them
            failed_steps = 0 if any(_ok(r) for r in collected.rollouts) else failed_steps + 1
            check_failed_steps(algorithm, cfg, step, failed_steps)
            # ---- optimize: the update on the batch, then the new weights serve
            update_began = time.perf_counter()
            stats = await asyncio.to_thread(in_own_thread, update.step, batch.data) if batch.size else {}
            update_seconds = time.perf_counter() - update_began
            await pipeline.published(step)  # asynchronous: the runners go on through validation and checkpoints
            # ---- the other resources (Joint: a prompt round on the rollouts just trained on, under the new weights)
            outcome = await rounds.after_step(step, collected, validation)
            if outcome.published:
                train_id, val_id = await publish_policy(algorithm, cfg, policy, rounds.labels())
                pipeline.resources_id, validation.resources_id = train_id, val_id
            # ---- log
            metrics = step_metrics(cfg, collected, batch, stats, policy.version, began, rollout_seconds, update_seconds)
            metrics["perf/peak_memory_gib"] = policy.engine.peak_memory_bytes() / 2**30
            metrics.update(outcome.metrics)
            await algorithm.log_metrics(step, metrics)
            history.append({"step": step, **metrics})
            line = " | ".join(part for part in (describe(metrics, batch), outcome.summary) if part)
            # ---- validate, roll back, checkpoint (and stop past the time budget, validated and saved)
            budget = cfg.time_budget_s
            out_of_time = budget is not None and time.perf_counter() - run_began >= budget
            score = None
            if validation.due(step) or out_of_time:
                validated = await validation.run(step, guard, update)
                stop = validation.stop
                score = validated.success_rate if validated is not None else None
                line += f" | val acc {score:.3f}" if score is not None else ""
            progress.step(step, line)
            if checkpoints.due(step) or (out_of_time and checkpoints.directory is not None):
                state = {
                    "step": step,
                    "history": history,
                    "config": asdict(cfg),
                    "queued": pipeline.state(),
                    "drawn": pipeline.sampler.drawn,
                    "initial": asdict(initial) if initial is not None else None,
                    "validated": asdict(validated) if score is not None and validated is not None else None,
                    "rounds": rounds.state(),
                }
                await checkpoints.save(algorithm, update, step, score, state)
            if stop or out_of_time:
                break
    return checkpoints.result(cfg.steps, initial, validation, guard, history)


# ----------------------------------------------------------------------------- the phases


async def publish_policy(
    algorithm: Algorithm[Any], cfg: LoopConfig, policy: Policy, labels: Mapping[str, Any] | None = None
) -> tuple[str, str]:
    """Publish the policy behind the gateway (the agent's other resources kept) for training and for validation
    (greedy), `labels` in both snapshots' metadata, and have the gateway apply the trainer's sampling to every
    call; the two resources ids."""
    name = type(algorithm).__name__.lower()
    train_id = await algorithm.publish_with(
        cfg.resource_name,
        policy.llm(temperature=cfg.temperature, max_tokens=cfg.max_tokens),
        {"algorithm": name, "purpose": "train", **(labels or {})},
    )
    val_id = await algorithm.publish_with(
        cfg.resource_name,
        policy.llm(temperature=0.0, max_tokens=cfg.max_tokens),
        {"algorithm": name, "purpose": "val", **(labels or {})},
    )
    policy.set_sampling(SamplingPlan.for_training(cfg.temperature, cfg.top_p, cfg.max_tokens, cfg.sampling))
    return train_id, val_id


def check_failed_steps(algorithm: Algorithm[Any], cfg: LoopConfig, step: int, failed_steps: int) -> None:
    """Stop a run whose every rollout failed `max_failed_steps` steps in a row, with the errors they had."""
    if cfg.max_failed_steps and failed_steps >= cfg.max_failed_steps:
        failures = algorithm.last_failures.describe("train", algorithm.store) if algorithm.last_failures else ""
        raise RuntimeError(
            f"{type(algorithm).__name__} stopped at step {step}: every rollout failed in {failed_steps} step(s) in a "
            f"row (max_failed_steps={cfg.max_failed_steps})\n{failures}"
        )


async def read_spans(algorithm: Algorithm[Any], rollouts: Sequence[Rollout]) -> dict[str, list[Span]]:
    """The spans of the step's successful rollouts, in one query; those rewarded with no model call through the
    gateway are marked, and a step where none made one is an error (nothing to train on: never a silent zero)."""
    spans = await algorithm.store.query_spans_of([r.rollout_id for r in rollouts])
    calls = [sum(is_llm_call(s) for s in spans[r.rollout_id]) for r in rollouts]
    flagged = await flag_no_model_calls(algorithm.store, rollouts, calls)
    rewarded = sum(r.reward is not None for r in rollouts)
    if rewarded and not sum(calls):
        raise no_model_calls_error(type(algorithm).__name__, rewarded)
    if flagged:
        algorithm.console.print(
            f"{flagged} of {len(rollouts)} rewarded rollouts made no model call through the gateway "
            "(marked in their metadata): some agent calls bypass it",
            highlight=False,
            markup=False,
        )
    return spans


def step_metrics(
    cfg: LoopConfig,
    collected: StepRollouts,
    batch: Batch,
    stats: Mapping[str, float],
    version: int,
    began: float,
    rollout_seconds: float,
    update_seconds: float,
) -> dict[str, float]:
    """The step's figures, named by group: `train/` (the batch's and the update's), `perf/`, `async/`."""
    rewards, rollouts = batch.rewards, collected.rollouts
    update_stats = dict(stats)
    sync_seconds = update_stats.pop("sync_seconds", 0.0)  # of update_seconds: new weights into the engine
    return {
        "train/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "train/reward_std": statistics.pstdev(rewards) if rewards else 0.0,
        "train/accuracy": sum(r >= cfg.success_threshold for r in rewards) / max(len(rewards), 1),
        "train/failed_rollouts": sum(not _ok(r) for r in rollouts),
        "train/groups_sampled": len(set(collected.groups)),  # prompts_per_step, or more under dynamic sampling
        "train/no_reward": count_no_reward(rollouts),
        "train/response_length": batch.generated_tokens / max(batch.sequences, 1),
        **batch.metrics,
        **{f"train/{k}": v for k, v in update_stats.items()},
        "train/model_version": version,
        "perf/rollout_seconds": rollout_seconds,
        "perf/update_seconds": update_seconds,
        "perf/sync_seconds": sync_seconds,
        "perf/step_seconds": time.perf_counter() - began,
        "perf/tokens_per_s": batch.generated_tokens / max(rollout_seconds, 1e-9),
        **collected.metrics(),  # asynchronous: staleness distribution, dropped groups
    }


def describe(metrics: Mapping[str, float], batch: Batch) -> str:
    """The progress line of a step."""
    parts = [
        f"reward {metrics['train/reward_mean']:.2f}",
        f"acc {metrics['train/accuracy']:.2f}",
        f"loss {metrics.get('train/loss', 0.0):+.3f}",
        batch.summary,
        f"{metrics['perf/step_seconds']:.1f}s",
    ]
    return " ".join(part for part in parts if part)


def _ok(rollout: Rollout) -> bool:
    return rollout.status is RolloutStatus.SUCCEEDED
