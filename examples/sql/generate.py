"""Write the SQL example's databases (`databases/*.sql`) and questions (`questions.json`), deterministically.

    python -m examples.sql.generate      # rewrites the committed files; a test checks they are current

Five small databases of different domains, rows drawn from a seeded random generator, and
natural-language questions made from templates over each schema, every gold query executed
here on its database: a question whose answer is empty, or whose ORDER BY ... LIMIT answer
depends on how ties are broken, is dropped. Beside them, every database has the question kinds of
`recovery.py`, whose first query plausibly fails: those are all kept. The split is by database, as in Spider: the
held-out databases' schemas never appear in training.
"""

from __future__ import annotations

import datetime
import json
import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from examples.sql import recovery

HERE = Path(__file__).parent
SEED = 21
QUESTIONS_PER_DATABASE = 70
TRAIN = ("library", "clinic", "shop")
HELD_OUT = ("airline", "school")

FIRST = ["Ana", "Ben", "Chloe", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Liam", "Maya",
         "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wei", "Yara", "Zoe"]
LAST = ["Silva", "Okafor", "Novak", "Tanaka", "Garcia", "Muller", "Rossi", "Kowalski", "Haddad", "Larsen", "Moreau",
        "Ivanova", "Chen", "Patel", "Smith", "Dubois"]
CITIES = ["Lisbon", "Oslo", "Lyon", "Porto", "Krakow", "Osaka", "Dublin", "Austin"]


@dataclass
class Table:
    """A table and how questions speak of it: its noun, the column that names a row, the columns to ask about."""

    name: str
    columns: list[tuple[str, str]]  # (column, SQL type)
    rows: list[tuple]
    noun: str  # plural, e.g. "books"
    name_column: str | None = None
    categories: dict[str, str] = field(default_factory=dict)  # column -> how a question says it
    numbers: dict[str, str] = field(default_factory=dict)


@dataclass
class Relation:
    """A foreign key and the phrasing of its questions ({x}: a parent's name, {v}: a parent's category value)."""

    child: str
    key: str
    parent: str
    count: str  # "How many books were written by {x}?"
    listing: str  # "List the titles of the books written by {x}."
    listed: str  # the child's column that listing asks for, e.g. "title"
    most: str  # "Which author wrote the most books? Give the name."
    by_category: tuple[str, str] | None = None  # (parent column, "How many books were written by authors from {v}?")


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def unique_people(rng: random.Random, n: int) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        if (name := person(rng)) not in names:
            names.append(name)
    return names


def date(rng: random.Random, year: int) -> str:
    return f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def later(day: str, rng: random.Random) -> str:
    """A date 1 to 40 days after `day` (both ISO text, as the databases store dates)."""
    return (datetime.date.fromisoformat(day) + datetime.timedelta(days=rng.randint(1, 40))).isoformat()


