"""What the CLI prints about a store: rollouts, one rollout's attempts and span tree, metrics.

The dashboard (`agentgrad/dashboard/`) shows the same records in a browser.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from agentgrad import semconv as sc
from agentgrad.store import Store
from agentgrad.types import Rollout, Span

SHOWN_ATTRIBUTES = (
    sc.REWARD,
    sc.AGENT_NAME,
    sc.GEN_AI_REQUEST_MODEL,
    sc.GEN_AI_INPUT_TOKENS,
    sc.GEN_AI_OUTPUT_TOKENS,
    sc.GEN_AI_FINISH_REASONS,
    sc.WEIGHTS_VERSION,
    sc.LATENCY_MS,
    sc.MESSAGE_BODY,
    sc.OPERATION_INPUT,
    sc.OPERATION_OUTPUT,
    sc.GEN_AI_OUTPUT_MESSAGES,
    sc.EXCEPTION_TYPE,
    sc.EXCEPTION_MESSAGE,
)
"""Attributes printed under each span; the rest stay in the store."""


def short(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= width else text[: width - 1] + "…"


def duration(rollout: Rollout) -> str:
    if rollout.start_time is None:
        return "-"
    return f"{(rollout.end_time or time.time()) - rollout.start_time:.2f}s"


async def print_rollouts(
    console: Console, store: Store, status: list[str] | None, mode: str | None, limit: int, offset: int
) -> None:
    rollouts = await store.query_rollouts(status=status, mode=mode, limit=limit, offset=offset)
    table = Table(title=f"Rollouts ({len(rollouts)} shown)")
    for column in ("id", "status", "mode", "attempts", "reward", "duration"):
        table.add_column(
            column, justify="right" if column in ("attempts", "reward", "duration") else "left", no_wrap=True
        )
    table.add_column("input", overflow="ellipsis", no_wrap=True, max_width=40)
    for r in rollouts:
        reward = "-" if r.reward is None else f"{r.reward:.3f}"
        table.add_row(
            r.rollout_id,
            r.status.value,
            r.mode or "-",
            str(r.num_attempts),
            reward,
            duration(r),
            escape(short(r.input, 40)),
        )
    console.print(table)
    stats = await store.stats()
    console.print("by status: " + ", ".join(f"{k} {v}" for k, v in sorted(stats.rollouts.items())))


def span_tree(spans: Sequence[Span], title: str) -> Tree:
    """Spans nested by parent id; spans whose parent is not among them are roots."""
    tree = Tree(title)
    by_id = {s.span_id: s for s in spans if s.span_id}
    children: dict[str | None, list[Span]] = {}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in by_id else None, []).append(s)

    def add(node: Tree, span: Span) -> None:
        took = f" {1000 * (span.end_time - span.start_time):.1f} ms" if span.end_time else ""
        error = " [red]ERROR[/red]" if span.status.code == "ERROR" else ""
        branch = node.add(f"[bold]{escape(span.name)}[/bold] #{span.sequence_id}{took}{error}")
        for key in SHOWN_ATTRIBUTES:
            if key in span.attributes:
                branch.add(f"[dim]{key}[/dim] = {escape(short(span.attributes[key]))}")
        for child in sorted(children.get(span.span_id, []), key=lambda s: s.sequence_id):
            add(branch, child)

    for root in sorted(children.get(None, []), key=lambda s: s.sequence_id):
        add(tree, root)
    return tree


async def print_rollout(console: Console, store: Store, rollout_id: str) -> None:
    rollout = await store.get_rollout(rollout_id)
    console.print(
        f"[bold]{rollout.rollout_id}[/bold]  status={rollout.status.value}  mode={rollout.mode}  "
        f"reward={rollout.reward}  resources={rollout.resources_id}"
    )
    console.print(f"input: {escape(short(rollout.input, 400))}")
    table = Table(title="Attempts")
    for column in ("#", "attempt", "worker", "status", "reward", "duration", "error"):
        table.add_column(column)
    attempts = await store.query_attempts(rollout_id)
    for a in attempts:
        took = f"{a.end_time - a.start_time:.2f}s" if a.end_time else "-"
        table.add_row(
            str(a.sequence),
            a.attempt_id,
            a.worker_id or "-",
            a.status.value,
            "-" if a.reward is None else f"{a.reward:.3f}",
            took,
            escape(short(a.error or "", 60)),
        )
    console.print(table)
    for a in attempts:
        spans = await store.query_spans(rollout_id, a.attempt_id)
        console.print(span_tree(spans, f"spans of attempt {a.sequence} ({a.attempt_id})"))


async def print_metrics(console: Console, store: Store, prefix: str | None) -> None:
    """Each training curve in a line: points, first and last value, best, last step."""
    by_name: dict[str, list[tuple[int, float]]] = {}
    for metric in await store.query_metrics(prefix=prefix):
        by_name.setdefault(metric.name, []).append((metric.step, metric.value))
    table = Table(title=f"Metrics ({len(by_name)} curves)")
    for column in ("name", "points", "first", "last", "min", "max", "last step"):
        table.add_column(column, justify="left" if column == "name" else "right", no_wrap=True)
    for name in sorted(by_name):
        values = [v for _, v in by_name[name] if not math.isnan(v)]
        if not values:
            continue
        table.add_row(
            name,
            str(len(by_name[name])),
            f"{values[0]:.4g}",
            f"{values[-1]:.4g}",
            f"{min(values):.4g}",
            f"{max(values):.4g}",
            str(by_name[name][-1][0]),
        )
    console.print(table)
