"""Why a query raised an error, as the SQL tool adds it to the error: the fix to use, where one can be named.

A small model rereads a short directive in the tool's answer where it would not search the schema above it: told
"no such column: c.title" with the tables' columns it repeats its query word for word, told that `title` is a column
of `books`, which the query names `p`, it uses `p.title`. The mistakes named here are the ones the 0.5B model makes
in the training episodes' first queries: a column taken from the wrong alias, a column of a table the query does not
join, a table that is really a column, a name near the right one.
"""

from __future__ import annotations

import difflib
import functools
import re
import sqlite3
from contextlib import closing

from examples.sql import db

_NOT_ALIASES = ("where|join|on|group|order|limit|inner|left|right|cross|natural|full|outer|union|having|using|except"
                "|intersect|as|select|from|and|or|not|by")
_REFERENCE = re.compile(rf'\b(?:FROM|JOIN)\s+"?(\w+)"?(?:\s+(?:AS\s+)?(?!(?:{_NOT_ALIASES})\b)(\w+))?', re.I)


def error_hint(name: str, sql: str, error: str) -> str:
    """What the tool adds to `error`, raised by `sql` on database `name` ("" where it has nothing to add)."""
    if found := re.match(r"no such column: (?:(\w+)\.)?(\w+)", error):
        return missing_column(name, sql, found[1], found[2])
    if found := re.match(r"ambiguous column name: (?:\w+\.)?(\w+)", error):
        return ambiguous_column(name, sql, found[1])
    if found := re.match(r"no such table: (?:\w+\.)?(\w+)", error):
        return missing_table(name, found[1])
    if "syntax error" in error:
        return syntax(sql)
    return ""


def references(name: str, sql: str) -> list[tuple[str, str]]:
    """(table, the name the query gives it: its alias, else its own) for each table of database `name` that `sql`
    reads FROM or JOINs, in order."""
    tables = {t.lower(): t for t in db.columns(name)}
    found = [(tables[table.lower()], alias or table) for table, alias in _REFERENCE.findall(sql) if table.lower() in tables]
    return list(dict.fromkeys(found))


def used_columns(name: str, sql: str) -> str:
    """The columns of the tables `sql` names, as one line: `books(id, title, ...); loans(...)`."""
    return "; ".join(f"{t}({', '.join(db.columns(name)[t])})" for t in db.tables_named(name, sql))


def missing_column(name: str, sql: str, qualifier: str | None, column: str) -> str:
    """For "no such column: [qualifier.]column": the tables' columns, then the column to use where one can be named:
    the same column of another table in the query (by its alias), the key a `<table>_id` means on its own table,
    the join that reaches a table that has it, or the nearest name."""
    refs, columns = references(name, sql), db.columns(name)
    notes = [f"The columns of the tables you used: {used_columns(name, sql)}"]
    owner = next((t for t, written in refs if qualifier and written.lower() == qualifier.lower()), None)
    if qualifier:
        notes.append(f"{qualifier} is {owner}, which has no column {column}" if owner else f"the query names no table {qualifier}")
    own_key = owner and column.lower() in (f"{owner.lower()}_id", f"{singular(owner).lower()}_id")
    holders = [(t, w) for t, w in refs if _has(columns[t], column) and not (qualifier and w.lower() == qualifier.lower())]
    outside = [t for t in columns if _has(columns[t], column) and t not in {t for t, _ in refs}]
    if own_key and _has(columns[owner], "id"):
        notes.append(f"its own key is id: use {qualifier}.id")
    elif holders:
        table, written = holders[0]
        said = f", which the query names {written}" if written != table else ""
        notes.append(f"{column} is a column of {table}{said}: use {written}.{_spelled(columns[table], column)}")
    elif outside and (link := next((j for t in outside if (j := join(name, refs, t))), "")):
        table = link.split(" ", 1)[0]
        notes.append(f"{column} is a column of {table}, which the query does not use: to reach it, join {link}")
    elif near := difflib.get_close_matches(column.lower(), [c.lower() for t, _ in refs for c in columns[t]], n=1):
        table, written = next((t, w) for t, w in refs if _has(columns[t], near[0]))
        notes.append(f"the nearest column is {table}.{_spelled(columns[table], near[0])}: use {written}.{_spelled(columns[table], near[0])}")
    return "; ".join(notes)


