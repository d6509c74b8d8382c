"""Question kinds whose first query plausibly fails or returns no rows, so that fixing it can be learned.

Each kind is a trap a first query falls into and a rerun gets out of, once the tool's answer says so:

- `join3`: three or four tables joined (a missing join or a wrong key: no such column, or no rows);
- `ambiguous`: a join of tables that share a column name (`name`, `id`): "ambiguous column name";
- `having`: a condition on a group's count or sum (WHERE COUNT(*) is "misuse of aggregate");
- `date_text`: dates stored as ISO text, asked by month name (MONTH() is "no such function");
- `null`: a value missing as NULL (`= NULL` matches no row);
- `synonym`: the question's word is not the column's name (no such column);
- `literal_case`: a value cased as in prose, not as stored (no rows).

A template is (kind, question, gold, values): `values` is a query for the values of the template's
parameter (None: no parameter); the question sees it as `{x}`, cased the other way as `{X}`, or as a
month (`{month}`, from `YYYY-MM`); the gold query sees `{x}` as is and `{q}` as an SQL literal.
"""

from __future__ import annotations

import calendar
import functools
import json
import random
import re
import sqlite3
from collections.abc import Callable
from contextlib import closing
from typing import Any

from examples.sql import agent, db

KINDS = ("join3", "ambiguous", "having", "date_text", "null", "synonym", "literal_case")
VALUES_PER_TEMPLATE = 2

Template = tuple[str, str, str, str | None]

