"""`agentgrad demo --task sql`: train the text-to-SQL agent (`examples/sql/`) with LoRA GRPO and show the curve.

The agent is LangGraph's prebuilt ReAct agent with a `run_sql` tool, unchanged by agentgrad; the model
defaults to Qwen2.5-Coder-0.5B-Instruct (`agentgrad engine fetch qwen2.5-coder-0.5b`). Training questions
are on three databases, held-out ones on two others whose schemas training never shows (Spider's
cross-domain split). Held-out validation is greedy, before training, every `--val-every` steps and after;
each point of the learning curve gives the execution accuracy, the share of episodes that ran a query
with the tool, and the share that corrected a failed query (a query failed, a later one ran).
The agent's first turn must call `run_sql` unless `--sql-first-call auto` (the untrained 0.5B model
almost never calls it by itself); later turns are the model's choice.

The run folder (`.agentgrad/demo-sql-grpo/`) is the calculator demo's, plus `curve.csv`, `curve.md` and
`curve.png` (the PNG when matplotlib is installed: the `train` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import sys
import time
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.table import Table

import agentgrad as ag
from agentgrad.cli.demo import EXAMPLES_DIR, check_resume_flags, console, demo_runners, demo_steps, open_run

MODEL = "qwen2.5-coder-0.5b"
"""The model of this task unless `--model` names another: one that calls tools in its own format."""
VAL_SIZE = 100
"""Held-out questions by default, spread over both held-out databases and every kind of question: enough that
a change of ten points is more than chance (about ±5 at 100), and each validation takes ~4 min on 2 quiet cores."""
PROMPTS_PER_STEP = 4
GROUP_SIZE = 4
VAL_EVERY = 2
MAX_TOKENS = 192
"""Per model call: a query in a tool call, or the final ```sql block, with room to think a little."""
LORA_RANK = 16
"""LoRA on every linear projection (attention and MLP): the update's memory is the adapters' plus activations."""
LEARNING_RATE = 2e-5
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


@dataclass(frozen=True)
class CurvePoint:
    """Held-out validation at one step: what the agent got right and how it used its tool."""

    step: int
    accuracy: float  # execution match with the gold query
    tool_call_rate: float  # episodes that ran at least one query with run_sql
    failed_query: float  # episodes in which a query failed
    self_corrected: float  # episodes in which a query failed and a later one ran
    n: int  # held-out episodes


async def learning_curve(store: Any) -> list[CurvePoint]:
    """One point per validation step, from the held-out rollouts and the annotations the agent emitted."""
    from agentgrad.semconv import ANNOTATION_PREFIX, ANNOTATION_SPAN
    from agentgrad.types import RolloutStatus

    episodes: dict[int, list[tuple[float, dict[str, Any]]]] = {}
    rollouts = await store.query_rollouts(mode="val")
    spans_of = await store.query_spans_of([r.rollout_id for r in rollouts])
    for rollout in rollouts:
        labels: dict[str, Any] = {}
        for span in spans_of[rollout.rollout_id]:
            if span.name == ANNOTATION_SPAN:
                labels |= {k.removeprefix(ANNOTATION_PREFIX): v for k, v in span.attributes.items()}
        ok = rollout.status is RolloutStatus.SUCCEEDED and rollout.reward is not None
        reward = float(rollout.reward) if ok and rollout.reward is not None else 0.0
        episodes.setdefault(int(rollout.metadata.get("step", 0)), []).append((reward, labels))

    def share(rows: list[tuple[float, dict[str, Any]]], test: Any) -> float:
        return sum(1 for row in rows if test(*row)) / len(rows)

    return [
        CurvePoint(
            step=step,
            accuracy=share(rows, lambda reward, _: reward >= 1.0),
            tool_call_rate=share(rows, lambda _, labels: int(labels.get("sql.queries", 0)) > 0),
            failed_query=share(rows, lambda _, labels: bool(labels.get("sql.failed_query"))),
            self_corrected=share(rows, lambda _, labels: bool(labels.get("sql.self_corrected"))),
            n=len(rows),
        )
        for step, rows in sorted(episodes.items())
    ]


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
    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    steps = [p.step for p in points]
    for name, label in (
        ("accuracy", "held-out execution accuracy"),
        ("tool_call_rate", "ran a query with run_sql"),
        ("self_corrected", "corrected a failed query"),
    ):
        axes.plot(steps, [getattr(p, name) for p in points], marker="o", label=label)
    axes.set_xlabel("GRPO step")
    axes.set_ylabel(f"share of {points[0].n if points else 0} held-out episodes (greedy)")
    axes.set_ylim(-0.02, 1.02)
    axes.set_xticks(steps)
    axes.set_title(title.replace(": ", ":\n", 1), fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(folder / "curve.png", dpi=120)
    plt.close(figure)
    return [*written, folder / "curve.png"]


def curve_table(points: list[CurvePoint], title: str) -> Table:
    """The learning curve as a table: a row per validation step."""
    table = Table(title=title)
    for column in ("step", "accuracy", "tool-call rate", "failed a query", "self-corrected", "episodes"):
        table.add_column(column, justify="right")
    for p in points:
        table.add_row(
            str(p.step), f"{p.accuracy:.3f}", f"{p.tool_call_rate:.3f}", f"{p.failed_query:.3f}",
            f"{p.self_corrected:.3f}", str(p.n),
        )  # fmt: skip
    return table


async def stored_curve(store_spec: str) -> list[CurvePoint]:
    """`learning_curve` of a finished run's store."""
    from agentgrad.store import open_store

    store = open_store(store_spec)
    try:
        return await learning_curve(store)
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
    run_first = args.sql_first_call == "required"
    train = [{**q, "run_first": run_first} for q in db.load_questions("train")]
    held_out = [{**q, "run_first": run_first} for q in db.load_questions("held_out")]
    val = spread(held_out, args.val_size if args.val_size is not None else VAL_SIZE)
    run = open_run(args)  # before the model loads: a question or a stop comes at once
    if run.finished:
        console.print(curve_table(asyncio.run(stored_curve(run.store)), f"text-to-SQL, seed {args.seed}"))
        return
    began = time.perf_counter()
    model = args.model or MODEL
    engine = Engine(model, sampling_dtype="float32", name=Path(model).name)  # LoRA samples from the adapted fp32 model
    steps = demo_steps(args)
    algorithm = GRPO(
        GRPOConfig(
            steps=steps,
            val_every=args.val_every or VAL_EVERY,
            prompts_per_step=args.prompts_per_step or PROMPTS_PER_STEP,
            group_size=args.group_size or GROUP_SIZE,
            max_tokens=MAX_TOKENS,
            rollout_timeout=ROLLOUT_TIMEOUT,
            learning_rate=LEARNING_RATE,
            micro_batch_size=4,
            gradient_checkpointing=True,  # without it, 4 multi-turn episodes of the 0.5B model reached 19 GB RSS
            checkpoint_dir=str(run.checkpoints),
            checkpoint_every=args.checkpoint_every,
            seed=args.seed,
            policy=PolicyConfig(lora_rank=LORA_RANK),
        ),
        local_engine=engine,
    )
    trainer: ag.Trainer[Any] = ag.Trainer(
        algorithm, n_runners=demo_runners(args), runner_concurrency=16, store=run.store
    )
    console.print(
        f"training the text-to-SQL agent (seed {args.seed}) with LoRA GRPO on {engine.name} ({engine.device}): "
        f"{len(train)} training questions, {len(val)} held-out on databases training never sees; first call "
        f"{args.sql_first_call}; store: {run.store}"
    )
    result = trainer.fit(example.sql_rollout, train, val)
    elapsed = time.perf_counter() - began

    points = asyncio.run(learning_curve(trainer.store))
    title = (
        f"text-to-SQL, {engine.name}, LoRA GRPO, seed {args.seed}, first call {args.sql_first_call}: "
        f"{len(val)} held-out questions, greedy"
    )
    console.print(curve_table(points, title))
    written = write_curve(points, run.path, title)
    console.print(f"GRPO took {elapsed / 60:.1f} min (model load, validation and training)")
    console.print(
        f"learning curve: {', '.join(str(p) for p in written)}\nstore: {run.store}\ncheckpoint: {result.checkpoint}"
        f"\nrun folder: {run.path} (the same command resumes it; --fresh starts over)"
    )