def library(rng: random.Random) -> tuple[list[Table], list[Relation]]:
    countries = ["Portugal", "Nigeria", "Japan", "France", "Canada"]
    authors = [(i, name, rng.choice(countries), rng.randint(1920, 1990)) for i, name in enumerate(unique_people(rng, 14), 1)]
    words = ["River", "Night", "Garden", "Letters", "Winter", "Machine", "Island", "Silence", "Empire", "Harbor",
             "Mirror", "Orchard", "Signal", "Forest", "Lantern"]
    titles = sorted({f"The {a} of {b}" for a in words for b in words if a != b})
    genres = ["novel", "poetry", "history", "science", "mystery"]
    books = [(i, title, rng.randint(1, 14), rng.choice(genres), rng.randint(1950, 2023), rng.randint(90, 900))
             for i, title in enumerate(rng.sample(titles, 40), 1)]
    members = [(i, name, rng.choice(CITIES), rng.randint(2010, 2024)) for i, name in enumerate(unique_people(rng, 20), 1)]
    loans = []
    for i in range(1, 61):
        loaned = date(rng, rng.randint(2022, 2024))
        returned = rng.random() < 0.6  # the rest are still out: return_date NULL
        loans.append((i, rng.randint(1, 40), rng.randint(1, 20), loaned, later(loaned, rng) if returned else None))
    return [
        Table("authors", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("country", "TEXT"), ("birth_year", "INTEGER")],
              authors, "authors", "name", {"country": "country"}, {"birth_year": "birth year"}),
        Table("books", [("id", "INTEGER PRIMARY KEY"), ("title", "TEXT"), ("author_id", "INTEGER REFERENCES authors(id)"),
                        ("genre", "TEXT"), ("year", "INTEGER"), ("pages", "INTEGER")],
              books, "books", "title", {"genre": "genre"}, {"year": "publication year", "pages": "number of pages"}),
        Table("members", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("city", "TEXT"), ("joined_year", "INTEGER")],
              members, "members", "name", {"city": "city"}, {"joined_year": "year of joining"}),
        Table("loans", [("id", "INTEGER PRIMARY KEY"), ("book_id", "INTEGER REFERENCES books(id)"),
                        ("member_id", "INTEGER REFERENCES members(id)"), ("loan_date", "TEXT"), ("return_date", "TEXT")],
              loans, "loans"),
    ], [
        Relation("books", "author_id", "authors", "How many books were written by {x}?",
                 "List the titles of the books written by {x}.", "title", "Which author wrote the most books? Give the name.",
                 ("country", "How many books were written by authors from {v}?")),
        Relation("loans", "member_id", "members", "How many loans has {x} made?",
                 "List the ids of the loans made by {x}.", "id", "Which member made the most loans? Give the name.",
                 ("city", "How many loans were made by members living in {v}?")),
        Relation("loans", "book_id", "books", "How many times was the book '{x}' borrowed?",
                 "List the ids of the loans of the book '{x}'.", "id", "Which book was borrowed the most times? Give its title.",
                 ("genre", "How many loans were of {v} books?")),
    ]


def clinic(rng: random.Random) -> tuple[list[Table], list[Relation]]:
    specialties = ["cardiology", "dermatology", "pediatrics", "neurology", "orthopedics"]
    doctors = [(i, name, rng.choice(specialties), rng.randint(1, 35)) for i, name in enumerate(unique_people(rng, 12), 1)]
    insurers = ["Allianz", "AXA", "Medis", None]  # None: no insurance on record
    patients = [(i, name, rng.randint(1940, 2020), rng.choice(CITIES), rng.choice(insurers))
                for i, name in enumerate(unique_people(rng, 30), 1)]
    statuses = ["completed", "cancelled", "scheduled"]
    appointments = [(i, rng.randint(1, 12), rng.randint(1, 30), date(rng, rng.randint(2023, 2025)),
                     rng.choice([40, 60, 80, 120, 150, 200]), rng.choice(statuses)) for i in range(1, 81)]
    return [
        Table("doctors", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("specialty", "TEXT"),
                          ("years_experience", "INTEGER")],
              doctors, "doctors", "name", {"specialty": "specialty"}, {"years_experience": "years of experience"}),
        Table("patients", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("birth_year", "INTEGER"), ("city", "TEXT"),
                           ("insurance", "TEXT")],
              patients, "patients", "name", {"city": "city"}, {"birth_year": "birth year"}),
        Table("appointments", [("id", "INTEGER PRIMARY KEY"), ("doctor_id", "INTEGER REFERENCES doctors(id)"),
                               ("patient_id", "INTEGER REFERENCES patients(id)"), ("date", "TEXT"), ("fee", "INTEGER"),
                               ("status", "TEXT")],
              appointments, "appointments", None, {"status": "status"}, {"fee": "fee"}),
    ], [
        Relation("appointments", "doctor_id", "doctors", "How many appointments does doctor {x} have?",
                 "List the dates of the appointments with doctor {x}.", "date",
                 "Which doctor has the most appointments? Give the name.",
                 ("specialty", "How many appointments are with doctors of {v}?")),
        Relation("appointments", "patient_id", "patients", "How many appointments does patient {x} have?",
                 "List the dates of the appointments of patient {x}.", "date",
                 "Which patient has the most appointments? Give the name.",
                 ("city", "How many appointments are for patients living in {v}?")),
    ]


