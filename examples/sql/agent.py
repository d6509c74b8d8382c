"""A text-to-SQL agent written as LangGraph's docs write a ReAct agent. No agentgrad here.

`create_react_agent(ChatOpenAI(...), [run_sql], prompt=...)`: the database's schema is in the
system prompt; the model may run queries with `run_sql` (read-only, time-limited; an error comes
back as the tool's text so the model can fix its query) and ends with its final query in a
```sql block. The endpoint comes in as `base_url`.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from examples.sql import db

INSTRUCTIONS = """You write SQLite queries that answer questions about this database:

{schema}

Use the run_sql tool to run a query and see its result; if it fails, read the error and fix the query.
When the query is right, answer with the final query alone in a ```sql code block."""

RECURSION_LIMIT = 12
"""LangGraph steps per question (a model turn and a tool turn are one step each): about five queries."""


@dataclass
class Episode:
    """What one question produced: the final query and every query run, with whether it failed."""

    answer: str | None
    queries: list[tuple[str, bool]] = field(default_factory=list)  # (sql, failed)

    @property
    def failed_query(self) -> bool:
        return any(failed for _, failed in self.queries)

    @property
    def self_corrected(self) -> bool:
        """A query failed and a later one ran: the agent fixed its own mistake."""
        first_failure = next((i for i, (_, failed) in enumerate(self.queries) if failed), None)
        return first_failure is not None and any(not failed for _, failed in self.queries[first_failure + 1:])


def format_rows(rows: list[tuple]) -> str:
    if not rows:
        return "(no rows)"
    shown = "\n".join(" | ".join(str(value) for value in row) for row in rows[: db.MAX_ROWS_SHOWN])
    more = len(rows) - db.MAX_ROWS_SHOWN
    return shown + (f"\n... ({more} more rows)" if more > 0 else "")


def final_query(text: str) -> str | None:
    """The query in the reply's last ```sql block, else a bare SELECT/WITH statement."""
    blocks = re.findall(r"```(?:sql|sqlite)?\s*\n?(.*?)```", text, re.DOTALL | re.IGNORECASE)
    if blocks:
        return blocks[-1].strip().rstrip(";").strip() or None
    bare = re.search(r"\b((?:SELECT|WITH)\b.*)", text, re.DOTALL | re.IGNORECASE)
    return bare.group(1).strip().rstrip(";").strip() if bare else None


def solve(question: str, database: str, *, model: str, base_url: str | None = None, api_key: str | None = None,
          **settings: Any) -> Episode:
    queries: list[tuple[str, bool]] = []
    with closing(db.connect_readonly(database)) as connection:

        @tool
        def run_sql(query: str) -> str:
            """Run one SQLite query on the database and return its rows, or the error."""
            try:
                rows = db.execute(connection, query)
            except sqlite3.Error as exc:
                queries.append((query, True))
                return f"Error: {exc}"
            queries.append((query, False))
            return format_rows(rows)

        agent = create_react_agent(ChatOpenAI(model=model, base_url=base_url, api_key=api_key, **settings), [run_sql],
                                   prompt=INSTRUCTIONS.format(schema=db.schema(database)))
        try:
            state = agent.invoke({"messages": [{"role": "user", "content": question}]},
                                 {"recursion_limit": RECURSION_LIMIT})
        except GraphRecursionError:  # still calling tools when the step budget ran out
            state = {"messages": []}
    last = state["messages"][-1] if state["messages"] else None
    answer = final_query(str(last.content)) if isinstance(last, AIMessage) and not last.tool_calls else None
    if answer is None:  # no final block: the last query that ran is the answer
        answer = next((sql for sql, failed in reversed(queries) if not failed), None)
    return Episode(answer, queries)
