"""APO: automatic prompt optimization, a beam search over prompt templates with textual gradients.

For agents whose model cannot be trained (a hosted API), improve the prompt instead. Each round,
every prompt in the beam runs a batch of training tasks; a critic model reads the failures and
says what in the prompt causes them (the textual gradient); an editor model rewrites the prompt
along that critique, `branch_factor` times; the rewrites are scored on validation tasks and the
best `beam_width` prompts, old and new, go on. After ProTeGi (Pryzant et al., EMNLP 2023).

Every prompt tried is a resources snapshot in the store whose metadata says its `round`,
`parent`, `critique`, `score` and `status` (`seed`, `scored`, or `rejected` with a `reason`), so
the search can be read back afterwards. The best prompt is published last, as the latest resources, if it beats
the seed past chance as the best of all those scored (`base.beats`); else the seed prompt is.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table
from rich.text import Text

from agentgrad.algorithms.apo_config import APOConfig
from agentgrad.algorithms.apo_critic import APOError, Critic, Tally
from agentgrad.algorithms.apo_text import EDIT_STYLES, changes, check_rewrite
from agentgrad.algorithms.base import Algorithm, Evaluation, Result, RunContext, beats
from agentgrad.algorithms.config import configured
from agentgrad.types import (
    NamedResources,
    PromptTemplate,
    ResourcesSnapshot,
    Rollout,
    RolloutConfig,
    RolloutStatus,
)


class APO(Algorithm["APOResult"]):
    """Beam search over the agent's `PromptTemplate` resource: `APO(APOConfig(...), name=value)`; `run` returns an
    `APOResult`.

    It starts from the latest resources in the store (publish them with `Trainer(resources=...)`).
    The critic and editor are called through an OpenAI-compatible endpoint: `base_url` and
    `api_key`, by default those of the agent's `LLM` resource.
    """

    config: APOConfig

    def __init__(self, config: APOConfig | None = None, **overrides: Any) -> None:
        self.config = configured(config, APOConfig, overrides, "APO")
        self.history: list[dict[str, float]] = []  # each round's figures, round 0 the seed's

    async def run(self, ctx: RunContext, train_data: Sequence[Any], val_data: Sequence[Any] | None) -> APOResult:
        self.bind(ctx)
        # ---- setup: the seed snapshot, the prompt to optimize, the data, the critic/editor endpoint
        if not train_data:
            raise ValueError("APO needs training tasks: the critic learns from the failures among them")
        if not val_data:
            raise ValueError("APO needs validation tasks to score the prompts: pass val_data to fit")
        seed_snapshot = await self.store.get_latest_resources()
        if seed_snapshot is None:
            raise ValueError(
                "APO starts from the agent's resources, and the store has none: "
                "pass Trainer(resources={'prompt': PromptTemplate(...), 'llm': LLM(...)})"
            )
        cfg = self.config
        name, seed_prompt = prompt_resource(seed_snapshot.resources, cfg.prompt_name)
        rng = random.Random(cfg.seed)
        val_tasks = list(val_data)
        if cfg.val_size is not None and cfg.val_size < len(val_tasks):
            val_tasks = rng.sample(val_tasks, cfg.val_size)
        train_order = list(train_data)
        rng.shuffle(train_order)
        batch_size = min(cfg.prompts_per_step, len(train_order))
        critic = Critic.of(cfg, seed_snapshot.resources)
        search = Search(critic, name, seed_snapshot, val_tasks, train_order, batch_size)
        try:
            seed = best = await self.score_seed(search, seed_prompt)
            beam, round_best, compared = [seed], [seed.score], 0
            tried = {seed_prompt.template: seed.resources_id}  # template -> the snapshot that first held it
            began = time.monotonic()
            for round_ in range(1, cfg.steps + 1):
                if cfg.time_budget_s is not None and time.monotonic() - began >= cfg.time_budget_s:
                    break
                started = time.monotonic()
                outcome = await self.search_round(search, round_, beam, tried)
                beam, compared = outcome.beam, compared + len(outcome.scored)
                if beam[0].score_or_zero > best.score_or_zero:
                    best = beam[0]
                round_best.append(max(outcome.scores) if outcome.scores else None)
                await self.report_round(round_, outcome, best, time.monotonic() - started)
        finally:
            await critic.close()
        return await self.publish_best(search, seed, best, round_best, compared)

    # ------------------------------------------------------------------ the phases of a run

    async def score_seed(self, search: Search, seed_prompt: PromptTemplate) -> Candidate:
        """Round 0: score the seed prompt; an agent that fails on every task stops the search here."""
        seed_id = search.seed.resources_id
        seed_runs = await self.validate(seed_id, search.val_tasks, 0)
        if not any(r.status is RolloutStatus.SUCCEEDED for r in seed_runs):
            attempts = await self.store.query_attempts(seed_runs[0].rollout_id)
            error = attempts[-1].error if attempts else f"the rollout is still {seed_runs[0].status.value}"
            raise APOError(
                f"every validation rollout of the seed prompt failed, the first with: {error}; "
                "APO needs an agent that runs (try it with Trainer.dev)"
            )
        evaluation = Evaluation.of(seed_runs, self.config.success_threshold)
        seed_score = evaluation.reward_mean
        await self.store.update_resources(
            seed_id,
            {
                "algorithm": "apo",
                "prompt_name": search.prompt_name,
                "round": 0,
                "parent": None,
                "status": "seed",
                "score": seed_score,
            },
        )
        seed_metrics = {"apo/best_score": seed_score, "apo/round_best": seed_score, "apo/beam_mean": seed_score}
        await self.log_metrics(0, seed_metrics)
        self.history = [{"step": 0, **seed_metrics}]
        self.console.print(
            f"[bold]APO[/bold] round 0: seed prompt {seed_id} scores {seed_score:.3f} "
            f"on {len(search.val_tasks)} validation tasks"
        )
        return Candidate(seed_id, seed_prompt, 0, None, evaluation, Evaluation.rewards(seed_runs))

    async def search_round(self, search: Search, round_: int, beam: list[Candidate], tried: dict[str, str]) -> Round:
        """One round: collect, criticize, edit, check and publish, score, select. `tried` gains the new templates."""
        # ---- collect: every prompt in the beam runs the same batch of training tasks
        batch = search.train_batch(round_)
        train_runs = await asyncio.gather(
            *(
                self.run_rollouts(
                    batch,
                    mode="train",
                    resources_id=parent.resources_id,
                    config=self.config.rollout_config(),
                    metadata=[{"apo_round": round_}] * len(batch),
                    timeout=self.config.batch_timeout,
                )
                for parent in beam
            )
        )

        # ---- textual gradient: the critic reads each prompt's failures and says what to change
        critiques = await asyncio.gather(
            *(search.critic.criticize(self.store, parent.prompt, runs) for parent, runs in zip(beam, train_runs))
        )

        # ---- edit: the editor rewrites each criticized prompt `branch_factor` times
        edits = [
            (parent, critique.text, EDIT_STYLES[i % len(EDIT_STYLES)])
            for parent, critique in zip(beam, critiques)
            if critique.text is not None
            for i in range(self.config.branch_factor)
        ]
        rewrites = await asyncio.gather(
            *(search.critic.edit(parent.prompt, critique, style) for parent, critique, style in edits)
        )

        # ---- check and publish, then score the candidates that passed on the validation tasks
        candidates, rows, published = await self.publish_rewrites(
            search, round_, [(*edit, rewrite.text) for edit, rewrite in zip(edits, rewrites)], tried
        )
        await self.score_candidates(search, round_, candidates)
        for candidate in candidates:
            rows[candidate.resources_id][2:4] = [f"{candidate.score_or_zero:.3f}", "scored"]

        # ---- select: the best `beam_width` of the old beam and the new candidates (old ones win ties)
        train_rewards = [Evaluation.of(runs).reward_mean for runs in train_runs]
        return Round(
            beam=sorted(beam + candidates, key=lambda c: -c.score_or_zero)[: self.config.beam_width],
            scored=candidates,
            rows=list(rows.values()),
            train_reward_mean=sum(train_rewards) / len(train_rewards),
            tally=sum((reply.tally for reply in [*critiques, *rewrites]), published),
        )

    async def publish_rewrites(
        self,
        search: Search,
        round_: int,
        rewrites: Sequence[tuple[Candidate, str, str, str | None]],
        tried: dict[str, str],
    ) -> tuple[list[Candidate], dict[str, list[str]], Tally]:
        """Every usable rewrite (parent, critique, style, template) becomes a snapshot; a broken one is rejected
        with the reason. Returns the candidates to score, the round's table rows by snapshot (id, parent, score,
        status, change; in publish order), and the count of snapshots and rejections."""
        candidates: list[Candidate] = []
        rows: dict[str, list[str]] = {}
        rejected = 0
        for parent, critique, style, template in rewrites:
            if template is None:
                continue  # no usable reply after `max_tries`: counted in `skipped`, nothing to store
            prompt = parent.prompt.model_copy(update={"template": template})
            reason = check_rewrite(parent.prompt, prompt)
            if reason is None and template in tried:
                reason = f"same template as {tried[template]}"
            resources_id = await self.publish(
                {**search.seed.resources, search.prompt_name: prompt},
                {
                    "algorithm": "apo",
                    "prompt_name": search.prompt_name,
                    "round": round_,
                    "parent": parent.resources_id,
                    "critique": critique,
                    "edit_style": style,
                    "status": "rejected" if reason else "pending",
                    "reason": reason,
                },
            )
            tried.setdefault(template, resources_id)
            rows[resources_id] = [
                resources_id,
                parent.resources_id,
                "-",
                f"rejected: {reason}" if reason else "pending",
                changes(parent.prompt.template, template),
            ]
            if reason:
                rejected += 1
            else:
                candidates.append(Candidate(resources_id, prompt, round_, parent.resources_id))
        return candidates, rows, Tally(candidates=len(rows), rejected=rejected)

    async def score_candidates(self, search: Search, round_: int, candidates: Sequence[Candidate]) -> None:
        """Score each candidate on the validation tasks (its mean reward), in its snapshot's metadata too."""
        runs = await asyncio.gather(*(self.validate(c.resources_id, search.val_tasks, round_) for c in candidates))
        for candidate, candidate_runs in zip(candidates, runs):
            candidate.evaluation = Evaluation.of(candidate_runs, self.config.success_threshold)
            candidate.rewards = Evaluation.rewards(candidate_runs)
            await self.store.update_resources(candidate.resources_id, {"status": "scored", "score": candidate.score})

    async def report_round(self, round_: int, outcome: Round, best: Candidate, seconds: float) -> None:
        """The round's metrics in the store, its table and a summary line on the console."""
        tally, scores = outcome.tally, outcome.scores
        metrics = {
            "apo/best_score": best.score_or_zero,
            "apo/beam_mean": sum(c.score_or_zero for c in outcome.beam) / len(outcome.beam),
            "apo/train_reward_mean": outcome.train_reward_mean,
            "apo/candidates": tally.candidates,
            "apo/scored": len(outcome.scored),
            "apo/rejected": tally.rejected,
            "apo/unusable_replies": tally.unusable,
            "apo/skipped": tally.skipped,
            "apo/repaired": tally.repaired,
            "apo/no_failures": tally.no_failures,
            "perf/round_seconds": seconds,
        }
        if scores:
            metrics["apo/round_best"] = max(scores)
        await self.log_metrics(round_, metrics)
        self.history.append({"step": round_, **metrics})
        self.console.print(round_table(round_, outcome.rows))
        self.console.print(
            f"[bold]APO[/bold] round {round_}: best candidate {'-' if not scores else f'{max(scores):.3f}'}, "
            f"best so far {best.score_or_zero:.3f} ({best.resources_id}) · scored {len(outcome.scored)}, "
            f"rejected {tally.rejected}, repaired by the editor {tally.repaired}, "
            f"critic/editor replies given up {tally.skipped}, "
            f"prompts without failures to learn from {tally.no_failures}"
        )

    async def publish_best(
        self, search: Search, seed: Candidate, best: Candidate, round_best: list[float | None], compared: int
    ) -> APOResult:
        """Publish the best prompt as the latest resources, for whatever runs next: the best candidate only if it beats
        the seed past chance on the same validation tasks, as the best of the `compared` scored (`base.beats`), else
        the seed (the best of many scores above the seed by chance: on a 135M model's calculator, chance winners
        published this way ended at the untrained model's held-out accuracy)."""
        seed_score = seed.score_or_zero
        if best is not seed and not beats(best.rewards, seed.rewards, compared):
            self.console.print(
                f"[bold]APO[/bold] the best candidate, {best.resources_id} ({best.score_or_zero:.3f} against the seed's "
                f"{seed_score:.3f} on {len(seed.rewards)} validation tasks), does not beat the seed past chance as "
                f"the best of {compared}: the seed prompt stays"
            )
            best = seed
        final = await self.publish(
            {**search.seed.resources, search.prompt_name: best.prompt},
            {
                "algorithm": "apo",
                "prompt_name": search.prompt_name,
                "status": "best",
                "source": best.resources_id,
                "round": best.round,
                "score": best.score_or_zero,
            },
        )
        self.console.print(
            f"[bold]APO[/bold] best prompt: {best.resources_id} from round {best.round}, "
            f"score {best.score_or_zero:.3f} (seed {seed_score:.3f}), published as {final}:"
        )
        self.console.print(best.prompt.template, markup=False, highlight=False)
        return APOResult(
            steps=self.config.steps,
            initial=seed.evaluation,
            final=best.evaluation,
            best=best.evaluation,
            history=self.history,
            prompt=best.prompt,
            resources_id=final,
            source_id=best.resources_id,
            round_best=round_best,
        )

    # ------------------------------------------------------------------ rollouts and model calls

    async def validate(
        self, resources_id: str, tasks: Sequence[Any], round_: int, config: RolloutConfig | None = None
    ) -> list[Rollout]:
        """Run the validation tasks with the prompt of snapshot `resources_id`; its score is their mean reward.
        `config`: how each rollout runs (default APO's own settings; a joint run's are GRPO's)."""
        return await self.run_rollouts(
            tasks,
            mode="val",
            resources_id=resources_id,
            config=config or self.config.rollout_config(),
            metadata=[{"apo_round": round_}] * len(tasks),
            timeout=self.config.batch_timeout,
        )