TEMPLATES: dict[str, list[Template]] = {
    "library": [
        ("join3", "How many loans were of books written by authors from {x}?",
         "SELECT COUNT(*) FROM loans AS l JOIN books AS b ON l.book_id = b.id JOIN authors AS a ON b.author_id = a.id "
         "WHERE a.country = {q}", "SELECT DISTINCT country FROM authors"),
        ("join3", "List the names of the members who borrowed a book written by {x}.",
         "SELECT DISTINCT m.name FROM loans AS l JOIN books AS b ON l.book_id = b.id JOIN authors AS a "
         "ON b.author_id = a.id JOIN members AS m ON l.member_id = m.id WHERE a.name = {q}", "SELECT name FROM authors"),
        ("ambiguous", "List the titles of the books borrowed by {x}.",
         "SELECT DISTINCT b.title FROM loans AS l JOIN books AS b ON l.book_id = b.id JOIN members AS m "
         "ON l.member_id = m.id WHERE m.name = {q}", "SELECT name FROM members"),
        ("having", "Which members made more than {x} loans? Give their names.",
         "SELECT m.name FROM loans AS l JOIN members AS m ON l.member_id = m.id GROUP BY m.id HAVING COUNT(*) > {x}",
         "SELECT DISTINCT COUNT(*) FROM loans GROUP BY member_id"),
        ("having", "Which genres have more than {x} books? Give the genres.",
         "SELECT genre FROM books GROUP BY genre HAVING COUNT(*) > {x}", "SELECT DISTINCT COUNT(*) FROM books GROUP BY genre"),
        ("date_text", "How many loans were made in {month}?", "SELECT COUNT(*) FROM loans WHERE loan_date LIKE '{x}-%'",
         "SELECT DISTINCT substr(loan_date, 1, 7) FROM loans"),
        ("date_text", "List the ids of the loans returned in {month}.",
         "SELECT id FROM loans WHERE return_date LIKE '{x}-%'",
         "SELECT DISTINCT substr(return_date, 1, 7) FROM loans WHERE return_date IS NOT NULL"),
        ("null", "List the ids of the loans that have not been returned.", "SELECT id FROM loans WHERE return_date IS NULL",
         None),
        ("synonym", "What is the nationality of the author {x}?", "SELECT country FROM authors WHERE name = {q}",
         "SELECT name FROM authors"),
        ("synonym", "In which year was the book '{x}' published?", "SELECT year FROM books WHERE title = {q}",
         "SELECT title FROM books"),
        ("literal_case", "List the titles of the {X} books.", "SELECT title FROM books WHERE genre = {q}",
         "SELECT DISTINCT genre FROM books"),
        ("literal_case", "List the names of the members who live in {X}.", "SELECT name FROM members WHERE city = {q}",
         "SELECT DISTINCT city FROM members"),
    ],
    "clinic": [
        ("join3", "List the names of the doctors seen by patients living in {x}.",
         "SELECT DISTINCT d.name FROM appointments AS a JOIN doctors AS d ON a.doctor_id = d.id JOIN patients AS p "
         "ON a.patient_id = p.id WHERE p.city = {q}", "SELECT DISTINCT city FROM patients"),
        ("ambiguous", "List the names of the patients who had an appointment with doctor {x}.",
         "SELECT DISTINCT p.name FROM appointments AS a JOIN patients AS p ON a.patient_id = p.id JOIN doctors AS d "
         "ON a.doctor_id = d.id WHERE d.name = {q}", "SELECT name FROM doctors"),
        ("join3", "What is the total fee of the completed appointments with doctors of {x}?",
         "SELECT SUM(a.fee) FROM appointments AS a JOIN doctors AS d ON a.doctor_id = d.id "
         "WHERE d.specialty = {q} AND a.status = 'completed'", "SELECT DISTINCT specialty FROM doctors"),
        ("having", "Which doctors have more than {x} appointments? Give their names.",
         "SELECT d.name FROM appointments AS a JOIN doctors AS d ON a.doctor_id = d.id GROUP BY d.id HAVING COUNT(*) > {x}",
         "SELECT DISTINCT COUNT(*) FROM appointments GROUP BY doctor_id"),
        ("having", "Which cities have more than {x} patients? Give the cities.",
         "SELECT city FROM patients GROUP BY city HAVING COUNT(*) > {x}",
         "SELECT DISTINCT COUNT(*) FROM patients GROUP BY city"),
        ("date_text", "How many appointments were there in {month}?",
         "SELECT COUNT(*) FROM appointments WHERE date LIKE '{x}-%'", "SELECT DISTINCT substr(date, 1, 7) FROM appointments"),
        ("null", "List the names of the patients with no insurance on record.",
         "SELECT name FROM patients WHERE insurance IS NULL", None),
        ("synonym", "What is the field of medicine of doctor {x}?", "SELECT specialty FROM doctors WHERE name = {q}",
         "SELECT name FROM doctors"),
        ("synonym", "How many years has doctor {x} practised?", "SELECT years_experience FROM doctors WHERE name = {q}",
         "SELECT name FROM doctors"),
        ("literal_case", "List the ids of the {X} appointments.", "SELECT id FROM appointments WHERE status = {q}",
         "SELECT DISTINCT status FROM appointments"),
        ("literal_case", "List the names of the doctors working in {X}.", "SELECT name FROM doctors WHERE specialty = {q}",
         "SELECT DISTINCT specialty FROM doctors"),
    ],
    "shop": [
        ("join3", "List the names of the products ordered by {x}.",
         "SELECT DISTINCT p.name FROM orders AS o JOIN customers AS c ON o.customer_id = c.id JOIN order_items AS i "
         "ON i.order_id = o.id JOIN products AS p ON i.product_id = p.id WHERE c.name = {q}", "SELECT name FROM customers"),
        ("join3", "What is the total quantity of items ordered by customers from {x}?",
         "SELECT SUM(i.quantity) FROM order_items AS i JOIN orders AS o ON i.order_id = o.id JOIN customers AS c "
         "ON o.customer_id = c.id WHERE c.city = {q}", "SELECT DISTINCT city FROM customers"),
        ("ambiguous", "List the names of the customers who ordered the product '{x}'.",
         "SELECT DISTINCT c.name FROM orders AS o JOIN customers AS c ON o.customer_id = c.id JOIN order_items AS i "
         "ON i.order_id = o.id JOIN products AS p ON i.product_id = p.id WHERE p.name = {q}", "SELECT name FROM products"),
        ("having", "Which customers placed more than {x} orders? Give their names.",
         "SELECT c.name FROM orders AS o JOIN customers AS c ON o.customer_id = c.id GROUP BY c.id HAVING COUNT(*) > {x}",
         "SELECT DISTINCT COUNT(*) FROM orders GROUP BY customer_id"),
        ("having", "Which products were ordered in a total quantity above {x}? Give their names.",
         "SELECT p.name FROM order_items AS i JOIN products AS p ON i.product_id = p.id GROUP BY p.id "
         "HAVING SUM(i.quantity) > {x}", "SELECT DISTINCT SUM(quantity) FROM order_items GROUP BY product_id"),
        ("date_text", "How many orders were placed in {month}?", "SELECT COUNT(*) FROM orders WHERE order_date LIKE '{x}-%'",
         "SELECT DISTINCT substr(order_date, 1, 7) FROM orders"),
        ("null", "List the ids of the orders that have not shipped yet.",
         "SELECT id FROM orders WHERE shipped_date IS NULL", None),
        ("synonym", "How much does the product '{x}' cost?", "SELECT price FROM products WHERE name = {q}",
         "SELECT name FROM products"),
        ("synonym", "In which year did the customer {x} register?", "SELECT signup_year FROM customers WHERE name = {q}",
         "SELECT name FROM customers"),
        ("literal_case", "List the names of the {X} products.", "SELECT name FROM products WHERE category = {q}",
         "SELECT DISTINCT category FROM products"),
        ("literal_case", "List the names of the customers from {X}.", "SELECT name FROM customers WHERE city = {q}",
         "SELECT DISTINCT city FROM customers"),
    ],
    "airline": [
        ("join3", "List the names of the passengers booked on flights departing from {x}.",
         "SELECT DISTINCT p.name FROM bookings AS b JOIN flights AS f ON b.flight_id = f.id JOIN passengers AS p "
         "ON b.passenger_id = p.id JOIN airports AS a ON f.origin = a.code WHERE a.city = {q}",
         "SELECT DISTINCT city FROM airports"),
        ("join3", "How many bookings are on flights to {x}?",
         "SELECT COUNT(*) FROM bookings AS b JOIN flights AS f ON b.flight_id = f.id JOIN airports AS a "
         "ON f.destination = a.code WHERE a.city = {q}", "SELECT DISTINCT city FROM airports"),
        ("ambiguous", "List the numbers of the flights booked by {x}.",
         "SELECT f.number FROM bookings AS b JOIN flights AS f ON b.flight_id = f.id JOIN passengers AS p "
         "ON b.passenger_id = p.id WHERE p.name = {q}", "SELECT name FROM passengers"),
        ("having", "Which passengers have more than {x} bookings? Give their names.",
         "SELECT p.name FROM bookings AS b JOIN passengers AS p ON b.passenger_id = p.id GROUP BY p.id "
         "HAVING COUNT(*) > {x}", "SELECT DISTINCT COUNT(*) FROM bookings GROUP BY passenger_id"),
        ("having", "Which aircraft types fly more than {x} flights?",
         "SELECT aircraft FROM flights GROUP BY aircraft HAVING COUNT(*) > {x}",
         "SELECT DISTINCT COUNT(*) FROM flights GROUP BY aircraft"),
        ("date_text", "How many flights depart in {month}?",
         "SELECT COUNT(*) FROM flights WHERE departure_date LIKE '{x}-%'",
         "SELECT DISTINCT substr(departure_date, 1, 7) FROM flights"),
        ("null", "List the numbers of the flights with no gate assigned.", "SELECT number FROM flights WHERE gate IS NULL",
         None),
        ("synonym", "How long is flight {x}, in minutes?", "SELECT duration_min FROM flights WHERE number = {q}",
         "SELECT number FROM flights"),
        ("synonym", "Which country is the passenger {x} from?", "SELECT nationality FROM passengers WHERE name = {q}",
         "SELECT name FROM passengers"),
        ("literal_case", "List the ids of the bookings in {X} class.", "SELECT id FROM bookings WHERE seat_class = {q}",
         "SELECT DISTINCT seat_class FROM bookings"),
        ("literal_case", "List the codes of the airports in {X}.", "SELECT code FROM airports WHERE country = {q}",
         "SELECT DISTINCT country FROM airports"),
    ],
    "school": [
        ("join3", "List the names of the students taught by {x}.",
         "SELECT DISTINCT s.name FROM enrollments AS e JOIN courses AS c ON e.course_id = c.id JOIN teachers AS t "
         "ON c.teacher_id = t.id JOIN students AS s ON e.student_id = s.id WHERE t.name = {q}", "SELECT name FROM teachers"),
        ("join3", "What is the average score in the courses taught by teachers of the {x} department?",
         "SELECT AVG(e.score) FROM enrollments AS e JOIN courses AS c ON e.course_id = c.id JOIN teachers AS t "
         "ON c.teacher_id = t.id WHERE t.department = {q}", "SELECT DISTINCT department FROM teachers"),
        ("ambiguous", "List the titles of the courses taken by {x}.",
         "SELECT c.title FROM enrollments AS e JOIN courses AS c ON e.course_id = c.id JOIN students AS s "
         "ON e.student_id = s.id WHERE s.name = {q}", "SELECT name FROM students"),
        ("having", "Which courses have more than {x} students enrolled? Give their titles.",
         "SELECT c.title FROM enrollments AS e JOIN courses AS c ON e.course_id = c.id GROUP BY c.id "
         "HAVING COUNT(*) > {x}", "SELECT DISTINCT COUNT(*) FROM enrollments GROUP BY course_id"),
        ("having", "Which students have an average score above {x}? Give their names.",
         "SELECT s.name FROM enrollments AS e JOIN students AS s ON e.student_id = s.id GROUP BY s.id "
         "HAVING AVG(e.score) > {x}", "SELECT DISTINCT CAST(AVG(score) AS INTEGER) FROM enrollments GROUP BY student_id"),
        ("null", "List the names of the students with no email address on record.",
         "SELECT name FROM students WHERE email IS NULL", None),
        ("synonym", "In what year was the teacher {x} hired?", "SELECT hired_year FROM teachers WHERE name = {q}",
         "SELECT name FROM teachers"),
        ("synonym", "What school year is the student {x} in?", "SELECT grade_level FROM students WHERE name = {q}",
         "SELECT name FROM students"),
        ("literal_case", "List the names of the teachers in the {X} department.",
         "SELECT name FROM teachers WHERE department = {q}", "SELECT DISTINCT department FROM teachers"),
        ("literal_case", "List the names of the students living in {X}.", "SELECT name FROM students WHERE city = {q}",
         "SELECT DISTINCT city FROM students"),
    ],
}