def ambiguous_column(name: str, sql: str, column: str) -> str:
    """For "ambiguous column name": the tables of the query that have it, each as the query names it."""
    holders = [(t, written) for t, written in references(name, sql) if _has(db.columns(name)[t], column)]
    if len(holders) < 2:
        return f"The columns of the tables you used: {used_columns(name, sql)}"
    choices = " or ".join(f"{written}.{column}" for _, written in holders)
    return f"{column} is a column of {' and of '.join(t for t, _ in holders)}: say which, {choices}"


def missing_table(name: str, table: str) -> str:
    """For "no such table": the database's tables, and the column or table the name most likely meant."""
    columns = db.columns(name)
    notes = [f"The tables are: {', '.join(columns)}"]
    wanted = {table.lower(), singular(table).lower()}
    if holders := [(t, c) for t, cs in columns.items() for c in cs if c.lower() in wanted]:
        t, c = holders[0]
        notes.append(f"{c} is a column of {t}: use {t}.{c}, without a table {table}")
    elif near := difflib.get_close_matches(table.lower(), [t.lower() for t in columns], n=1, cutoff=0.75):
        notes.append(f"use {next(t for t in columns if t.lower() == near[0])}")
    return "; ".join(notes)


def syntax(sql: str) -> str:
    """A plain rule for the syntax error a small model makes fixing a query: a JOIN added after its WHERE."""
    join_at, where_at = re.search(r"\bJOIN\b", sql, re.I), re.search(r"\bWHERE\b", sql, re.I)
    if join_at and where_at and where_at.start() < join_at.start():
        return "JOIN goes right after FROM and its table, before WHERE: SELECT ... FROM a JOIN b ON ... WHERE ..."
    return ""


def join(name: str, refs: list[tuple[str, str]], table: str) -> str:
    """`table ON a.x = table.y`: how a table of the query reaches `table`, by a declared foreign key either way or
    a column of the same name other than `id` (the real-world databases declare none); "" where neither does."""
    links = foreign_keys(name)
    for own, written in refs:
        for (source, key), (target, target_key) in links.items():
            if source == own and target == table:
                return f"{table} ON {written}.{key} = {table}.{target_key}"
            if source == table and target == own:
                return f"{table} ON {written}.{target_key} = {table}.{key}"
        shared = [c for c in db.columns(name)[own] if c.lower() != "id" and _has(db.columns(name)[table], c)]
        if shared:
            return f"{table} ON {written}.{shared[0]} = {table}.{_spelled(db.columns(name)[table], shared[0])}"
    return ""


@functools.lru_cache(maxsize=64)
def foreign_keys(name: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(table, column) -> (table, column) it references, as database `name` declares them."""
    with closing(sqlite3.connect(f"file:{db.database_path(name)}?mode=ro", uri=True)) as connection:
        return {(table, row[3]): (row[2], row[4] or "id") for table in db.columns(name)
                for row in connection.execute(f'PRAGMA foreign_key_list("{table}")')}


def singular(word: str) -> str:
    """`books` -> `book`, `prices` -> `price`, `classes` -> `class`: enough for table and column names."""
    if word.lower().endswith("sses") or word.lower().endswith("ies"):
        return word[:-2] if word.lower().endswith("sses") else word[:-3] + "y"
    return word[:-1] if word.lower().endswith("s") and not word.lower().endswith("ss") else word


def _has(columns: list[str], column: str) -> bool:
    return column.lower() in (c.lower() for c in columns)


def _spelled(columns: list[str], column: str) -> str:
    """The column as the table spells it (case may differ from the query's)."""
    return next(c for c in columns if c.lower() == column.lower())
