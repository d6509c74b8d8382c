"""Do the framework agents call their tool unforced? Each `examples/frameworks/` agent, per model, with and without
the worked exchange in its history (issue 21, item 7).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/frameworks_unforced.py [--tasks 8] \
        [--models qwen2.5-coder-0.5b smollm2-135m] [--frameworks openai langgraph ...] [--variants without with] \
        [--operator '*']

Every agent runs unchanged in its framework (CrewAI and AutoGen as runners of their own environments),
against the built-in engine through the gateway, greedy, `tool_choice` left to the framework ("auto": nothing
forces a call). Per framework, model and variant it prints: the tool-call rate (share of tasks in which a
recorded reply held a parsed tool call), tasks where a reply wrote a call in another shape, which stays text
(agentgrad's parser gives it a `tool_call_parse_error`: Qwen's JSON object without its `<tool_call>` tokens), the
answer accuracy (the task's reward), model calls per task and the wall time. Counts come from the spans the
gateway recorded, so they are what training would see. `--recount` prints the table again from the stores of
an earlier run's `--out` folder (its wall times are not stored: `-`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agentgrad.algorithms.baseline import Baseline
from agentgrad.engine import Engine
from agentgrad.policy.local import LocalPolicy
from agentgrad.semconv import GEN_AI_OUTPUT_MESSAGES, is_llm_call
from agentgrad.store import SqliteStore
from agentgrad.tool_calls import functions, parse_reply
from examples.frameworks.run import FRAMEWORKS, run
from examples.frameworks.tasks import CALCULATE_SCHEMA, make_tasks

MAX_TOKENS = 96
"""Per model call: a Hermes call to `calculate` is ~30 tokens, an answer ~10; a model that rambles is cut here."""


@dataclass
class Row:
    """One framework × model × variant: what its tasks did."""

    framework: str
    model: str
    worked_example: bool
    tasks: int
    called: int
    shaped: int
    correct: int
    calls: int
    wall_s: float | None
    error: str = ""

    def cells(self) -> list[str]:
        if self.error:
            return [self.framework, self.model, "yes" if self.worked_example else "no", "-", "-", "-", "-", self.error]
        return [
            self.framework,
            self.model,
            "yes" if self.worked_example else "no",
            f"{self.called}/{self.tasks}",
            f"{self.shaped}/{self.tasks}",
            f"{self.correct}/{self.tasks}",
            f"{self.calls / max(self.tasks, 1):.1f}",
            "-" if self.wall_s is None else f"{self.wall_s:.0f}",
        ]


async def count(store: SqliteStore) -> tuple[int, int, int, int, int]:
    """(tasks, with a tool call, with a call-shaped text reply, answered right, model calls) over the store's rollouts."""
    rollouts = await store.query_rollouts()
    tools = functions([CALCULATE_SCHEMA])
    called = shaped = correct = calls = 0
    for rollout in rollouts:
        spans = [s for s in await store.query_spans(rollout.rollout_id) if is_llm_call(s)]
        calls += len(spans)
        replies = [m for s in spans for m in json.loads(s.attributes.get(GEN_AI_OUTPUT_MESSAGES) or "[]")]
        called += any(m.get("tool_calls") for m in replies)
        shaped += any(isinstance(m.get("content"), str) and parse_reply(m["content"], tools).error for m in replies)
        correct += rollout.reward == 1.0
    return len(rollouts), called, shaped, correct, calls


def recount(folder: Path) -> list[Row]:
    """The rows of an earlier run, from the stores in its folder (named `<framework>-<model>-<with|without>.db`)."""
    rows = []
    for path in sorted(folder.glob("*.db")):
        framework = max((f for f in FRAMEWORKS if path.stem.startswith(f + "-")), key=len)
        model, _, variant = path.stem[len(framework) + 1 :].rpartition("-")
        tasks, called, shaped, correct, calls = asyncio.run(count(SqliteStore(path)))
        rows.append(Row(framework, model, variant == "with", tasks, called, shaped, correct, calls, None))
    return rows


def run_one(engine: Engine, framework: str, model: str, worked_example: bool, n: int, folder: Path,
            operator: str = "+") -> Row:
    """A Baseline pass of `framework`'s agent over `n` tasks on `engine`, counted from its own store."""
    store = SqliteStore(folder / f"{framework}-{model}-{'with' if worked_example else 'without'}.db")
    tasks = make_tasks(n, worked_example=worked_example, operator=operator)
    began = time.perf_counter()
    log = folder / f"runner-{framework}-{model}-{worked_example}.log"
    try:
        with LocalPolicy(store, engine) as policy:
            llm = policy.llm(temperature=0.0, max_tokens=MAX_TOKENS)
            asyncio.run(run(framework, Baseline(), store, tasks, llm=llm, gateway=policy.gateway_url + "/v1", log=log))
    except Exception as exc:  # one framework's failure (a missing environment) is a row, not the end of the run
        error = f"{type(exc).__name__}: {exc}"[:80]
        return Row(framework, model, worked_example, n, 0, 0, 0, 0, time.perf_counter() - began, error)
    wall = time.perf_counter() - began
    tasks_run, called, shaped, correct, calls = asyncio.run(count(store))
    return Row(framework, model, worked_example, tasks_run, called, shaped, correct, calls, wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=8, help="three-digit additions per framework, model and variant")
    parser.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2-135m"])
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=list(FRAMEWORKS))
    parser.add_argument("--variants", nargs="+", default=["without", "with"], choices=["without", "with"],
                        help="the worked exchange left out of the history, or kept")
    parser.add_argument("--operator", default="+", choices=["+", "*"],
                        help="three-digit additions (the examples' tasks) or multiplications (past a small model's head)")
    parser.add_argument("--out", default=None, help="folder for the stores and runner logs (default: a temporary one)")
    parser.add_argument("--recount", action="store_true", help="only print the table of the stores already in --out")
    args = parser.parse_args()
    header = ["framework", "model", "worked example", "tool call rate", "call-shaped text", "accuracy", "calls/task",
              "wall s"]
    if args.recount:
        if not args.out:
            raise SystemExit("--recount reads the stores of an earlier run: name its folder with --out")
        print_table(header, recount(Path(args.out)))
        return
    os.environ.pop("OPENAI_BASE_URL", None)  # the plain openai agent is pointed at the gateway by its runner
    folder = Path(args.out or tempfile.mkdtemp(prefix="frameworks-unforced-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"tasks: {args.tasks} three-digit {'additions' if args.operator == '+' else 'multiplications'}; "
          f"stores and runner logs in {folder}; load average {os.getloadavg()[0]:.2f}", flush=True)
    rows: list[Row] = []
    for model in args.models:
        began = time.perf_counter()
        engine = Engine(model, name=model)
        print(f"{model}: loaded in {time.perf_counter() - began:.0f} s", flush=True)
        try:
            for variant in args.variants:
                for framework in args.frameworks:
                    row = run_one(engine, framework, model, variant == "with", args.tasks, folder, args.operator)
                    rows.append(row)
                    print(" | ".join(row.cells()), f"(load {os.getloadavg()[0]:.2f})", flush=True)
        finally:
            engine.close()
    print_table(header, rows)
    print(f"\nload average {os.getloadavg()[0]:.2f}")


def print_table(header: list[str], rows: list[Row]) -> None:
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")


if __name__ == "__main__":
    main()