def other_case(value: str) -> str:
    """How prose might write a stored value: 'mystery' as 'Mystery', 'Lisbon' as 'lisbon'."""
    return value.title() if value.islower() else value.lower()


def month(year_month: str) -> str:
    """'2023-03' as 'March 2023'."""
    year, number = year_month.split("-")
    return f"{calendar.month_name[int(number)]} {year}"


def candidates(name: str, connection: sqlite3.Connection, rng: random.Random,
               literal: Callable[[object], str]) -> list[tuple[str, str, str]]:
    """(kind, question, gold SQL) from the database's templates, up to `VALUES_PER_TEMPLATE` values each."""
    out = []
    for kind, question, gold, values in TEMPLATES[name]:
        if values is None:
            out.append((kind, question, gold))
            continue
        found = sorted(row[0] for row in connection.execute(values).fetchall() if row[0] is not None)
        for x in rng.sample(found, min(VALUES_PER_TEMPLATE, len(found))):
            text = str(x)
            fields = {"x": text, "X": other_case(text), "month": month(text) if kind == "date_text" else text}
            out.append((kind, question.format(**fields), gold.format(x=text, q=literal(x))))
    return out


# ----------------------------------------------------------------------------- episodes that start from a mistake

_LITERAL = re.compile(r"(=\s*)'((?:[^']|'')*)'")
_MONTH_PATTERN = re.compile(r"LIKE '(\d{4}-\d{2})-%'")
_HAVING = re.compile(r"\s+GROUP BY (\S+) HAVING (.+)$", re.S)
_QUALIFIED = re.compile(r"\b\w+\.(\w+)(\s*=)")
_TWO_TABLES = re.compile(r"^SELECT (.+?) FROM (\w+(?: AS \w+)?) JOIN (\w+(?: AS \w+)?) ON (.+?) WHERE (.+)$", re.S)
_QUALIFIED_BY = re.compile(r"\b(\w+)\.(\w+)")
MIX = {"fixes": 100, "joins": 80, "right": 60}
"""How many chats of each kind `demonstration_mix` draws."""