@dataclass
class Candidate:
    """A prompt in the search: the snapshot that holds it, where it came from, its validation score."""

    resources_id: str
    prompt: PromptTemplate
    round: int
    parent: str | None
    evaluation: Evaluation | None = None  # on the validation tasks; its mean reward is the score
    rewards: list[float] = field(default_factory=list)  # each validation task's reward, in the tasks' order

    @property
    def score(self) -> float | None:
        return self.evaluation.reward_mean if self.evaluation is not None else None

    @property
    def score_or_zero(self) -> float:
        return self.score if self.score is not None else 0.0


@dataclass(frozen=True)
class Search:
    """What every round of one run shares: the critic's and editor's endpoint, the seed, the tasks."""

    critic: Critic
    prompt_name: str
    seed: ResourcesSnapshot
    val_tasks: list[Any]  # every prompt is scored on these same tasks
    train_order: list[Any]  # the training tasks, shuffled once; each round takes the next `batch_size`
    batch_size: int

    def train_batch(self, round_: int) -> list[Any]:
        """The training tasks of round `round_` (from 1), going round the shuffled tasks."""
        offset = (round_ - 1) * self.batch_size
        return [self.train_order[(offset + i) % len(self.train_order)] for i in range(self.batch_size)]


@dataclass(frozen=True)
class Round:
    """The outcome of one search round."""

    beam: list[Candidate]  # the best `beam_width` prompts after the round, best first
    scored: list[Candidate]  # the round's new candidates that passed the checks, scored
    rows: list[list[str]]  # the round's table: id, parent, score, status, change, in publish order
    train_reward_mean: float  # over the beam's training runs
    tally: Tally

    @property
    def scores(self) -> list[float]:
        return [c.score_or_zero for c in self.scored]


