"""The SQL example's databases, questions and reward: plain `sqlite3`, no agentgrad.

A project database is built once from its committed script (`databases/NAME.sql`) into a file
named by the script's hash; a real-world one (`real_world.py`) is its package's own SQLite file or
is built once from the package's CSV files. Either is only ever opened read-only (`file:...?mode=ro` and `PRAGMA query_only`),
with a time limit on every query enforced by a progress handler.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import sqlite3
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from examples.sql import real_world

HERE = Path(__file__).parent
QUERY_TIME_LIMIT_S = 2.0
"""A query running longer is interrupted: a runaway join or recursive CTE must not stall a rollout."""
REAL_WORLD_TIME_LIMIT_S = 20.0
"""The real-world databases' limit: nycflights13's 336,776 flights make an honest join take 1-3 s on 2 loaded cores."""
MAX_ROWS_SHOWN = 20
"""The tool shows at most this many rows to the model (and says how many it left out)."""


def database_names() -> list[str]:
    """The project's own databases (generated from `databases/*.sql`)."""
    return sorted(p.stem for p in (HERE / "databases").glob("*.sql"))


def real_world_names() -> list[str]:
    """The databases other people designed, from PyPI packages (`real_world.py`): held out, never trained on."""
    return sorted(real_world.SOURCES)


def database_path(name: str) -> Path:
    """The SQLite file of a database: a real-world one's shipped file, else one built on first use (from the
    project's script or a package's CSV files) under `$AGENTGRAD_SQL_DIR` or the temp dir."""
    if name in real_world.SOURCES:
        shipped = real_world.shipped_file(name)
        if shipped is not None:
            return shipped
        return _built(f"{name}-{real_world.build_key(name)}", lambda c: real_world.build(name, c))
    text = (HERE / "databases" / f"{name}.sql").read_text()
    return _built(f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}", lambda c: c.executescript(text))


def _built(stem: str, write: Callable[[sqlite3.Connection], object]) -> Path:
    folder = Path(os.environ.get("AGENTGRAD_SQL_DIR") or Path(tempfile.gettempdir()) / "agentgrad-sql")
    path = folder / f"{stem}.sqlite"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        # one partial file per thread: rollouts in runner threads of one process build the same file at once
        partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
        partial.unlink(missing_ok=True)
        with closing(sqlite3.connect(partial)) as connection:
            write(connection)
        os.replace(partial, path)  # atomic: concurrent runners may build the same file
    return path


def _authorize(action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
    """Deny what a read-only file still allows: ATTACH (it creates files) and setting a PRAGMA."""
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH) or (action == sqlite3.SQLITE_PRAGMA and arg2 is not None):
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def connect_readonly(name: str) -> sqlite3.Connection:
    """A connection that cannot change anything: the file opened read-only, `query_only`, and an authorizer."""
    connection = sqlite3.connect(f"file:{database_path(name)}?mode=ro", uri=True, check_same_thread=False)
    connection.execute("PRAGMA query_only = ON")
    connection.set_authorizer(_authorize)
    return connection


def time_limit(name: str) -> float:
    """Seconds a query on database `name` may run."""
    return REAL_WORLD_TIME_LIMIT_S if name in real_world.SOURCES else QUERY_TIME_LIMIT_S


def execute(connection: sqlite3.Connection, sql: str, time_limit_s: float = QUERY_TIME_LIMIT_S,
            parameters: tuple[Any, ...] = ()) -> list[tuple]:
    """The query's rows; raises `sqlite3.Error` (a write, a syntax error, or "interrupted" past the limit)."""
    deadline = time.monotonic() + time_limit_s
    connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 1000)
    try:
        return connection.execute(sql, parameters).fetchall()
    finally:
        connection.set_progress_handler(None, 0)


def schema(name: str) -> str:
    """The CREATE TABLE statements, as the model sees them in its system prompt."""
    with closing(connect_readonly(name)) as connection:
        rows = connection.execute("SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
    return "\n".join(row[0] + ";" for row in rows)


SPLITS = ("train", "held_out", "real_world")


@functools.lru_cache(maxsize=64)
def column_types(name: str) -> dict[str, list[tuple[str, str]]]:
    """Each table's (column, declared type) pairs, in order."""
    # mode=ro without the tool's authorizer, which denies PRAGMA with an argument
    with closing(sqlite3.connect(f"file:{database_path(name)}?mode=ro", uri=True)) as connection:
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: [(row[1], row[2]) for row in connection.execute(f'PRAGMA table_info("{t}")')] for t in tables}


@functools.lru_cache(maxsize=64)
def columns(name: str) -> dict[str, list[str]]:
    """Each table's column names, in order."""
    return {t: [column for column, _ in pairs] for t, pairs in column_types(name).items()}


def returned_nothing(rows: list[tuple]) -> bool:
    """No rows, or one row of zeros and NULLs (a count or a sum over no rows): no question here has that answer."""
    return not rows or (len(rows) == 1 and all(value is None or value == 0 for value in rows[0]))


def query_fails(name: str, sql: str) -> bool:
    """The query raises an error on database `name` or returns nothing: what the agent counts as a failed query."""
    with closing(connect_readonly(name)) as connection:
        try:
            return returned_nothing(execute(connection, sql, time_limit(name)))
        except sqlite3.Error:
            return True


def load_questions(split: str | None = None) -> list[dict[str, Any]]:
    """The committed questions: `train`, `held_out` (the project's databases never seen in training),
    `real_world` (written by hand for `real_world.py`'s databases, never trained on), or all of them."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split is one of {SPLITS} or None, got {split!r}")
    questions = json.loads((HERE / "questions.json").read_text())
    questions += json.loads((HERE / "real_world_questions.json").read_text())
    return [q for q in questions if split is None or q["split"] == split]


def _normal(row: tuple) -> tuple:
    return tuple(round(float(v), 4) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in row)


def _same(predicted: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    if ordered:
        return predicted == gold
    return Counter(predicted) == Counter(gold)


@functools.lru_cache(maxsize=4096)
def _gold_rows(name: str, gold_sql: str) -> list[tuple]:
    """A gold query's rows, run once per process: every query an agent runs is scored against them."""
    with closing(connect_readonly(name)) as connection:
        return [_normal(row) for row in execute(connection, gold_sql, time_limit(name))]


def execution_match(name: str, predicted_sql: str | None, gold_sql: str) -> float:
    """1.0 when the predicted query returns the gold query's rows, else 0.0.

    Rows compare as multisets unless the gold query has ORDER BY; numbers compare to 4 decimals;
    columns may come in another order (as in Spider's evaluation), the same order for every row.
    """
    if not predicted_sql:
        return 0.0
    gold = _gold_rows(name, gold_sql)
    with closing(connect_readonly(name)) as connection:
        try:
            predicted = [_normal(row) for row in execute(connection, predicted_sql, time_limit(name))]
        except sqlite3.Error:
            return 0.0
    ordered = re.search(r"\border\s+by\b", gold_sql, re.IGNORECASE) is not None
    if _same(predicted, gold, ordered):
        return 1.0
    width = len(gold[0]) if gold else 0
    if not predicted or len(predicted[0]) != width or width > 4:
        return 0.0
    for order in itertools.permutations(range(width)):
        if _same([tuple(row[i] for i in order) for row in predicted], gold, ordered):
            return 1.0
    return 0.0