def shop(rng: random.Random) -> tuple[list[Table], list[Relation]]:
    customers = [(i, name, rng.choice(CITIES), rng.randint(2015, 2024)) for i, name in enumerate(unique_people(rng, 25), 1)]
    catalog = {"kitchen": ["Kettle", "Toaster", "Blender", "Pan", "Knife Set"],
               "garden": ["Hose", "Rake", "Shovel", "Planter"],
               "office": ["Desk Lamp", "Stapler", "Notebook", "Office Chair", "Monitor Stand"],
               "toys": ["Puzzle", "Kite", "Robot Kit", "Board Game"]}
    products = [(i, name, category, round(rng.uniform(3, 250), 2))
                for i, (category, name) in enumerate(((c, n) for c, names in catalog.items() for n in names), 1)]
    orders = []
    for i in range(1, 51):
        placed = date(rng, rng.randint(2023, 2025))
        orders.append((i, rng.randint(1, 25), placed, later(placed, rng) if rng.random() < 0.7 else None))
    items = sorted({(rng.randint(1, 50), rng.randint(1, len(products))): rng.randint(1, 5) for _ in range(110)}.items())
    order_items = [(order, product, quantity) for (order, product), quantity in items]
    return [
        Table("customers", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("city", "TEXT"), ("signup_year", "INTEGER")],
              customers, "customers", "name", {"city": "city"}, {"signup_year": "sign-up year"}),
        Table("products", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("category", "TEXT"), ("price", "REAL")],
              products, "products", "name", {"category": "category"}, {"price": "price"}),
        Table("orders", [("id", "INTEGER PRIMARY KEY"), ("customer_id", "INTEGER REFERENCES customers(id)"),
                         ("order_date", "TEXT"), ("shipped_date", "TEXT")], orders, "orders"),
        Table("order_items", [("order_id", "INTEGER REFERENCES orders(id)"), ("product_id", "INTEGER REFERENCES products(id)"),
                              ("quantity", "INTEGER")], order_items, "order items", None, {}, {"quantity": "quantity"}),
    ], [
        Relation("orders", "customer_id", "customers", "How many orders has {x} placed?",
                 "List the ids of the orders placed by {x}.", "id", "Which customer placed the most orders? Give the name.",
                 ("city", "How many orders were placed by customers from {v}?")),
        Relation("order_items", "product_id", "products", "In how many order items does the product '{x}' appear?",
                 "List the ids of the orders that contain the product '{x}'.", "order_id",
                 "Which product appears in the most order items? Give its name.",
                 ("category", "How many order items are for products in the {v} category?")),
    ]