@dataclass
class APOResult(Result):
    """What APO found, in the shape every run returns (`initial`: the seed prompt's validation, `final` and `best`:
    the best prompt's; `history`: each round's figures), with the best prompt and where it is stored."""

    prompt: PromptTemplate | None = None  # the best prompt (the seed when nothing beat it)
    resources_id: str = ""  # the snapshot published last: the best prompt with the agent's other resources
    source_id: str = ""  # the snapshot of the search in which the best prompt was scored
    round_best: list[float | None] = field(default_factory=list)  # each round's best candidate's score; [0]: the seed's

    @property
    def score(self) -> float:
        """The best prompt's mean validation reward."""
        return self.final.reward_mean if self.final is not None else 0.0

    @property
    def seed_score(self) -> float:
        return self.initial.reward_mean if self.initial is not None else 0.0


def prompt_resource(resources: NamedResources, name: str | None) -> tuple[str, PromptTemplate]:
    """The named prompt template to optimize, or the only one; a clear error otherwise."""
    prompts = {key: r for key, r in resources.items() if isinstance(r, PromptTemplate)}
    if name is not None:
        if not isinstance(resources.get(name), PromptTemplate):
            raise ValueError(
                f"APO prompt_name={name!r}, but the prompt templates among the resources are {sorted(prompts)}"
            )
        return name, prompts[name]
    if len(prompts) != 1:
        fix = "name one with APO(prompt_name=...)" if prompts else "publish the agent's prompt as a PromptTemplate"
        raise ValueError(
            f"APO optimizes one PromptTemplate resource; the resources hold {len(prompts)} ({sorted(prompts)}): {fix}"
        )
    return next(iter(prompts.items()))


def round_table(round_: int, rows: Sequence[Sequence[str]]) -> Table:
    """The candidates of one round: snapshot, parent, score, status, how the prompt differs from its parent."""
    table = Table(title=f"APO round {round_}")
    for column in ("candidate", "parent", "score", "status"):
        table.add_column(column, justify="right" if column == "score" else "left", no_wrap=column != "status")
    table.add_column("change from parent", overflow="ellipsis", no_wrap=True, max_width=70)
    for candidate, parent, score, status, change in rows:  # Text: prompts and reasons are not rich markup
        style = "red" if status.startswith("rejected") else ""
        table.add_row(candidate, parent, score, Text(status, style=style), Text(change))
    return table
