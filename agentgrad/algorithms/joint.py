"""Joint: the prompt and the weights trained together in one run, APO's prompt rounds between GRPO's weight steps.

GRPO's loop (`loop.py`) runs as it always does; every `prompt_every` steps, once the step's update serves, a prompt
round (`PromptRounds`) runs on the same store:

- criticize: APO's critic reads the failures among the rollouts the step just trained on (sampled under the
  current prompt);
- edit: APO's editor rewrites the prompt along the critique, `branch_factor` times (one edit style each); a rewrite
  that breaks the template (`apo_text.check_rewrite`) goes back to the editor with the reason (`repair_tries`), and
  is dropped if it still does;
- guard: the current prompt and each rewrite run the validation tasks under the weights just updated; the best
  rewrite replaces the prompt only if it beats the current one by more than chance (`base.beats`: the mean of the
  per-task reward differences, both prompts on the same tasks, past 1.645 standard errors for one rewrite, 1.96 for
  the best of two), else the prompt stays.
  The best of a few rewrites on a few tasks ties or wins by a task or two by chance: with "at least as well",
  `benchmarks/joint_vs_alone.py` ended its seed-0 run on a rewrite of no use, and with "better" its seed-1 run
  (18 of 32 against 15);
- publish: the loop publishes the policy again over the prompt kept, so the next step trains under it.

The critic and editor are APO's settings (`base_url`, `critic_model`, ...); by default they are the policy itself,
called through its gateway: recorded (agent `apo-critic` / `apo-editor`) and marked as no training data, so no
GRPO batch holds them, and no API key is needed. Weight steps keep their rollback (`rollback_on_drop`).

What each rollout ran with: its resources snapshot names the prompt (metadata `prompt_version`: 0 is the seed,
+1 for each rewrite kept) and every model call's span the weights version that sampled it. Every step logs
`prompt/version` beside `train/model_version` (the run's two histories, on one timeline: `agentgrad runs show`,
the dashboard); each rewrite scored is a snapshot with `purpose: prompt_candidate`, its score, the current
prompt's, and `status` kept or refused. A checkpoint holds the prompt with the weights, so a resumed run has both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentgrad.algorithms.apo import APO, prompt_resource
from agentgrad.algorithms.apo_critic import Critic
from agentgrad.algorithms.apo_text import EDIT_STYLES, changes, check_rewrite
from agentgrad.algorithms.async_rollouts import StepRollouts
from agentgrad.algorithms.base import Algorithm, Evaluation, RunContext, beats
from agentgrad.algorithms.grpo import GRPO, GroupBatches
from agentgrad.algorithms.grpo_config import GRPOConfig
from agentgrad.algorithms.loop import RoundOutcome, TrainsWeights
from agentgrad.algorithms.updates import ShardedTrain, Train
from agentgrad.algorithms.validation import Validation
from agentgrad.types import PromptTemplate, RolloutConfig


class Joint(TrainsWeights):
    """`Joint(apo=APO(...), grpo=GRPO(...), prompt_every=2)`: GRPO's run (its config, engine and checkpoints), with
    a prompt round of `apo`'s critic and editor after every `prompt_every`-th weight step. The agent takes a
    `PromptTemplate` resource: `Trainer(resources={"prompt": PromptTemplate(...)})`."""

    config: GRPOConfig
    config_type = GRPOConfig

    def __init__(self, apo: APO | None = None, grpo: GRPO | None = None, *, prompt_every: int = 2) -> None:
        self.apo, self.grpo = apo or APO(), grpo or GRPO()
        if isinstance(prompt_every, bool) or not isinstance(prompt_every, int) or prompt_every < 1:
            raise ValueError(f"Joint prompt_every is a number of weight steps (at least 1), got {prompt_every!r}")
        if self.grpo.config.max_staleness:
            raise ValueError(
                "Joint trains synchronously (GRPO max_staleness None or 0): rollouts queued ahead would run "
                "under a prompt a round has replaced"
            )
        self.prompt_every = prompt_every
        self.config, self.local_engine, self.model_name = self.grpo.config, self.grpo.local_engine, self.grpo.model_name
        self.demonstrations = self.grpo.demonstrations  # its weights' warm start, as GRPO alone would run it

    def settings(self) -> dict[str, Any]:
        return {"config": self.config, "prompt_every": self.prompt_every, "apo": self.apo.config}

    def bind(self, ctx: RunContext) -> RunContext:
        self.apo.bind(ctx)
        self.grpo.bind(ctx)
        return super().bind(ctx)

    def batches(self) -> GroupBatches:
        return self.grpo.batches()

    def losses(self) -> tuple[Train, ShardedTrain]:
        return self.grpo.losses()

    def roles(self) -> tuple[Mapping[str, str] | None, str | None]:
        return self.grpo.roles()

    def reference(self) -> bool:
        return self.grpo.reference()

    def rounds(self) -> PromptRounds:
        return PromptRounds(self.apo, self.prompt_every, self.config.rollout_config())


@dataclass
class PromptRounds:
    """The prompt side of a joint run (`loop.Rounds`): the current prompt, its version, and a round every `every`
    steps, its rollouts run as the run's others (`rollout`: GRPO's timeout and attempts, not APO's)."""

    apo: APO
    every: int
    rollout: RolloutConfig
    prompt_name: str = ""
    prompt: PromptTemplate | None = None
    version: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)  # each round: step, version, scores, kept

    async def start(self, algorithm: Algorithm[Any], state: Mapping[str, Any] | None) -> None:
        """Publish the prompt the run starts with: the agent's (version 0), or a resumed run's at its checkpoint."""
        latest = await algorithm.store.get_latest_resources()
        if latest is None:
            raise ValueError(
                "Joint trains the agent's prompt, and the store has no resources: pass "
                "Trainer(resources={'prompt': PromptTemplate(...)})"
            )
        self.prompt_name, self.prompt = prompt_resource(latest.resources, self.apo.config.prompt_name)
        status = "seed"
        if state:
            self.prompt = PromptTemplate.model_validate(state["prompt"])
            self.version, self.history, status = int(state["version"]), list(state["history"]), "resumed"
        await algorithm.publish(
            {**latest.resources, self.prompt_name: self.prompt},
            {"algorithm": "joint", "purpose": "prompt", "prompt_version": self.version, "status": status},
        )

    def labels(self) -> dict[str, Any]:
        return {"prompt_version": self.version}

    def state(self) -> dict[str, Any]:
        assert self.prompt is not None
        return {"prompt": self.prompt.model_dump(), "version": self.version, "history": self.history}

    async def after_step(self, step: int, collected: StepRollouts, validation: Validation) -> RoundOutcome:
        """A prompt round after every `every`-th step (on its rollouts, under its new weights); each step's
        `prompt/version`."""
        if step % self.every or not validation.tasks:
            return RoundOutcome(metrics={"prompt/version": self.version})
        began = time.perf_counter()
        outcome = await self.round(step, collected, validation)
        outcome.metrics.update(
            {"prompt/version": self.version, "perf/prompt_round_seconds": time.perf_counter() - began}
        )
        return outcome

    async def round(self, step: int, collected: StepRollouts, validation: Validation) -> RoundOutcome:
        """Criticize, edit, score under the current weights, keep the best rewrite if it beats the current prompt."""
        apo, cfg, store = self.apo, self.apo.config, self.apo.store
        assert self.prompt is not None
        current = await store.get_resources(validation.resources_id)  # the policy (greedy) and the current prompt
        critic = Critic.of(cfg, current.resources)
        try:
            # ---- criticize the failures among the rollouts the step just trained on
            critique = await critic.criticize(store, self.prompt, collected.rollouts)
            if critique.text is None:
                why = "no failures" if critique.tally.no_failures else "no usable critique"
                counts = {"prompt/candidates": 0.0, "prompt/unusable_replies": float(critique.tally.unusable)}
                return RoundOutcome(metrics=counts, summary=f"prompt v{self.version}: {why}")
            # ---- edit along it, one edit style per rewrite (a rewrite that breaks the template goes back once)
            styles = [EDIT_STYLES[i % len(EDIT_STYLES)] for i in range(cfg.branch_factor)]
            replies = await asyncio.gather(*(critic.edit(self.prompt, critique.text, s) for s in styles))
        finally:
            await critic.close()
        rewrites: dict[str, PromptTemplate] = {}
        for reply in replies:
            if reply.text is not None:
                rewrite = self.prompt.model_copy(update={"template": reply.text})
                if check_rewrite(self.prompt, rewrite) is None:
                    rewrites.setdefault(reply.text, rewrite)
        metrics = {
            "prompt/candidates": float(len(rewrites)),
            "prompt/unusable_replies": float(sum(r.tally.unusable for r in (critique, *replies))),
            "prompt/repaired": float(sum(r.tally.repaired for r in replies)),
        }
        if not rewrites:
            return RoundOutcome(metrics=metrics, summary=f"prompt v{self.version}: no usable rewrite")
        # ---- guard: the current prompt and each rewrite on the validation tasks (APO's `val_size` of them), under
        # the current weights
        tasks = validation.tasks[: cfg.val_size]
        ids = [
            await apo.publish(
                {**current.resources, self.prompt_name: rewrite},
                {
                    "algorithm": "joint",
                    "purpose": "prompt_candidate",
                    "step": step,
                    "parent_version": self.version,
                    "critique": critique.text,
                    "status": "pending",
                },
            )
            for rewrite in rewrites.values()
        ]
        runs = await asyncio.gather(*(apo.validate(r, tasks, step, self.rollout) for r in [current.resources_id, *ids]))
        score, *scores = [Evaluation.of(r, cfg.success_threshold).reward_mean for r in runs]
        current_rewards, *rewrite_rewards = [Evaluation.rewards(r) for r in runs]
        best = max(range(len(ids)), key=lambda i: scores[i])
        kept = beats(rewrite_rewards[best], current_rewards, compared=len(ids))
        for i, resources_id in enumerate(ids):
            status = "kept" if kept and i == best else "refused"
            await store.update_resources(resources_id, {"status": status, "score": scores[i], "current_score": score})
        old = self.prompt
        if kept:
            self.prompt, self.version = list(rewrites.values())[best], self.version + 1
        # ---- publish the prompt kept as the latest resources: the loop publishes the policy over it
        await apo.publish(
            {**current.resources, self.prompt_name: self.prompt},
            {"algorithm": "joint", "purpose": "prompt", "prompt_version": self.version, "status": "current"},
        )
        self.history.append(
            {"step": step, "version": self.version, "score": score, "best_candidate": scores[best], "kept": kept}
        )
        metrics.update({"prompt/score": score, "prompt/candidate_best": scores[best], "prompt/kept": float(kept)})
        verdict = "kept" if kept else "refused" if scores[best] <= score else "refused (within chance)"
        summary = f"prompt v{self.version}: rewrite {scores[best]:.2f} vs {score:.2f} {verdict}"
        if kept:
            apo.console.print(
                f"prompt v{self.version} (step {step}): {changes(old.template, self.prompt.template)}",
                markup=False,
                highlight=False,
            )
        return RoundOutcome(published=True, metrics=metrics, summary=summary)
