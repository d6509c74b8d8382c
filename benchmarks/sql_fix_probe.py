"""How often does the untrained model fix a failed query, by what the tool's answer tells it?

The SQL agent's training can only reinforce a fix that the model's samples sometimes make. This probe gives the
model each training question's first mistake (`recovery.first_mistake`: a trap of `recovery.py` sprung on the
gold query, or a join mistake) as its own call, answered by the tool in one of two ways, and samples its next
turn with the rerun forced (`tool_choice="required"`, as the agent forces it):

- `rows`: an empty result's rows alone (the tool before `hints.value_hint`; errors answered as now);
- `hint`: the tool as it is (`agent.tool_answer`): the comparison to write where one stored value matches case
  aside, the values like the literal or a few of the column's, a comparison with NULL named.

It prints, per answer and decoding (greedy; temperature 1 with `--samples` each), the share of next queries that
match the gold query's rows (fixed) and the share that repeat the mistake word for word.

    .venv/bin/python benchmarks/sql_fix_probe.py --questions 48 --samples 4
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.sql import agent, db, recovery  # noqa: E402

TOOL = {"type": "function", "function": {
    "name": "run_sql", "description": "Run one SQLite query on the database and return its rows, or the error.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}


def rows_only(name: str, sql: str) -> str:
    """The tool's answer before `hints.value_hint`: an empty result's rows alone (errors were answered as now)."""
    with closing(db.connect_readonly(name)) as connection:
        try:
            return agent.format_rows(db.execute(connection, sql, db.time_limit(name)))
        except sqlite3.Error:
            return agent.tool_answer(connection, name, sql, [])


def answered(name: str, sql: str) -> str:
    """What the agent's tool answers a query run first in an episode."""
    with closing(db.connect_readonly(name)) as connection:
        return agent.tool_answer(connection, name, sql, [])


ANSWERS: dict[str, Callable[[str, str], str]] = {"rows": rows_only, "hint": answered}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--questions", type=int, default=48, help="training questions that have a mistake, spread")
    parser.add_argument("--samples", type=int, default=4, help="sampled next turns per question at temperature 1")
    args = parser.parse_args()

    from openai import OpenAI

    from agentgrad.engine import Engine
    from agentgrad.engine.server import create_engine_app
    from agentgrad.serving import ServerThread

    rng = random.Random(0)
    given = [(q, sql) for q in db.load_questions("train") if (sql := recovery.first_mistake(q, rng)) is not None]
    given = [given[i * len(given) // args.questions] for i in range(min(args.questions, len(given)))]
    engine = Engine(args.model, sampling_dtype="float32")
    with ServerThread(create_engine_app(engine)) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=1800)

        def next_queries(question: dict, mistake: str, answer: str, temperature: float, n: int) -> list[str | None]:
            call = {"id": "call_first", "type": "function",
                    "function": {"name": "run_sql", "arguments": json.dumps({"query": mistake})}}
            messages = [{"role": "system", "content": agent.INSTRUCTIONS.format(schema=db.schema(question["db"]))},
                        {"role": "user", "content": question["question"]},
                        {"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": "call_first", "content": answer}]
            reply = client.chat.completions.create(model=engine.name, messages=messages, tools=[TOOL],
                                                   tool_choice="required", temperature=temperature, n=n,
                                                   max_tokens=192, seed=0)
            out = []
            for choice in reply.choices:
                calls = choice.message.tool_calls or []
                out.append(json.loads(calls[0].function.arguments).get("query") if calls else None)
            return out

        print(f"{len(given)} training questions with a mistake; {args.model}; {args.samples} samples at temperature 1")
        print("| tool's answer | decoding | fixed | repeated the mistake | next turns |")
        print("|---|---|---|---|---|")
        for label, answer in ANSWERS.items():
            for decoding, temperature, n in (("greedy", 0.0, 1), ("temperature 1", 1.0, args.samples)):
                began = time.perf_counter()
                jobs = [(q, mistake, answer(q["db"], mistake), temperature, n) for q, mistake in given]
                with ThreadPoolExecutor(16) as pool:
                    results = list(zip(given, pool.map(lambda job: next_queries(*job), jobs)))
                fixed = repeated = total = 0
                for (question, mistake), queries in results:
                    for sql in queries:
                        total += 1
                        fixed += db.execution_match(question["db"], sql, question["gold"]) >= 1.0
                        repeated += sql is not None and sql.strip().rstrip(";") == mistake
                print(f"| {label} | {decoding} | {fixed / total:.3f} ({fixed}/{total}) | "
                      f"{repeated / total:.3f} ({repeated}/{total}) | {time.perf_counter() - began:.0f} s |", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