def mistakes(gold: str) -> list[str]:
    """First queries a model plausibly writes for `gold`'s question, each one trap of `KINDS` sprung: a literal cased
    as prose would case it, `= NULL`, a month asked by name in a text date, an aggregate in WHERE, and a compared
    column left unqualified in a join. Which of them fail is the database's to say (`first_mistake`)."""
    out = []
    if match := _LITERAL.search(gold):
        value = match.group(2)
        if other_case(value) != value:
            out.append(gold[: match.start()] + f"{match.group(1)}'{other_case(value)}'" + gold[match.end():])
    if " IS NULL" in gold or " IS NOT NULL" in gold:
        out.append(gold.replace(" IS NOT NULL", " != NULL").replace(" IS NULL", " = NULL"))
    if match := _MONTH_PATTERN.search(gold):
        out.append(gold[: match.start()] + f"LIKE '%{month(match.group(1))}%'" + gold[match.end():])
    if (match := _HAVING.search(gold)) and " WHERE " not in gold:
        out.append(gold[: match.start()] + f" WHERE {match.group(2)} GROUP BY {match.group(1)}")
    if " JOIN " in gold and (match := _QUALIFIED.search(gold.split(" WHERE ", 1)[-1])):
        where = gold.index(" WHERE ") if " WHERE " in gold else len(gold)
        out.append(gold[:where] + _QUALIFIED.sub(r"\1\2", gold[where:], count=1))
    return out


