"""What `agentgrad runs ls | show | compare` prints: the runs a store recorded (`Run`), one in full, two side by side."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentgrad.store import NotFoundError, Store
from agentgrad.tracking.base import flatten
from agentgrad.types import Run

COMPARED_FIGURES = ("val/accuracy", "val/reward_mean", "train/reward_mean", "train/accuracy", "apo/best_score")
"""The final figures `runs ls` shows, those a run has."""


TIMELINE_FIGURES = (
    "train/model_version",
    "prompt/version",
    "val/accuracy",
    "prompt/kept",
    "prompt/score",
    "prompt/candidate_best",
    "train/rollback",
    "train/rollback_to_step",
)
"""The per-step figures `runs show` lays on its timeline: the weights version and the prompt version (Joint) side by
side, validation, and what changed either (a prompt rewrite kept or refused, a rollback)."""

ROLE_FIGURES = ("reward_mean", "accuracy", "loss", "grad_norm", "groups_used", "calls")
"""Per role (`train/<role>/<figure>`, GRPO's `roles`), the figures `runs show` puts in its roles table."""


def role_figures(figures: dict[str, float]) -> dict[str, dict[str, float]]:
    """`train/<role>/<figure>` values by role (GRPO's `roles`), roles in name order; {} for a run with none."""
    roles: dict[str, dict[str, float]] = {}
    for name in sorted(figures):
        group, _, rest = name.partition("/")
        role, _, figure_name = rest.partition("/")
        if group == "train" and role and figure_name and "/" not in figure_name:
            roles.setdefault(role, {})[figure_name] = figures[name]
    return roles


async def find_run(store: Store, key: str) -> Run:
    """The run whose id is `key`, else the latest one named `key`; NotFoundError naming the runs there are."""
    runs = await store.query_runs()
    for run in runs:
        if run.run_id == key:
            return run
    named = [run for run in runs if run.name == key]
    if named:
        return named[-1]
    known = ", ".join(f"{r.run_id} ({r.name})" for r in runs[-5:]) or "none"
    raise NotFoundError(f"no run with id or name {key!r} in this store; the latest runs: {known}")


def when(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def took(run: Run) -> str:
    return "-" if run.end_time is None else f"{run.end_time - run.start_time:.1f}s"


def figure(values: dict[str, float], name: str) -> str:
    return f"{values[name]:.4g}" if name in values else "-"


def best_checkpoint(run: Run) -> str:
    """Which checkpoint validated best, with its figure and step; or why there is none."""
    if run.best_checkpoint is None:
        return "none validated" if run.checkpoints else "-"
    scored = run.best_checkpoint_validation
    at = next((f" ({k} {v:.4g} at step {scored.get('step', 0):.0f})" for k, v in scored.items() if k != "step"), "")
    return run.best_checkpoint + at


async def print_runs(console: Console, store: Store) -> None:
    """A line per run: id, name, algorithm, status, start, duration, main final figures, best."""
    runs = await store.query_runs()
    shown = [name for name in COMPARED_FIGURES if any(name in r.final for r in runs)]
    table = Table(title=f"Runs ({len(runs)})")
    for column in ("run", "name", "algorithm", "status", "started", "took", *shown, "best", "git"):
        table.add_column(column, no_wrap=True)
    for run in runs:
        best = next((f"{k} {v:.4g} @ {run.best.get('step', 0):.0f}" for k, v in run.best.items() if k != "step"), "-")
        git = "-" if run.git is None else run.git["commit"][:8] + ("+dirty" if run.git.get("dirty") else "")
        table.add_row(
            run.run_id,
            escape(run.name),
            run.algorithm,
            run.status.value,
            when(run.start_time),
            took(run),
            *(figure(run.final, name) for name in shown),
            best,
            git,
        )
    console.print(table)


async def print_run(console: Console, store: Store, key: str) -> None:
    """One run in full: where and what it ran, its figures, its checkpoints (the best one named)."""
    run = await find_run(store, key)
    console.print(f"[bold]{run.run_id}[/bold]  {escape(run.name)}  {run.algorithm}  status={run.status.value}")
    console.print(f"started {when(run.start_time)}, ended {when(run.end_time)} ({took(run)}); seed {run.seed}")
    if run.error:
        console.print(f"error: {escape(run.error)}")
    versions = ", ".join(f"{k} {v}" for k, v in run.versions.items())
    console.print(f"versions: {escape(versions)}", highlight=False)
    console.print(f"machine: {escape(json.dumps(run.machine))}", highlight=False)
    if run.git is not None:
        dirty = " (uncommitted changes)" if run.git.get("dirty") else ""
        console.print(f"git: {run.git['commit']}{dirty} in {escape(str(run.git.get('path')))}", highlight=False)
    if run.tags:
        console.print(f"tags: {escape(json.dumps(run.tags))}", highlight=False)
    table = Table(title="Figures")
    for column in ("name", "final", "best"):
        table.add_column(column, justify="left" if column == "name" else "right", no_wrap=True)
    for name in sorted(run.final):
        table.add_row(name, figure(run.final, name), figure(run.best, name))
    console.print(table)
    roles = role_figures(run.final)
    if roles:  # GRPO(roles=...): each role's own figures side by side
        shown = [name for name in ROLE_FIGURES if any(name in figures for figures in roles.values())]
        by_role = Table(title=f"Roles ({len(roles)}), final")
        for column in ("role", *shown):
            by_role.add_column(column, justify="left" if column == "role" else "right", no_wrap=True)
        for role, figures in roles.items():
            by_role.add_row(escape(role), *(figure(figures, name) for name in shown))
        console.print(by_role)
    steps = timeline_table(await timeline(store, run.run_id))
    if steps is not None:
        console.print(steps)
    if "step" in run.best:
        console.print(f"best at step {run.best['step']:.0f}", highlight=False)
    for checkpoint in run.checkpoints:
        mark = " (best on validation)" if checkpoint == run.best_checkpoint else ""
        console.print(f"checkpoint: {escape(checkpoint)}{mark}", highlight=False)
    if run.checkpoints:
        console.print(f"best checkpoint: {escape(best_checkpoint(run))}", highlight=False)
    config = Table(title="Configuration")
    config.add_column("setting", no_wrap=True)
    config.add_column("value")
    for name, value in flatten(run.config).items():
        config.add_row(name, escape(str(value)))
    console.print(config)


async def timeline(store: Store, run_id: str) -> dict[int, dict[str, float]]:
    """The run's `TIMELINE_FIGURES` by step, steps in order."""
    steps: dict[int, dict[str, float]] = {}
    for name in TIMELINE_FIGURES:
        for point in await store.query_metrics(name=name, run_id=run_id):
            steps.setdefault(point.step, {})[name] = point.value
    return dict(sorted(steps.items()))


def timeline_event(figures: dict[str, float]) -> str:
    """What changed the prompt or the weights at a step, in a few words."""
    events = []
    if "prompt/kept" in figures:
        kept = figures["prompt/kept"] >= 1
        best, current = figures.get("prompt/candidate_best", 0.0), figures.get("prompt/score", 0.0)
        chance = ", within chance" if not kept and best > current else ""  # kept only past chance (`base.beats`)
        events.append(f"prompt rewrite {'kept' if kept else 'refused'} ({best:.3f} vs {current:.3f}{chance})")
    if figures.get("train/rollback"):
        events.append(f"weights rolled back to step {figures.get('train/rollback_to_step', 0):.0f}")
    return "; ".join(events)


def timeline_table(steps: dict[int, dict[str, float]]) -> Table | None:
    """Weights versions beside prompt versions, step by step, with validation and what changed; None for a run that
    trained neither."""
    if not any("train/model_version" in f or "prompt/version" in f for f in steps.values()):
        return None
    table = Table(title="Timeline: weights and prompt versions")
    for column in ("step", "weights", "prompt", "val acc", "event"):
        table.add_column(column, justify="left" if column == "event" else "right", no_wrap=column != "event")
    weights = prompt = 0.0
    for step, figures in steps.items():
        weights, prompt = figures.get("train/model_version", weights), figures.get("prompt/version", prompt)
        shown = f"v{prompt:.0f}" if any("prompt/version" in f for f in steps.values()) else "-"
        table.add_row(str(step), f"v{weights:.0f}", shown, figure(figures, "val/accuracy"), timeline_event(figures))
    return table


async def compare_runs(console: Console, store: Store, keys: Sequence[str]) -> None:
    """Runs side by side: the settings that differ, then every final and best figure."""
    runs = [await find_run(store, key) for key in keys]
    settings = [flatten({**r.config, "seed": r.seed, "algorithm": r.algorithm}) for r in runs]
    names = sorted(set().union(*settings))
    differ = [n for n in names if len({json.dumps(s.get(n), default=str) for s in settings}) > 1]
    table = Table(title=f"Settings that differ ({len(differ)} of {len(names)})")
    table.add_column("setting", no_wrap=True)
    for run in runs:
        table.add_column(f"{run.name} ({run.run_id})", no_wrap=True)
    for name in differ:
        table.add_row(name, *(escape(str(s.get(name, "-"))) for s in settings))
    console.print(table)
    figures = Table(title="Figures")
    figures.add_column("figure", no_wrap=True)
    for run in runs:
        figures.add_column(f"{run.name} ({run.run_id})", justify="right", no_wrap=True)
    for name in sorted(set().union(*(r.final for r in runs))):
        figures.add_row(f"final {name}", *(figure(r.final, name) for r in runs))
    for name in sorted(set().union(*(r.best for r in runs))):
        figures.add_row(f"best {name}", *(figure(r.best, name) for r in runs))
    figures.add_row("best checkpoint", *(escape(best_checkpoint(r)) for r in runs))
    figures.add_row("status", *(r.status.value for r in runs))
    figures.add_row("took", *(took(r) for r in runs))
    console.print(figures)
