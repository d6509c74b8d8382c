"""The SQL tool's answer to a query that raised an error: the fix it names is one that runs and answers."""

from __future__ import annotations

from contextlib import closing

import pytest

from examples.sql import agent, db, hints


@pytest.fixture(autouse=True)
def databases_in(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTGRAD_SQL_DIR", str(tmp_path_factory.getbasetemp() / "sql"))


def answer(name: str, sql: str) -> str:
    with closing(db.connect_readonly(name)) as connection:
        return agent.tool_answer(connection, name, sql, [])


def rows(name: str, sql: str) -> list[tuple]:
    with closing(db.connect_readonly(name)) as connection:
        return db.execute(connection, sql)


def test_a_column_taken_from_the_wrong_alias_is_named_with_the_alias_that_has_it() -> None:
    wrong = "SELECT c.title FROM loans AS c JOIN books AS p ON c.book_id = p.id"
    said = answer("library", wrong)
    assert said.startswith("Error: no such column: c.title. The columns of the tables you used: books(id, title,")
    assert said.endswith("c is loans, which has no column title; title is a column of books, which the query names p: "
                         "use p.title")
    assert rows("library", wrong.replace("c.title", "p.title"))


def test_an_alias_the_query_never_gave_is_said_so_and_the_column_s_own_alias_named() -> None:
    said = answer("clinic", "SELECT c.status, AVG(d.fee) FROM appointments AS c GROUP BY c.status")
    assert said.endswith("the query names no table d; fee is a column of appointments, which the query names c: use c.fee")


def test_a_column_of_a_table_the_query_does_not_join_is_given_the_join_by_its_foreign_key() -> None:
    member = rows("library", "SELECT m.name FROM loans AS l JOIN members AS m ON l.member_id = m.id LIMIT 1")[0][0]
    wrong = f"SELECT c.title FROM loans AS c JOIN members AS p ON c.member_id = p.id WHERE p.name = '{member}'"
    said = answer("library", wrong)
    assert said.endswith("title is a column of books, which the query does not use: to reach it, join books ON "
                         "c.book_id = books.id")
    fixed = wrong.replace("SELECT c.title FROM loans AS c", "SELECT books.title FROM loans AS c JOIN books ON c.book_id = books.id")
    assert rows("library", fixed)


def test_no_join_is_offered_where_no_declared_key_links_the_tables() -> None:
    # teachers' names are unique, but a database that declares its keys is joined by them alone
    said = answer("school", "SELECT hired_year FROM students WHERE name = 'x'")
    assert said.endswith("The columns of the tables you used: students(id, name, grade_level, city, email)")


def test_a_table_s_own_id_asked_as_table_id_is_its_key() -> None:
    said = answer("shop", "SELECT c.order_id FROM orders AS c JOIN customers AS p ON c.customer_id = p.id")
    assert said.endswith("c is orders, which has no column order_id; its own key is id: use c.id")


def test_a_missing_table_that_is_a_column_or_a_near_name_is_named_with_every_table() -> None:
    said = answer("airline", "SELECT c.number FROM flights AS c JOIN prices AS p ON c.id = p.flight_id WHERE p.price > 500")
    assert said == ("Error: no such table: prices. The tables are: airports, flights, passengers, bookings; price is a "
                    "column of flights: use flights.price, without a table prices")
    assert answer("library", "SELECT COUNT(*) FROM loan").endswith("; use loans")
    assert answer("clinic", "SELECT name FROM physicians").endswith("The tables are: doctors, patients, appointments")


def test_the_nearest_column_name_is_offered_when_no_table_has_the_one_written() -> None:
    assert answer("clinic", "SELECT specialties FROM doctors").endswith(
        "the nearest column is doctors.specialty: use doctors.specialty")
    # nothing near: the columns alone, no guess
    assert answer("library", "SELECT name FROM members WHERE loan_count > 4").endswith(
        "The columns of the tables you used: members(id, name, city, joined_year)")


def test_an_ambiguous_column_is_given_each_table_that_has_it_as_the_query_names_it() -> None:
    wrong = "SELECT name FROM loans AS l JOIN members AS m ON l.member_id = m.id JOIN books AS b ON l.book_id = b.id " \
            "JOIN authors AS a ON b.author_id = a.id"
    said = answer("library", wrong)
    assert said == ("Error: ambiguous column name: name. name is a column of members and of authors: say which, "
                    "m.name or a.name")
    assert rows("library", wrong.replace("SELECT name", "SELECT m.name"))


def test_the_query_s_tables_are_read_with_their_aliases_and_without_keywords() -> None:
    assert hints.references("library", "SELECT * FROM books b JOIN authors AS a ON b.author_id = a.id WHERE a.id = 1") == [
        ("books", "b"), ("authors", "a")]
    assert hints.references("library", "SELECT * FROM books WHERE id IN (SELECT book_id FROM loans)") == [
        ("books", "books"), ("loans", "loans")]