def first_mistake(task: dict[str, Any], rng: random.Random) -> str | None:
    """One of `mistakes(task["gold"])` or `join_mistakes` that fails on the task's database (an error or nothing
    returned), chosen by `rng`; None when none does."""
    failing = failing_mistakes([task], lambda gold: mistakes(gold) + join_mistakes(gold))
    return rng.choice(failing)[1] if failing else None


# ----------------------------------------------------------------------------- fixes shown before RL


def join_mistakes(gold: str) -> list[str]:
    """For a two-table join `gold`, the first queries a model writes when it has not seen where a value is kept: the
    JOIN written after the WHERE (a syntax error); the join left out, the other table's column compared as if the
    first table held it (no such column); a column taken from the other table's alias (`p.title` for `c.title`: no
    such column; the 0.5B model's most frequent error in its own first queries). What `demonstration_mix` shows
    fixed."""
    match = _TWO_TABLES.match(gold)
    if match is None or gold.count(" JOIN ") != 1:
        return []
    select, first, second, on, where = match.groups()
    unqualified = functools.partial(_QUALIFIED_BY.sub, r"\2")
    out = [f"SELECT {select} FROM {first} WHERE {where} JOIN {second} ON {on}",
           f"SELECT {unqualified(select)} FROM {first.split()[0]} WHERE {unqualified(where)}"]
    aliases = [table.split()[-1] for table in (first, second)]
    if (column := _QUALIFIED_BY.search(select) or _QUALIFIED_BY.search(where)) and column.group(1) in aliases:
        other = aliases[1 - aliases.index(column.group(1))]
        out.append(gold.replace(column.group(0), f"{other}.{column.group(2)}", 1))
    return out


def demonstration(task: dict[str, Any], mistake: str | None) -> dict[str, Any]:
    """The chat the agent sends when it answers `task` right, in OpenAI's fine-tuning format: its system prompt and the
    question; `mistake` run first (weight 0: context, not taught) with the tool's real answer to it, when given; then
    the gold query run, its rows, and the final block. What a warm start shows the model before RL
    (`--sql-warm-start`)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": agent.INSTRUCTIONS.format(schema=db.schema(task["db"]))},
        {"role": "user", "content": task["question"]},
    ]
    with closing(db.connect_readonly(task["db"])) as connection:
        ran: list[tuple[str, bool]] = []
        if mistake is not None:
            failed = agent.tool_answer(connection, task["db"], mistake, ran)
            messages += [{**_call("call_mistake", mistake), "weight": 0},
                         {"role": "tool", "tool_call_id": "call_mistake", "content": failed}]
        rows = agent.tool_answer(connection, task["db"], task["gold"], ran)
    messages += [
        _call("call_fix", task["gold"]),
        {"role": "tool", "tool_call_id": "call_fix", "content": rows},
        {"role": "assistant", "content": f"```sql\n{task['gold']}\n```"},
    ]
    return {"messages": messages, "tools": agent.tool_definitions()}


def failing_mistakes(tasks: list[dict[str, Any]],
                     written: Callable[[str], list[str]]) -> list[tuple[dict[str, Any], str]]:
    """(task, mistake) for each of `written(gold)` that fails on the task's database (an error or nothing returned)."""
    return [(task, sql) for task in tasks for sql in written(task["gold"]) if db.query_fails(task["db"], sql)]


def demonstration_mix(tasks: list[dict[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """The warm start's chats: 100 fixes of the five kinds (`mistakes`), 80 of the three join kinds (`join_mistakes`)
    and 60 chats that start right (the gold query first), drawn by `seed`. The fixes alone made the first query fail
    more often (docs/frameworks.md); the chats that start right keep it."""
    rng = random.Random(seed)
    fixes, joins = failing_mistakes(tasks, mistakes), failing_mistakes(tasks, join_mistakes)
    right = rng.sample(tasks, min(MIX["right"], len(tasks)))
    rng.shuffle(fixes)
    rng.shuffle(joins)
    drawn = fixes[: MIX["fixes"]] + joins[: MIX["joins"]] + [(task, None) for task in right]
    return [demonstration(task, sql) for task, sql in drawn]


def _call(call_id: str, sql: str) -> dict[str, Any]:
    function = {"name": "run_sql", "arguments": json.dumps({"query": sql})}
    return {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": function}]}
