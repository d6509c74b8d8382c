"""A text-to-SQL agent written as LangGraph's docs write a ReAct agent. No agentgrad here.

`create_react_agent(ChatOpenAI(...), [run_sql], prompt=...)`: the database's schema is in the
system prompt; the model may run queries with `run_sql` (read-only, time-limited; an error comes
back as the tool's text so the model can fix its query) and ends with its final query in a
```sql block. The endpoint comes in as `base_url`.

A query *failed* when it raised an error or returned nothing: no rows, or one row of zeros and NULLs (every
question here has an answer, so an empty result says the query compared against a value or column that is
not there). The tool's answer to a failed query says why it may have failed and what to use instead (`hints`), and
to a query that failed before, that it did.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from examples.sql import db, hints

INSTRUCTIONS = """You write SQLite queries that answer questions about this database:

{schema}

You must run your query with the run_sql tool before you answer. For example, asked "How many rows are in the table t?", you first write
<tool_call>
{{"name": "run_sql", "arguments": {{"query": "SELECT COUNT(*) FROM t"}}}}
</tool_call>
and read its rows. If it fails, read the error, fix the query and run it again. When the query ran and its rows answer the question, reply with that query alone in a ```sql code block."""
"""The system prompt. Without the instruction to run the query first (and the call it shows, in the format Qwen's
template asks for), the untrained Qwen2.5-Coder-0.5B never calls run_sql: it answers with a ```sql block at once."""

RECURSION_LIMIT = 12
"""LangGraph steps per question (a model turn and a tool turn are one step each): about five queries."""


@dataclass
class Episode:
    """What one question produced: the final query and every query run, with whether it failed."""

    answer: str | None
    queries: list[tuple[str, bool]] = field(default_factory=list)  # (sql, failed: an error or nothing returned)

    @property
    def first_failed(self) -> bool:
        """The first query run failed: the episode had something to correct."""
        return bool(self.queries) and self.queries[0][1]

    @property
    def recovered(self) -> bool:
        """The first query failed and a later one ran (whether its rows were right is the reward's to say)."""
        return self.first_failed and any(not failed for _, failed in self.queries[1:])


def format_rows(rows: list[tuple]) -> str:
    if not rows:
        return "(no rows)"
    shown = "\n".join(" | ".join(str(value) for value in row) for row in rows[: db.MAX_ROWS_SHOWN])
    more = len(rows) - db.MAX_ROWS_SHOWN
    return shown + (f"\n... ({more} more rows)" if more > 0 else "")


def final_query(text: str) -> str | None:
    """The query in the reply's last ```sql block, else in a run_sql call written as JSON text, else a bare
    SELECT/WITH statement; None for several calls written as text (they are calls it meant to run, not an answer,
    and a bare reading takes their JSON with them)."""
    blocks = re.findall(r"```(?:sql|sqlite)?\s*\n?(.*?)```", text, re.DOTALL | re.IGNORECASE)
    if blocks:
        return blocks[-1].strip().rstrip(";").strip() or None
    try:  # after a tool round Qwen-0.5B often repeats its call as text: {"name": "run_sql", "arguments": {...}}
        call = json.loads(text.strip())
        query = call["arguments"]["query"] if isinstance(call, dict) else None
    except (ValueError, KeyError, TypeError):
        query = None
    if isinstance(query, str):
        return query.strip().rstrip(";").strip() or None
    if re.search(r'"name"\s*:\s*"run_sql"', text):
        return None
    bare = re.search(r"\b((?:SELECT|WITH)\b.*)", text, re.DOTALL | re.IGNORECASE)
    return bare.group(1).strip().rstrip(";").strip() if bare else None


def tool_answer(connection: sqlite3.Connection, database: str, query: str, ran: list[tuple[str, bool]]) -> str:
    """What `run_sql` answers: the rows or the error, and why a failed query may have failed (`hints.error_hint`,
    `hints.value_hint`, a rerun unchanged); `(query, failed)` is appended to `ran`, the episode's queries so far."""
    try:
        rows = db.execute(connection, query, db.time_limit(database))
    except sqlite3.Error as exc:
        ran.append((query, True))
        text = f"Error: {exc}"
        if hint := hints.error_hint(database, query, str(exc)):
            text += f". {hint}"
    else:
        ran.append((query, db.returned_nothing(rows)))
        text = format_rows(rows)
        if ran[-1][1] and (hint := hints.value_hint(connection, database, query)):
            text += f". {hint}"
    if ran[-1][1] and [sql for sql, _ in ran[:-1]].count(query):
        text += ". You ran this same query before: change it"
    return text


def sql_tool(run: Callable[[str], str]) -> BaseTool:
    """The agent's `run_sql` tool, answering each query with `run(query)`: the one definition the model is shown."""

    @tool
    def run_sql(query: str) -> str:
        """Run one SQLite query on the database and return its rows, or the error."""
        return run(query)

    return run_sql


def tool_definitions() -> list[dict[str, Any]]:
    """`run_sql` as the agent's chat model sends it (LangChain's OpenAI form): for chats written in advance, such as
    the recovery demonstrations (`recovery.demonstration`)."""

    def never(query: str) -> str:
        raise RuntimeError("a definition only: `solve` runs the queries")

    return [convert_to_openai_tool(sql_tool(never))]


def solve(question: str, database: str, *, model: str, base_url: str | None = None, api_key: str | None = None,
          run_first: bool = False, retries: int = 0, first_query: str | None = None, first_query_runs: int = 1,
          on_query: Callable[[str, bool], None] | None = None, system_prompt: str | None = None,
          **settings: Any) -> Episode:
    """Answer `question` on `database`. `run_first`: the first turn must call run_sql (`tool_choice="required"`,
    by LangGraph's dynamic model selection); `retries`: after a failed query, the next turn must run another, up
    to that many times; other turns choose. `first_query`: the episode starts with this query already called and
    answered, as if the model had written it (a training episode that starts from a mistake to fix), run
    `first_query_runs` times (2: the model reran it unchanged and the tool said so). `on_query(sql,
    failed)` is called as each query the model wrote has run. `system_prompt`: the system prompt, rendered (by
    default `INSTRUCTIONS` with the database's schema)."""
    queries: list[tuple[str, bool]] = []
    with closing(db.connect_readonly(database)) as connection:

        def run(query: str) -> str:
            text = tool_answer(connection, database, query, queries)
            if on_query is not None:
                on_query(*queries[-1])
            return text

        run_sql = sql_tool(run)

        messages: list[Any] = [HumanMessage(question)]
        for run_number in range(first_query_runs if first_query is not None else 0):
            call_id = "call_first" + (f"_{run_number + 1}" if run_number else "")
            call = {"name": "run_sql", "args": {"query": first_query}, "id": call_id, "type": "tool_call"}
            answer = tool_answer(connection, database, first_query, queries)
            messages += [AIMessage("", tool_calls=[call]), ToolMessage(answer, tool_call_id=call_id)]
        chat = ChatOpenAI(model=model, base_url=base_url, api_key=api_key, **settings)

        def must_run(state: dict[str, Any]) -> bool:
            ran = sum(isinstance(message, ToolMessage) for message in state["messages"])
            if not ran:
                return run_first
            return bool(queries) and queries[-1][1] and ran <= retries  # the last query failed, and retries are left

        def pick_model(state: dict[str, Any], runtime: Any) -> Any:
            return chat.bind_tools([run_sql], tool_choice="required" if must_run(state) else "auto")

        agent = create_react_agent(pick_model if run_first or retries else chat, [run_sql],
                                   prompt=system_prompt or INSTRUCTIONS.format(schema=db.schema(database)))
        try:
            state = agent.invoke({"messages": messages}, {"recursion_limit": RECURSION_LIMIT})
        except GraphRecursionError:  # still calling tools when the step budget ran out
            state = {"messages": []}
    last = state["messages"][-1] if state["messages"] else None
    final = final_query(str(last.content)) if isinstance(last, AIMessage) and not last.tool_calls else None
    if final is None:  # no final block: the last query that ran is the answer
        final = next((sql for sql, failed in reversed(queries) if not failed), None)
    return Episode(final, queries)
