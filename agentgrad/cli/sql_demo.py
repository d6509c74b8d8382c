"""`agentgrad demo --task sql`: train the text-to-SQL agent (`examples/sql/`) with LoRA GRPO and show the curve.

The agent is LangGraph's prebuilt ReAct agent with a `run_sql` tool, unchanged by agentgrad; the model
defaults to Qwen2.5-Coder-0.5B-Instruct (`agentgrad engine fetch qwen2.5-coder-0.5b`). Training questions
are on three of the project's databases; validation is on two others whose schemas training never shows
(Spider's cross-domain split) and on three real-world databases that PyPI packages ship, whose questions
were written by hand (`examples/sql/real_world.py`; `make sql-data`). Validation is greedy, before training,
every `--val-every` steps and after; each point of the learning curve gives, for the project's held-out
databases and the real-world ones, the execution accuracy, the share of episodes whose first query failed
(an error or nothing returned), and the share of those that ended right (self-corrected).
The agent's first turn must call `run_sql` unless `--sql-first-call auto` (the untrained 0.5B model
almost never calls it by itself); after a failed query its next turn must run another, `RETRIES` times at
most; other turns are the model's choice. Credit is per turn: each query the agent runs is paid its own
execution match, so the query that fixed a failed one is what GRPO reinforces.

The run folder (`.agentgrad/demo-sql-grpo/`) is the calculator demo's, plus `curve.csv`, `curve.md` and
`curve.png` (the PNG when matplotlib is installed: the `train` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import random
import sys
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.table import Table

import agentgrad as ag
from agentgrad.cli.demo import EXAMPLES_DIR, check_resume_flags, console, demo_runners, demo_steps, open_run

MODEL = "qwen2.5-coder-0.5b"
"""The model of this task unless `--model` names another: one that calls tools in its own format."""
VAL_SIZE = 60
"""Held-out questions by default from each of the two held-out sets (the project's databases, the real-world
ones), spread over their databases and kinds: 120 episodes a validation, three validations within the demo's
time. The same questions before and after, so a change of ten points is more than chance (a single figure moves
about ±6 at 60); `--val-size 103` takes every real-world question."""
RETRIES = 2
"""After a failed query the agent's next turn must run another, this many times at most: the untrained 0.5B
model otherwise answers at once with the failed query (0 of 7 failed held-out episodes reran one)."""
PROMPTS_PER_STEP = 4
GROUP_SIZE = 4
VAL_EVERY = 3
MAX_TOKENS = 192
"""Per model call: a query in a tool call, or the final ```sql block, with room to think a little."""
LORA_RANK = 16
"""LoRA on every linear projection (attention and MLP): the update's memory is the adapters' plus activations."""
LEARNING_RATE = 2e-5
WARM_START_LEARNING_RATE = 4e-4
"""`--sql-warm-start`'s SFT: one pass over `recovery.demonstration_mix` (fixes, joins, right starts), each chat's context
frozen (`warm_start_frozen_context`). Under LoRA's scale of 1 here (alpha = rank) as under the scale of 2 (alpha 32)
its probe, `benchmarks/sql_sft_probe.py`, trained at 2e-4."""
RUNNER_CONCURRENCY = 8
"""Episodes each runner thread runs at once (16 with the default two runners): at 32, the first calls of 32
episodes (the real-world schemas make prompts of up to ~1,500 tokens) prefilled together past the gateway's
600 s per call on the loaded 2-core machine, and every one of them failed."""
ROLLOUT_TIMEOUT = 1800.0
"""Seconds an episode may take: on a 2-core CPU, 32 episodes decode the fp32 0.5B model together at about
one token a second each, and an episode makes up to six model calls of `MAX_TOKENS` (GRPO's 600 s default timed
out 15 of 100 held-out episodes there)."""


def load_sql_example() -> ModuleType:
    """`examples.sql.train`, importable by name from a source checkout (runner processes re-import it)."""
    if not (EXAMPLES_DIR / "sql" / "train.py").exists():
        raise SystemExit(f"the sql demo needs the examples folder of a source checkout ({EXAMPLES_DIR} is missing)")
    root = str(EXAMPLES_DIR.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    import examples.sql.train

    return examples.sql.train


def spread(questions: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """`n` questions taken evenly over the list (it is ordered by database and kind), so all of them show up."""
    if n <= 0 or n >= len(questions):
        return list(questions)
    return [questions[i * len(questions) // n] for i in range(n)]


def task_lists(
    db: ModuleType, run_first: bool, val_size: int | None, from_mistakes: float = 0.0, rerun_mistakes: float = 0.0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training tasks, validation tasks): training on the `train` split alone, `from_mistakes` of it episodes that
    start from a mistake to fix (`recovery.first_mistake`), `rerun_mistakes` of those with the mistake run twice
    (rerun unchanged, as the greedy model does); validation on `val_size` questions of the project's held-out
    databases and as many of the real-world ones, which no training task touches."""
    from examples.sql import recovery

    agent = {"run_first": run_first, "retries": RETRIES}
    size = val_size if val_size is not None else VAL_SIZE
    train = [{**q, **agent} for q in db.load_questions("train")]
    if not 0.0 <= from_mistakes < 1.0:
        raise ValueError(f"the share of training episodes that start from a mistake is in [0, 1), got {from_mistakes}")
    if not 0.0 <= rerun_mistakes <= 1.0:
        raise ValueError(f"the share of the mistakes that were rerun is in [0, 1], got {rerun_mistakes}")
    rng = random.Random(0)
    wanted = round(len(train) * from_mistakes / (1.0 - from_mistakes))
    seeded = [{**q, "first_query": sql} for q in train if (sql := recovery.first_mistake(q, rng)) is not None]
    given = rng.sample(seeded, min(wanted, len(seeded)))
    reruns = round(len(given) * rerun_mistakes)
    train += [{**q, "first_query_runs": 2} for q in given[:reruns]] + given[reruns:]
    val = [{**q, **agent} for split in ("held_out", "real_world") for q in spread(db.load_questions(split), size)]
    return train, val


@dataclass(frozen=True)
class CurvePoint:
    """Validation at one step on one set of databases: what the agent got right, and how it recovered."""

    step: int
    scope: str  # "held-out" (the project's databases), "real-world", or one database's name
    accuracy: float  # execution match with the gold query
    failed_first: float  # episodes whose first query failed (an error or nothing returned)
    self_corrected: float  # of those, the share whose final answer matched: fixed by a later query
    n: int  # episodes
    n_failed_first: int
    n_self_corrected: int


Labelled = tuple[dict[str, Any], float, dict[str, Any]]  # (task, reward, the agent's annotations)


async def episodes(store: Any, mode: str) -> dict[int, list[Labelled]]:
    """The rollouts of `mode` by step, each with its task, reward (0 unless it succeeded) and annotations."""
    from agentgrad.semconv import ANNOTATION_PREFIX, ANNOTATION_SPAN
    from agentgrad.types import RolloutStatus

    by_step: dict[int, list[Labelled]] = {}
    rollouts = await store.query_rollouts(mode=mode)
    spans_of = await store.query_spans_of([r.rollout_id for r in rollouts])
    for rollout in rollouts:
        labels: dict[str, Any] = {}
        for span in spans_of[rollout.rollout_id]:
            if span.name == ANNOTATION_SPAN:
                labels |= {k.removeprefix(ANNOTATION_PREFIX): v for k, v in span.attributes.items()}
        ok = rollout.status is RolloutStatus.SUCCEEDED and rollout.reward is not None
        reward = float(rollout.reward) if ok and rollout.reward is not None else 0.0
        by_step.setdefault(int(rollout.metadata.get("step", 0)), []).append((rollout.input, reward, labels))
    return by_step


def point(step: int, scope: str, rows: list[Labelled]) -> CurvePoint:
    """The figures of one set of episodes: self-corrected counts the failed-first ones whose answer matched."""
    failed = [row for row in rows if row[2].get("sql.first_failed")]
    corrected = sum(reward >= 1.0 for _, reward, _ in failed)
    return CurvePoint(
        step=step,
        scope=scope,
        accuracy=sum(reward >= 1.0 for _, reward, _ in rows) / len(rows),
        failed_first=len(failed) / len(rows),
        self_corrected=corrected / len(failed) if failed else 0.0,
        n=len(rows),
        n_failed_first=len(failed),
        n_self_corrected=corrected,
    )


async def learning_curve(store: Any, real_world: Callable[[str], bool]) -> list[CurvePoint]:
    """Per validation step: a point for the project's held-out databases, one for the real-world ones, and one
    per database."""
    points = []
    for step, rows in sorted((await episodes(store, "val")).items()):
        scopes = {"held-out": [r for r in rows if not real_world(r[0]["db"])],
                  "real-world": [r for r in rows if real_world(r[0]["db"])]}  # fmt: skip
        scopes |= {name: [r for r in rows if r[0]["db"] == name] for name in sorted({r[0]["db"] for r in rows})}
        points += [point(step, scope, scoped) for scope, scoped in scopes.items() if scoped]
    return points


def write_curve(points: list[CurvePoint], folder: Path, title: str) -> list[Path]:
    """`curve.csv` and `curve.md` (a table), and `curve.png` when matplotlib is there; the paths written."""
    names = [f.name for f in fields(CurvePoint)]
    written = [folder / "curve.csv", folder / "curve.md"]
    with open(written[0], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(names)
        writer.writerows(astuple(p) for p in points)
    lines = [f"# {title}", "", "| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += [
        "| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in astuple(p)) + " |" for p in points
    ]
    written[1].write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: write the file only
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("matplotlib is not installed (the train extra has it): curve.png not written")
        return written
    figure, panels = plt.subplots(1, 2, figsize=(10.0, 4.2), sharey=True)
    for axes, scope in zip(panels, ("held-out", "real-world")):
        scoped = [p for p in points if p.scope == scope]
        steps = [p.step for p in scoped]
        for name, label in (
            ("accuracy", "execution accuracy"),
            ("failed_first", "first query failed"),
            ("self_corrected", "of those, self-corrected"),
        ):
            axes.plot(steps, [getattr(p, name) for p in scoped], marker="o", label=label)
        n = scoped[0].n if scoped else 0
        axes.set_title(f"{scope} databases ({n} questions)", fontsize=9)
        axes.set_xlabel("GRPO step")
        axes.set_xticks(steps)
        axes.grid(alpha=0.3)
    panels[0].set_ylabel("share of episodes (greedy)")
    panels[0].set_ylim(-0.02, 1.02)
    panels[0].legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(folder / "curve.png", dpi=120)
    plt.close(figure)
    return [*written, folder / "curve.png"]


def share(k: int, n: int) -> str:
    return f"{k / n:.3f} ({k}/{n})" if n else "-"


def curve_table(points: list[CurvePoint], title: str) -> Table:
    """Every validation of both held-out sets, then each database before and after training."""
    table = Table(title=title)
    for column in ("step", "databases", "accuracy", "first query failed", "self-corrected", "episodes"):
        table.add_column(column, justify="right")
    steps = sorted({p.step for p in points})
    for p in points:
        if p.scope in ("held-out", "real-world") or p.step in (steps[0], steps[-1]):
            table.add_row(
                str(p.step), p.scope, f"{p.accuracy:.3f}", f"{p.failed_first:.3f}",
                share(p.n_self_corrected, p.n_failed_first), str(p.n),
            )  # fmt: skip
    return table


def training_share(rows: dict[int, list[Labelled]]) -> str:
    """How often a training episode's first query failed, at the first step (before any update) and overall, and
    how often the episodes given a mistake to start from fixed it."""
    if not rows:
        return "no training episodes"
    own = {step: [r for r in step_rows if not r[2].get("sql.from_mistake")] for step, step_rows in rows.items()}
    first = own[min(own)]
    every = [row for step_rows in own.values() for row in step_rows]
    failed = [row for row in every if row[2].get("sql.first_failed")]
    fixed = sum(reward >= 1.0 for _, reward, _ in failed)
    given = [row for step_rows in rows.values() for row in step_rows if row[2].get("sql.from_mistake")]
    return (
        f"training episodes whose first query failed: {share(sum(bool(r[2].get('sql.first_failed')) for r in first), len(first))} "
        f"at step {min(rows)} (before any update), {share(len(failed), len(every))} over all steps, "
        f"{share(fixed, len(failed))} of those self-corrected"
        + (
            f"; episodes started from a mistake: {share(sum(r >= 1.0 for _, r, _ in given), len(given))} fixed it"
            if given
            else ""
        )
    )


async def stored_curve(store_spec: str, real_world: Callable[[str], bool]) -> list[CurvePoint]:
    """`learning_curve` of a finished run's store."""
    from agentgrad.store import open_store

    store = open_store(store_spec)
    try:
        return await learning_curve(store, real_world)
    finally:
        await store.close()


def main(args: argparse.Namespace) -> None:
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.engine import Engine
    from agentgrad.policy.config import PolicyConfig

    check_resume_flags(args)
    if args.algorithm != "grpo":
        raise SystemExit("--task sql trains with GRPO (LoRA); SFT on it is not wired into the demo")
    example = load_sql_example()
    db = example.db
    from examples.sql import recovery

    try:
        train, val = task_lists(
            db, args.sql_first_call == "required", args.val_size, args.sql_from_mistakes, args.sql_rerun_mistakes
        )
    except ValueError as exc:
        raise SystemExit(f"--sql-from-mistakes, --sql-rerun-mistakes: {exc}") from None
    try:  # before the model loads: a missing package says how to install it
        for name in db.real_world_names():
            db.database_path(name)
    except FileNotFoundError as exc:
        raise SystemExit(str(exc)) from None
    run = open_run(args)  # before the model loads: a question or a stop comes at once
    if run.finished:
        real_world_names = set(db.real_world_names())
        points = asyncio.run(stored_curve(run.store, real_world_names.__contains__))
        console.print(curve_table(points, f"text-to-SQL, seed {args.seed}"))
        return
    began = time.perf_counter()
    model = args.model or MODEL
    # fp32 weights under the adapters; sampling merges the adapter into a packed twin (`Engine.replace_model`)
    engine = Engine(model, sampling_dtype="float32", name=Path(model).name)
    steps = demo_steps(args)
    demonstrations = recovery.demonstration_mix(db.load_questions("train")) if args.sql_warm_start else []
    algorithm = GRPO(
        GRPOConfig(
            steps=steps,
            val_every=args.val_every or VAL_EVERY,
            prompts_per_step=args.prompts_per_step or PROMPTS_PER_STEP,
            group_size=args.group_size or GROUP_SIZE,
            dynamic_sampling=args.dynamic_sampling,
            max_tokens=MAX_TOKENS,
            rollout_timeout=ROLLOUT_TIMEOUT,
            learning_rate=LEARNING_RATE if args.learning_rate is None else args.learning_rate,
            warm_start_learning_rate=WARM_START_LEARNING_RATE,
            warm_start_frozen_context=True,  # the chats' schemas and questions under no_grad: 25 min, not ~55
            credit="per_turn",  # each call paid by the query it wrote (examples/sql/train.py): the fix, not the failure
            gamma=0.0,
            micro_batch_size=2,  # the run's peak RSS 15.1-16.2 GB with logits in chunks (engine/training.py); 4: untried
            gradient_checkpointing=True,  # without it, 4 multi-turn episodes of the 0.5B model reached 19 GB RSS
            checkpoint_dir=str(run.checkpoints),
            checkpoint_every=args.checkpoint_every,
            seed=args.seed,
            policy=PolicyConfig(lora_rank=LORA_RANK),
        ),
        local_engine=engine,
        demonstrations=demonstrations,
    )
    trainer: ag.Trainer[Any] = ag.Trainer(
        algorithm, n_runners=demo_runners(args), runner_concurrency=RUNNER_CONCURRENCY, store=run.store
    )
    console.print(
        f"training the text-to-SQL agent (seed {args.seed}) with LoRA GRPO on {engine.name} ({engine.device}): "
        f"{len(train)} training questions, {len(val)} held out on databases training never sees (the project's "
        f"and {len(db.real_world_names())} real-world ones); first call {args.sql_first_call}; "
        + (
            f"warm start on {len(demonstrations)} demonstrations (fixes, joins, right starts); "
            if demonstrations
            else ""
        )
        + f"store: {run.store}"
    )
    result = trainer.fit(example.sql_rollout, train, val)
    elapsed = time.perf_counter() - began

    real_world = set(db.real_world_names())
    points = asyncio.run(learning_curve(trainer.store, real_world.__contains__))
    title = (
        f"text-to-SQL, {engine.name}, LoRA {'SFT warm start + ' if demonstrations else ''}GRPO, seed {args.seed}, "
        f"first call {args.sql_first_call}: "
        f"held-out questions, greedy"
    )
    console.print(curve_table(points, title))
    console.print(training_share(asyncio.run(episodes(trainer.store, "train"))))
    written = write_curve(points, run.path, title)
    console.print(f"GRPO took {elapsed / 60:.1f} min (model load, validation and training)")
    console.print(
        f"learning curve: {', '.join(str(p) for p in written)}\nstore: {run.store}\ncheckpoint: {result.checkpoint}"
        f"\nrun folder: {run.path} (the same command resumes it; --fresh starts over)"
    )