def airline(rng: random.Random) -> tuple[list[Table], list[Relation]]:
    airports = [("LIS", "Lisbon", "Portugal"), ("OSL", "Oslo", "Norway"), ("LYS", "Lyon", "France"),
                ("OPO", "Porto", "Portugal"), ("KRK", "Krakow", "Poland"), ("KIX", "Osaka", "Japan"),
                ("DUB", "Dublin", "Ireland"), ("AUS", "Austin", "USA"), ("CDG", "Paris", "France")]
    aircraft = ["A320", "A321", "B737", "B787", "E190"]
    flights = []
    for i in range(1, 46):
        origin, destination = rng.sample([a[0] for a in airports], 2)
        flights.append((i, f"AG{100 + i}", origin, destination, date(rng, 2025), rng.randint(45, 720),
                        rng.randint(39, 900), rng.choice(aircraft), rng.choice(["A1", "B4", "C7", "D2", None])))
    passengers = [(i, name, rng.choice(["Portugal", "Norway", "France", "Japan", "USA"]))
                  for i, name in enumerate(unique_people(rng, 30), 1)]
    bookings = [(i, rng.randint(1, 45), rng.randint(1, 30), rng.choice(["economy", "economy", "business", "first"]))
                for i in range(1, 91)]
    return [
        Table("airports", [("code", "TEXT PRIMARY KEY"), ("city", "TEXT"), ("country", "TEXT")],
              airports, "airports", "city", {"country": "country"}),
        Table("flights", [("id", "INTEGER PRIMARY KEY"), ("number", "TEXT"), ("origin", "TEXT REFERENCES airports(code)"),
                          ("destination", "TEXT REFERENCES airports(code)"), ("departure_date", "TEXT"),
                          ("duration_min", "INTEGER"), ("price", "INTEGER"), ("aircraft", "TEXT"), ("gate", "TEXT")],
              flights, "flights", "number", {"aircraft": "aircraft", "origin": "origin airport code"},
              {"duration_min": "duration in minutes", "price": "price"}),
        Table("passengers", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("nationality", "TEXT")],
              passengers, "passengers", "name", {"nationality": "nationality"}),
        Table("bookings", [("id", "INTEGER PRIMARY KEY"), ("flight_id", "INTEGER REFERENCES flights(id)"),
                           ("passenger_id", "INTEGER REFERENCES passengers(id)"), ("seat_class", "TEXT")],
              bookings, "bookings", None, {"seat_class": "seat class"}),
    ], [
        Relation("bookings", "passenger_id", "passengers", "How many bookings does {x} have?",
                 "List the ids of the bookings made by {x}.", "id", "Which passenger has the most bookings? Give the name.",
                 ("nationality", "How many bookings were made by passengers of nationality {v}?")),
        Relation("bookings", "flight_id", "flights", "How many bookings are there on flight {x}?",
                 "List the ids of the bookings on flight {x}.", "id", "Which flight has the most bookings? Give its number.",
                 ("aircraft", "How many bookings are on flights flown by a {v}?")),
        Relation("flights", "origin", "airports", "How many flights depart from {x}?",
                 "List the numbers of the flights departing from {x}.", "number",
                 "Which city's airport has the most departing flights? Give the city.",
                 ("country", "How many flights depart from airports in {v}?")),
    ]


def school(rng: random.Random) -> tuple[list[Table], list[Relation]]:
    departments = ["mathematics", "physics", "history", "languages", "art"]
    teachers = [(i, name, rng.choice(departments), rng.randint(2000, 2023))
                for i, name in enumerate(unique_people(rng, 10), 1)]
    subjects = ["Algebra", "Geometry", "Mechanics", "Optics", "Ancient Rome", "Modern Europe", "French", "Spanish",
                "Drawing", "Sculpture", "Statistics", "Astronomy"]
    courses = [(i, title, rng.randint(1, 10), rng.choice([2, 3, 4, 6])) for i, title in enumerate(subjects, 1)]
    students = [(i, name, rng.randint(9, 12), rng.choice(CITIES),
                 name.lower().replace(" ", ".") + "@school.example" if rng.random() < 0.7 else None)
                for i, name in enumerate(unique_people(rng, 35), 1)]
    pairs = sorted({(rng.randint(1, 35), rng.randint(1, 12)) for _ in range(120)})
    enrollments = [(student, course, rng.randint(40, 100)) for student, course in pairs]
    return [
        Table("teachers", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("department", "TEXT"), ("hired_year", "INTEGER")],
              teachers, "teachers", "name", {"department": "department"}, {"hired_year": "year of hiring"}),
        Table("courses", [("id", "INTEGER PRIMARY KEY"), ("title", "TEXT"), ("teacher_id", "INTEGER REFERENCES teachers(id)"),
                          ("credits", "INTEGER")], courses, "courses", "title", {}, {"credits": "credits"}),
        Table("students", [("id", "INTEGER PRIMARY KEY"), ("name", "TEXT"), ("grade_level", "INTEGER"), ("city", "TEXT"),
                           ("email", "TEXT")],
              students, "students", "name", {"city": "city"}, {"grade_level": "grade level"}),
        Table("enrollments", [("student_id", "INTEGER REFERENCES students(id)"),
                              ("course_id", "INTEGER REFERENCES courses(id)"), ("score", "INTEGER")],
              enrollments, "enrollments", None, {}, {"score": "score"}),
    ], [
        Relation("courses", "teacher_id", "teachers", "How many courses does {x} teach?",
                 "List the titles of the courses taught by {x}.", "title", "Which teacher teaches the most courses? Give the name.",
                 ("department", "How many courses are taught by teachers of the {v} department?")),
        Relation("enrollments", "student_id", "students", "In how many courses is {x} enrolled?",
                 "List the ids of the courses {x} is enrolled in.", "course_id",
                 "Which student is enrolled in the most courses? Give the name.",
                 ("city", "How many enrollments are there of students living in {v}?")),
        Relation("enrollments", "course_id", "courses", "How many students are enrolled in {x}?",
                 "List the ids of the students enrolled in {x}.", "student_id", "Which course has the most students? Give its title.",
                 ("credits", "How many enrollments are in courses worth {v} credits?")),
    ]


DOMAINS = {"library": library, "clinic": clinic, "shop": shop, "airline": airline, "school": school}


def literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def script(tables: list[Table]) -> str:
    lines = []
    for table in tables:
        lines.append(f"CREATE TABLE {table.name} (\n  " + ",\n  ".join(f"{c} {t}" for c, t in table.columns) + "\n);")
    for table in tables:
        names = ", ".join(c for c, _ in table.columns)
        lines += [f"INSERT INTO {table.name} ({names}) VALUES ({', '.join(map(literal, row))});" for row in table.rows]
    return "\n".join(lines) + "\n"


def candidates(tables: list[Table], relations: list[Relation], rng: random.Random) -> list[tuple[str, str, str]]:
    """(kind, question, gold SQL) from every template, before execution checks and sampling."""
    out: list[tuple[str, str, str]] = []
    by_name = {t.name: t for t in tables}
    for t in tables:
        columns = [c for c, _ in t.columns]
        out.append(("count", f"How many {t.noun} are there?", f"SELECT COUNT(*) FROM {t.name}"))
        for column, said in t.categories.items():
            values = sorted({row[columns.index(column)] for row in t.rows})
            for value in rng.sample(values, min(2, len(values))):
                out.append(("count_where", f"How many {t.noun} have {said} {value}?",
                            f"SELECT COUNT(*) FROM {t.name} WHERE {column} = {literal(value)}"))
                if t.name_column:
                    out.append(("list_where", f"List the {t.name_column}s of the {t.noun} whose {said} is {value}.",
                                f"SELECT {t.name_column} FROM {t.name} WHERE {column} = {literal(value)}"))
            out.append(("group_count", f"For each {said}, how many {t.noun} are there?",
                        f"SELECT {column}, COUNT(*) FROM {t.name} GROUP BY {column}"))
        for column, said in t.numbers.items():
            values = sorted(row[columns.index(column)] for row in t.rows)
            functions = [("AVG", "average"), ("MAX", "highest"), ("MIN", "lowest")]
            if "year" not in said:  # a total of years means nothing
                functions.append(("SUM", "total"))
            for fn, word in functions:
                out.append(("aggregate", f"What is the {word} {said} of all {t.noun}?", f"SELECT {fn}({column}) FROM {t.name}"))
            threshold = values[len(values) // 2]
            if t.name_column:
                out.append(("filter", f"Which {t.noun} have a {said} greater than {threshold}? Give their {t.name_column}s.",
                            f"SELECT {t.name_column} FROM {t.name} WHERE {column} > {literal(threshold)}"))
                for k in (3, 5):
                    out.append(("top_k", f"List the {t.name_column}s of the {k} {t.noun} with the highest {said}, "
                                         f"from highest to lowest.",
                                f"SELECT {t.name_column} FROM {t.name} ORDER BY {column} DESC LIMIT {k}"))
                out.append(("argmin", f"What is the {t.name_column} of the {t.noun.rstrip('s')} with the lowest {said}?",
                            f"SELECT {t.name_column} FROM {t.name} ORDER BY {column} ASC LIMIT 1"))
            else:
                out.append(("count_filter", f"How many {t.noun} have a {said} greater than {threshold}?",
                            f"SELECT COUNT(*) FROM {t.name} WHERE {column} > {literal(threshold)}"))
            for column_c, said_c in t.categories.items():
                out.append(("group_aggregate", f"What is the average {said} of {t.noun} for each {said_c}?",
                            f"SELECT {column_c}, AVG({column}) FROM {t.name} GROUP BY {column_c}"))
    for r in relations:
        parent, child = by_name[r.parent], by_name[r.child]
        columns = [c for c, _ in parent.columns]
        assert parent.name_column is not None
        key = columns[0]
        name_index = columns.index(parent.name_column)
        for row in rng.sample(parent.rows, 3):
            x = row[name_index]
            join = f"FROM {child.name} AS c JOIN {parent.name} AS p ON c.{r.key} = p.{key} WHERE p.{parent.name_column} = {literal(x)}"
            out.append(("join_count", r.count.format(x=x), f"SELECT COUNT(*) {join}"))
            out.append(("join_list", r.listing.format(x=x), f"SELECT c.{r.listed} {join}"))
        out.append(("join_most", r.most,
                    f"SELECT p.{parent.name_column} FROM {child.name} AS c JOIN {parent.name} AS p ON c.{r.key} = p.{key} "
                    f"GROUP BY p.{key} ORDER BY COUNT(*) DESC LIMIT 1"))
        if r.by_category:
            column, phrase = r.by_category
            values = sorted({row[columns.index(column)] for row in parent.rows})
            for value in rng.sample(values, min(3, len(values))):
                out.append(("join_filter", phrase.format(v=value),
                            f"SELECT COUNT(*) FROM {child.name} AS c JOIN {parent.name} AS p ON c.{r.key} = p.{key} "
                            f"WHERE p.{column} = {literal(value)}"))
    return out


def unambiguous(connection: sqlite3.Connection, sql: str) -> bool:
    """The gold answer is non-empty and, for ORDER BY ... LIMIT k, not decided by a tie at the cut."""
    rows = connection.execute(sql).fetchall()
    if not rows or rows == [(0,)] or rows == [(None,)]:
        return False
    if " LIMIT " in sql:
        head, limit = sql.rsplit(" LIMIT ", 1)
        order = head.split(" ORDER BY ")[1].split()[0]
        keyed = head.replace("SELECT ", f"SELECT {order}, ", 1) if "COUNT(*)" not in order else head.replace(
            "SELECT ", "SELECT COUNT(*), ", 1)
        keys = [row[0] for row in connection.execute(keyed).fetchall()]
        k = int(limit)
        if len(keys) > k and keys[k] == keys[k - 1]:
            return False
        if len(set(keys[: k + 1])) != len(keys[: k + 1]):  # ties inside the top k make the order ambiguous
            return False
    return True


def build() -> tuple[dict[str, str], list[dict]]:
    rng = random.Random(SEED)
    scripts: dict[str, str] = {}
    questions: list[dict] = []
    for name, make in DOMAINS.items():
        tables, relations = make(rng)
        scripts[name] = script(tables)
        connection = sqlite3.connect(":memory:")
        connection.executescript(scripts[name])
        kept = [(kind, q, sql) for kind, q, sql in candidates(tables, relations, rng) if unambiguous(connection, sql)]
        kept = list(dict.fromkeys(kept))
        chosen = [kept[i] for i in sorted(rng.sample(range(len(kept)), min(QUESTIONS_PER_DATABASE, len(kept))))]
        traps = recovery.candidates(name, connection, rng, literal)  # every one kept: these are what training is for
        chosen += [t for t in dict.fromkeys(traps) if unambiguous(connection, t[2]) and (t[1], t[2]) not in
                   {(q, sql) for _, q, sql in chosen}]
        split = "train" if name in TRAIN else "held_out"
        for kind, question, sql in chosen:
            questions.append({"id": f"{name}-{len([q for q in questions if q['db'] == name]):03d}", "db": name,
                              "split": split, "kind": kind, "question": question, "gold": sql})
    return scripts, questions


def main() -> None:
    scripts, questions = build()
    (HERE / "databases").mkdir(exist_ok=True)
    for name, text in scripts.items():
        (HERE / "databases" / f"{name}.sql").write_text(text)
    (HERE / "questions.json").write_text(json.dumps(questions, indent=1) + "\n")
    for split in ("train", "held_out"):
        chosen = [q for q in questions if q["split"] == split]
        print(f"{split}: {len(chosen)} questions on {sorted({q['db'] for q in chosen})}")


if __name__ == "__main__":
    main()
