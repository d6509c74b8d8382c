"""The text-to-SQL example (`examples/sql/`): its data, its reward, its tool; fast, no model."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import agentgrad as ag
from agentgrad.algorithms.apo_text import check_rewrite
from agentgrad.serving import ServerThread
from examples.sql import agent, db, generate, hints, recovery, train


@pytest.fixture(autouse=True)
def databases_in(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTGRAD_SQL_DIR", str(tmp_path_factory.getbasetemp() / "sql"))


QUESTIONS = db.load_questions("train") + db.load_questions("held_out")  # the project's; real-world: test_sql_real_world


def test_the_committed_databases_and_questions_are_what_the_generator_writes() -> None:
    scripts, questions = generate.build()
    for name, text in scripts.items():
        assert (db.HERE / "databases" / f"{name}.sql").read_text() == text, "run python -m examples.sql.generate"
    assert json.loads((db.HERE / "questions.json").read_text()) == questions


def test_there_are_hundreds_of_questions_over_five_domains_split_by_database() -> None:
    train, held_out = db.load_questions("train"), db.load_questions("held_out")
    assert len(QUESTIONS) >= 300 and len(held_out) >= 100 and len(train) >= 150
    assert len(db.database_names()) >= 4
    train_dbs, held_out_dbs = {q["db"] for q in train}, {q["db"] for q in held_out}
    assert train_dbs and held_out_dbs and not train_dbs & held_out_dbs
    assert train_dbs | held_out_dbs == set(db.database_names())
    assert len({q["id"] for q in QUESTIONS}) == len(QUESTIONS)
    assert len({(q["db"], q["question"]) for q in QUESTIONS}) == len(QUESTIONS)


def test_every_gold_query_runs_on_its_database_and_returns_rows() -> None:
    for name in db.database_names():
        with closing(db.connect_readonly(name)) as connection:
            for q in (q for q in QUESTIONS if q["db"] == name):
                assert db.execute(connection, q["gold"]), q


def test_the_reward_scores_every_gold_query_1() -> None:
    assert all(db.execution_match(q["db"], q["gold"], q["gold"]) == 1.0 for q in QUESTIONS)


def test_the_reward_scores_a_wrong_a_broken_and_a_missing_query_0() -> None:
    count = next(q for q in QUESTIONS if q["kind"] == "count_where")
    assert db.execution_match(count["db"], "SELECT COUNT(*) + 1" + count["gold"][len("SELECT COUNT(*)"):], count["gold"]) == 0
    assert db.execution_match(count["db"], "SELEC COUNT(*) FROM nowhere", count["gold"]) == 0
    assert db.execution_match(count["db"], None, count["gold"]) == 0
    listing = next(q for q in QUESTIONS if q["kind"] == "list_where")
    assert db.execution_match(listing["db"], listing["gold"].replace("SELECT ", "SELECT id, ", 1), listing["gold"]) == 0


def test_the_reward_ignores_row_order_unless_the_gold_query_orders() -> None:
    listing = next(q for q in QUESTIONS if q["kind"] == "list_where")
    assert db.execution_match(listing["db"], listing["gold"] + " ORDER BY 1 DESC", listing["gold"]) == 1
    top = next(q for q in QUESTIONS if q["kind"] == "top_k")  # SELECT name FROM t ORDER BY c DESC LIMIT k
    name, rest = top["gold"][len("SELECT "):].split(" FROM ", 1)
    column = rest.split(" ORDER BY ")[1].split()[0]
    reversed_order = f"SELECT {name} FROM (SELECT {name}, {column} FROM {rest}) ORDER BY {column} ASC"
    assert db.execution_match(top["db"], reversed_order, top["gold"]) == 0
    assert db.execution_match(top["db"], reversed_order.replace(" ASC", " DESC"), top["gold"]) == 1


def test_the_reward_accepts_the_columns_in_another_order_and_numbers_as_floats() -> None:
    grouped = next(q for q in QUESTIONS if q["kind"] == "group_count")
    column, table = grouped["gold"].split()[1].rstrip(","), grouped["gold"].split("FROM ")[1].split()[0]
    swapped = f"SELECT COUNT(*), {column} FROM {table} GROUP BY {column}"
    assert db.execution_match(grouped["db"], swapped, grouped["gold"]) == 1
    count = next(q for q in QUESTIONS if q["kind"] == "count")
    assert db.execution_match(count["db"], count["gold"].replace("COUNT(*)", "COUNT(*) * 1.0"), count["gold"]) == 1


@pytest.mark.parametrize("statement", [
    "INSERT INTO books (id, title) VALUES (999, 'x')",
    "DELETE FROM books",
    "UPDATE books SET pages = 0",
    "DROP TABLE books",
    "CREATE TABLE t (x)",
    "PRAGMA query_only = OFF",
])
def test_the_tool_refuses_writes(statement: str) -> None:
    with closing(db.connect_readonly("library")) as connection:
        with pytest.raises(sqlite3.Error):
            db.execute(connection, statement)
        assert db.execute(connection, "SELECT COUNT(*) FROM books") == [(40,)]


def test_the_tool_cannot_attach_another_database_file(tmp_path: Path) -> None:
    with closing(db.connect_readonly("library")) as connection, pytest.raises(sqlite3.Error):
        db.execute(connection, f"ATTACH DATABASE '{tmp_path / 'new.db'}' AS other")
    assert not (tmp_path / "new.db").exists()


def test_a_runaway_query_is_interrupted_at_the_time_limit() -> None:
    endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT COUNT(*) FROM n"
    with closing(db.connect_readonly("library")) as connection:
        started = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="interrupted"):
            db.execute(connection, endless, time_limit_s=0.2)
        assert time.monotonic() - started < 2
        assert db.execute(connection, "SELECT COUNT(*) FROM authors") == [(14,)]  # the connection still works


def test_the_final_query_is_read_from_the_last_sql_block_or_a_bare_select() -> None:
    assert agent.final_query("Try:\n```sql\nSELECT 1\n```\nFinal:\n```sql\nSELECT 2;\n```") == "SELECT 2"
    assert agent.final_query("The answer is SELECT name FROM authors;") == "SELECT name FROM authors"
    assert agent.final_query("I don't know.") is None


def test_a_run_sql_call_repeated_as_json_text_gives_its_query_not_the_json_around_it() -> None:
    # Qwen-0.5B after a tool round: the bare-SELECT reading took the closing quote and braces and failed
    text = '{"name": "run_sql", "arguments": {"query": "SELECT count(*) FROM airports;"}}'
    assert agent.final_query(text) == "SELECT count(*) FROM airports"
    assert agent.final_query('{"name": "run_sql", "arguments": {}}') is None
    several = text + '\n{"name": "run_sql", "arguments": {"query": "SELECT name FROM airports"}} and so on'
    assert agent.final_query(several) is None  # calls it meant to run: the last query that ran is the answer


# ----------------------------------------------------------------------------- the agent against a scripted model


def scripted_model(
    replies: list[dict[str, Any]], on_request: Callable[[], None] = lambda: None
) -> tuple[Starlette, list[dict[str, Any]]]:
    """An OpenAI-compatible endpoint that answers each request with the next scripted assistant message."""
    requests: list[dict[str, Any]] = []

    async def completions(request: Request) -> JSONResponse:
        on_request()
        body = await request.json()
        requests.append(body)
        message = {"role": "assistant", "content": None, **replies[len(requests) - 1]}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        return JSONResponse({"id": f"c{len(requests)}", "object": "chat.completion", "created": 0, "model": body["model"],
                             "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])]), requests


def call(sql: str, n: int) -> dict[str, Any]:
    return {"tool_calls": [{"id": f"call{n}", "type": "function",
                            "function": {"name": "run_sql", "arguments": json.dumps({"query": sql})}}]}


@pytest.fixture
def question() -> dict[str, Any]:
    return next(q for q in QUESTIONS if q["kind"] == "join_count")


@contextmanager
def served(replies: list[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    app, requests = scripted_model(replies)
    with ServerThread(app) as server:
        yield server.url + "/v1", requests


def test_the_agent_sees_the_schema_and_its_tool_errors_and_fixes_its_query(question: dict[str, Any]) -> None:
    gold = question["gold"]
    replies = [call(gold.replace("JOIN", "JION"), 1), call(gold, 2), {"content": f"```sql\n{gold}\n```"}]
    with served(replies) as (url, requests):
        episode = agent.solve(question["question"], question["db"], model="m", base_url=url, api_key="k")
    assert [failed for _, failed in episode.queries] == [True, False]
    assert episode.first_failed and episode.recovered
    assert db.execution_match(question["db"], episode.answer, gold) == 1
    system, user = requests[0]["messages"]
    assert "CREATE TABLE" in system["content"] and user["content"] == question["question"]
    assert [t["function"]["name"] for t in requests[0]["tools"]] == ["run_sql"]
    error = requests[1]["messages"][-1]
    assert error["role"] == "tool" and error["content"].startswith("Error:") and "syntax error" in error["content"]


def test_an_agent_that_writes_no_final_block_is_judged_on_its_last_query_that_ran(question: dict[str, Any]) -> None:
    replies = [call(question["gold"], 1), {"content": "That is the answer."}]
    with served(replies) as (url, _):
        episode = agent.solve(question["question"], question["db"], model="m", base_url=url, api_key="k")
    assert episode.answer == question["gold"] and not episode.first_failed and not episode.recovered


def test_a_prompt_resource_is_the_system_prompt_with_the_schema_and_a_rewrite_without_its_slot_is_refused(
    question: dict[str, Any],
) -> None:
    prompt = ag.PromptTemplate(template="Answer in SQLite.\n{schema}\nRun the query with run_sql first.")
    replies = [call(question["gold"], 1), {"content": f"```sql\n{question['gold']}\n```"}]
    with served(replies) as (url, requests):
        reward = train.sql_rollout(question, ag.LLM(base_url=url, model="m"), prompt)
    assert reward == 1.0
    assert requests[0]["messages"][0]["content"] == prompt.format(schema=db.schema(question["db"]))
    seed = ag.PromptTemplate(template=agent.INSTRUCTIONS)  # what APO rewrites in `benchmarks/joint_vs_alone.py`
    dropped = seed.model_copy(update={"template": agent.INSTRUCTIONS.replace("{schema}", "the tables")})
    assert check_rewrite(seed, dropped) == "drops placeholder(s) schema, which the agent fills"


def test_runner_threads_building_a_database_at_once_all_get_it_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # rollouts of one runner process used to share one partial file and failed with "disk I/O error"
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("AGENTGRAD_SQL_DIR", str(tmp_path / "fresh"))
    name = db.database_names()[0]
    gold = next(q["gold"] for q in QUESTIONS if q["db"] == name)
    with ThreadPoolExecutor(8) as pool:
        rewards = list(pool.map(lambda _: db.execution_match(name, gold, gold), range(16)))
    assert rewards == [1.0] * 16
    assert [p.name for p in (tmp_path / "fresh").iterdir()] == [db.database_path(name).name]


# ----------------------------------------------------------------------------- recovery: failed first, fixed later


def test_every_database_has_questions_of_every_kind_a_first_query_falls_into() -> None:
    for name in db.database_names():
        kinds = {q["kind"] for q in QUESTIONS if q["db"] == name}
        assert set(recovery.KINDS) - {"date_text"} <= kinds, name  # school stores no dates
    assert all(q["question"] != recovery.TEMPLATES[q["db"]][0][1] for q in QUESTIONS)  # every template filled


def test_a_literal_cased_as_in_prose_returns_no_rows_and_counts_as_a_failed_query() -> None:
    trap = next(q for q in QUESTIONS if q["kind"] == "literal_case" and q["db"] == "library" and "books" in q["question"])
    cased = trap["question"].removeprefix("List the titles of the ").removesuffix(" books.")
    replies = [call(f"SELECT title FROM books WHERE genre = '{cased}'", 1), call(trap["gold"], 2), {"content": "Done."}]
    with served(replies) as (url, _):
        episode = agent.solve(trap["question"], "library", model="m", base_url=url, api_key="k")
    assert [failed for _, failed in episode.queries] == [True, False] and episode.recovered
    assert db.execution_match("library", episode.answer, trap["gold"]) == 1


TRANSCRIPTS = {  # hand-made: the queries the model runs, then its final reply; what the episode is annotated
    "right first": (["{gold}"], "```sql\n{gold}\n```", {"first_failed": False, "recovered": False, "matched": True}),
    "fixed an error": (["{broken}", "{gold}"], "```sql\n{gold}\n```",
                       {"first_failed": True, "recovered": True, "matched": True}),
    "ran again, still wrong": (["{broken}", "{wrong}"], "```sql\n{wrong}\n```",
                               {"first_failed": True, "recovered": True, "matched": False}),
    "gave up": (["{broken}"], "```sql\n{broken}\n```", {"first_failed": True, "recovered": False, "matched": False}),
    "wrong, never failed": (["{wrong}"], "```sql\n{wrong}\n```",
                            {"first_failed": False, "recovered": False, "matched": False}),
}


@pytest.mark.parametrize("transcript", TRANSCRIPTS)
def test_each_episode_is_annotated_with_failed_first_recovered_and_matched(
    transcript: str, question: dict[str, Any]
) -> None:
    queries, final, expected = TRANSCRIPTS[transcript]
    gold = question["gold"]
    sql = {"gold": gold, "broken": gold.replace("COUNT(*)", "COUNT(*", 1), "wrong": gold.replace("COUNT(*)", "COUNT(*) + 1")}
    replies = [call(q.format(**sql), i) for i, q in enumerate(queries)] + [{"content": final.format(**sql)}]
    with served(replies) as (url, _):
        episode = agent.solve(question["question"], question["db"], model="m", base_url=url, api_key="k")
    labels = train.annotation(episode, db.execution_match(question["db"], episode.answer, gold))
    assert {k.removeprefix("sql."): labels[k] for k in ("sql.first_failed", "sql.recovered", "sql.matched")} == expected
    assert labels["sql.queries"] == len(queries) and labels["sql.answered"]


def test_after_a_failed_query_the_next_turn_must_run_another_until_the_retries_are_spent(
    question: dict[str, Any],
) -> None:
    gold, broken = question["gold"], question["gold"].replace("JOIN", "JION")
    replies = [call(broken, 1), call(broken, 2), {"content": "I cannot."}]
    with served(replies) as (url, requests):
        episode = agent.solve(question["question"], question["db"], model="m", base_url=url, api_key="k",
                              run_first=True, retries=1)
    assert [r.get("tool_choice") for r in requests] == ["required", "required", "auto"]
    assert episode.first_failed and not episode.recovered and episode.answer is None
    replies = [call(gold, 1), {"content": f"```sql\n{gold}\n```"}]
    with served(replies) as (url, requests):
        agent.solve(question["question"], question["db"], model="m", base_url=url, api_key="k", run_first=True, retries=2)
    assert [r.get("tool_choice") for r in requests] == ["required", "auto"]  # a query that ran leaves the choice


def test_each_query_is_reported_as_it_runs_before_the_next_model_call(question: dict[str, Any]) -> None:
    # the rollout emits each query's reward from this callback: it must land between the call that wrote the query
    # and the next call, so that per-turn credit pays the writing call
    gold, broken = question["gold"], question["gold"].replace("JOIN", "JION")
    reported: list[tuple[str, bool]] = []
    seen_at_request: list[int] = []
    app, _ = scripted_model([call(broken, 1), call(gold, 2), {"content": "Done."}],
                            on_request=lambda: seen_at_request.append(len(reported)))
    with ServerThread(app) as server:
        agent.solve(question["question"], question["db"], model="m", base_url=server.url + "/v1", api_key="k",
                    on_query=lambda sql, failed: reported.append((sql, failed)))
    assert reported == [(broken, True), (gold, False)]
    assert seen_at_request == [0, 1, 2]


def test_a_wrong_column_s_error_names_the_columns_of_the_tables_the_query_used() -> None:
    trap = next(q for q in QUESTIONS if q["kind"] == "synonym" and "nationality" in q["gold"])
    wrong = trap["gold"].replace("SELECT nationality", "SELECT country")
    with served([call(wrong, 1), call(trap["gold"], 2), {"content": "Done."}]) as (url, requests):
        episode = agent.solve(trap["question"], trap["db"], model="m", base_url=url, api_key="k")
    error = requests[1]["messages"][-1]["content"]
    assert error.startswith("Error: no such column: country") and "passengers(id, name, nationality)" in error
    assert "bookings(" not in error  # only the tables the query named
    assert episode.recovered and db.execution_match(trap["db"], episode.answer, trap["gold"]) == 1


def test_an_empty_result_s_answer_gives_the_stored_value_to_compare_with() -> None:
    trap = next(q for q in QUESTIONS if q["kind"] == "literal_case" and q["db"] == "library" and "books" in q["question"])
    cased = trap["question"].removeprefix("List the titles of the ").removesuffix(" books.")
    stored = trap["gold"].split("= ")[1]  # 'poetry' as the gold query compares it
    wrong = f"SELECT title FROM books WHERE genre = '{cased}'"
    with served([call(wrong, 1), call(trap["gold"], 2), {"content": "Done."}]) as (url, requests):
        episode = agent.solve(trap["question"], "library", model="m", base_url=url, api_key="k")
    answer = requests[1]["messages"][-1]["content"]
    assert answer.startswith("(no rows)") and f"use genre = {stored} in the query" in answer
    assert episode.recovered and db.execution_match("library", episode.answer, trap["gold"]) == 1


def test_an_empty_result_s_answer_names_a_null_comparison_and_some_values_when_none_is_like_the_literal() -> None:
    with closing(db.connect_readonly("library")) as connection:
        hint = hints.value_hint(connection, "library", "SELECT id FROM loans WHERE return_date = NULL")
        assert "IS NULL" in hint
        hint = hints.value_hint(connection, "library", "SELECT COUNT(*) FROM loans AS l WHERE l.loan_date LIKE 'March 2023%'")
        stored = [row[0] for row in connection.execute("SELECT DISTINCT loan_date FROM loans")]
        assert hints.value_hint(connection, "library", "SELECT 1") == ""
    assert "No loans.loan_date is like 'March 2023%'" in hint
    shown = hint.split("some of its values: ")[1].split(", ")
    assert len(shown) == hints.VALUES_SHOWN and all(value.strip("'") in stored for value in shown)


def test_a_literal_compared_with_the_wrong_column_is_named_where_it_is_stored_with_the_join() -> None:
    with closing(db.connect_readonly("airline")) as connection:
        city = connection.execute("SELECT city FROM airports ORDER BY city LIMIT 1").fetchone()[0]
        hint = hints.value_hint(connection, "airline", f"SELECT COUNT(*) FROM flights WHERE origin = '{city.upper()}'")
        nowhere = hints.value_hint(connection, "airline", "SELECT COUNT(*) FROM flights WHERE origin = 'Atlantis'")
    assert hint.startswith(f"No flights.origin is like '{city.upper()}'")
    # its case aside, never in flights.origin itself, and the key the two tables share found from their values
    assert hint.endswith(f"'{city.upper()}' is stored in airports.city; to reach it, join airports ON "
                         "flights.origin = airports.code")
    assert "stored in" not in nowhere and "No flights.origin is like 'Atlantis'" in nowhere


def test_a_join_written_after_where_is_told_where_a_join_goes() -> None:
    wrong = "SELECT COUNT(*) FROM flights WHERE origin = 'x' JOIN airports ON flights.origin = airports.code"
    with closing(db.connect_readonly("airline")) as connection:
        answer = agent.tool_answer(connection, "airline", wrong, [])
        fine = agent.tool_answer(connection, "airline", "SELECT COUNT(*) FROM flights WHERE", [])
    assert answer.startswith("Error: near \"JOIN\": syntax error. JOIN goes right after FROM and its table, before WHERE")
    assert fine.startswith("Error: ") and "JOIN goes" not in fine


def test_a_count_of_nothing_fails_and_a_query_rerun_unchanged_is_told_so() -> None:
    trap = next(q for q in QUESTIONS if q["kind"] == "date_text" and q["db"] == "library" and "made" in q["question"])
    month_name = trap["question"].removeprefix("How many loans were made in ").removesuffix("?")
    wrong = f"SELECT COUNT(*) FROM loans WHERE loan_date LIKE '%{month_name}%'"
    replies = [call(wrong, 1), call(wrong, 2), call(trap["gold"], 3), {"content": "Done."}]
    with served(replies) as (url, requests):
        episode = agent.solve(trap["question"], "library", model="m", base_url=url, api_key="k")
    assert [failed for _, failed in episode.queries] == [True, True, False]
    first, second = requests[1]["messages"][-1]["content"], requests[2]["messages"][-1]["content"]
    assert first.startswith("0. No loans.loan_date is like") and "ran this same query before" not in first
    assert "You ran this same query before: change it" in second
    assert db.returned_nothing([(None,)]) and db.returned_nothing([(0, 0)]) and not db.returned_nothing([(0, 1)])
    assert not db.returned_nothing([(0,), (0,)])  # two rows are an answer


def test_each_mistake_springs_one_trap_and_the_chosen_one_fails_on_its_database() -> None:
    import random

    gold = "SELECT DISTINCT p.name FROM a AS x JOIN p ON x.p_id = p.id WHERE p.city = 'Lisbon' AND x.day IS NULL"
    assert recovery.mistakes(gold) == [
        gold.replace("'Lisbon'", "'lisbon'"),
        gold.replace("IS NULL", "= NULL"),
        gold.replace("p.city =", "city ="),
    ]
    assert recovery.mistakes("SELECT COUNT(*) FROM loans WHERE loan_date LIKE '2024-03-%'") == [
        "SELECT COUNT(*) FROM loans WHERE loan_date LIKE '%March 2024%'"]
    assert recovery.mistakes("SELECT genre FROM books GROUP BY genre HAVING COUNT(*) > 7") == [
        "SELECT genre FROM books WHERE COUNT(*) > 7 GROUP BY genre"]
    rng = random.Random(0)
    for q in (q for q in QUESTIONS if q["split"] == "train"):
        if (sql := recovery.first_mistake(q, rng)) is not None:
            assert sql in recovery.mistakes(q["gold"]) + recovery.join_mistakes(q["gold"])
            assert db.query_fails(q["db"], sql)
    assert recovery.first_mistake({"db": "library", "gold": "SELECT COUNT(*) FROM books"}, rng) is None


def test_an_episode_can_start_from_a_given_mistake_that_the_model_sees_answered_and_fixes() -> None:
    trap = next(q for q in QUESTIONS if q["kind"] == "null" and q["db"] == "library")
    mistake = trap["gold"].replace("IS NULL", "= NULL")
    reported: list[tuple[str, bool]] = []
    with served([call(trap["gold"], 1), {"content": f"```sql\n{trap['gold']}\n```"}]) as (url, requests):
        episode = agent.solve(trap["question"], "library", model="m", base_url=url, api_key="k", run_first=True,
                              retries=2, first_query=mistake, on_query=lambda sql, failed: reported.append((sql, failed)))
    _, user, given, answered = requests[0]["messages"]
    assert user["content"] == trap["question"] and json.loads(given["tool_calls"][0]["function"]["arguments"]) == {
        "query": mistake}
    assert answered["role"] == "tool" and answered["content"].startswith("(no rows)") and "IS NULL" in answered["content"]
    assert requests[0]["tool_choice"] == "required"  # the given query failed: the model's first turn must run another
    assert episode.queries == [(mistake, True), (trap["gold"], False)] and episode.recovered
    assert reported == [(trap["gold"], False)]  # only the model's own queries are paid
    labels = train.annotation(episode, db.execution_match("library", episode.answer, trap["gold"]), from_mistake=True)
    assert labels["sql.from_mistake"] and labels["sql.first_failed"] and labels["sql.matched"]


def test_an_episode_can_start_from_a_mistake_rerun_unchanged_and_the_model_must_change_it() -> None:
    trap = next(q for q in QUESTIONS if q["kind"] == "null" and q["db"] == "library")
    mistake = trap["gold"].replace("IS NULL", "= NULL")
    reported: list[tuple[str, bool]] = []
    with served([call(trap["gold"], 1), {"content": f"```sql\n{trap['gold']}\n```"}]) as (url, requests):
        episode = agent.solve(trap["question"], "library", model="m", base_url=url, api_key="k", run_first=True,
                              retries=2, first_query=mistake, first_query_runs=2,
                              on_query=lambda sql, failed: reported.append((sql, failed)))
    _, _, first, first_answer, again, again_answer = requests[0]["messages"]
    assert [json.loads(m["tool_calls"][0]["function"]["arguments"])["query"] for m in (first, again)] == [mistake] * 2
    assert first["tool_calls"][0]["id"] != again["tool_calls"][0]["id"]
    assert "same query before" not in first_answer["content"]
    assert again_answer["content"].endswith("You ran this same query before: change it")
    assert requests[0]["tool_choice"] == "required"  # two given runs, retries 2: the model's turn must run another
    assert episode.queries == [(mistake, True), (mistake, True), (trap["gold"], False)] and episode.recovered
    assert reported == [(trap["gold"], False)]  # only the model's own query is paid


def test_a_recovery_demonstration_is_the_chat_the_agent_sends_when_it_fixes_that_mistake() -> None:
    trap = next(q for q in QUESTIONS if q["kind"] == "null" and q["db"] == "library")
    mistake = trap["gold"].replace("IS NULL", "= NULL")
    with served([call(trap["gold"], 1), {"content": f"```sql\n{trap['gold']}\n```"}]) as (url, requests):
        agent.solve(trap["question"], "library", model="m", base_url=url, api_key="k", run_first=True, retries=2,
                    first_query=mistake)
    shown = recovery.demonstration(trap, mistake)
    ids = {"call_first": "call_mistake", "call1": "call_fix"}  # the ids a chat gives its calls are its own

    def plain(message: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in message.items() if k != "weight" and v is not None}
        for call_ in out.get("tool_calls", []):
            call_["id"] = ids.get(call_["id"], call_["id"])
        if "tool_call_id" in out:
            out["tool_call_id"] = ids.get(out["tool_call_id"], out["tool_call_id"])
        return out

    assert [plain(m) for m in requests[-1]["messages"]] == [plain(m) for m in shown["messages"][:-1]]
    assert requests[0]["tools"] == shown["tools"]
    assert shown["messages"][-1] == {"role": "assistant", "content": f"```sql\n{trap['gold']}\n```"}
    assert [m.get("weight") for m in shown["messages"] if m["role"] == "assistant"] == [0, None, None]
    train_questions = db.load_questions("train")
    every = recovery.failing_mistakes(train_questions, recovery.mistakes)  # every failing mistake of the training set
    assert len(every) >= 100 and mistake in [sql for q, sql in every if q["question"] == trap["question"]]
    assert recovery.failing_mistakes([trap], lambda gold: [gold, mistake]) == [(trap, mistake)]  # the gold query runs


def test_join_mistakes_write_the_join_after_where_leave_it_out_or_swap_an_alias_and_the_tool_says_what_to_fix() -> None:
    gold = "SELECT c.title FROM books AS c JOIN authors AS p ON c.author_id = p.id WHERE p.name = 'Liam Patel'"
    after, left_out, swapped = recovery.join_mistakes(gold)
    assert after == "SELECT c.title FROM books AS c WHERE p.name = 'Liam Patel' JOIN authors AS p ON c.author_id = p.id"
    assert left_out == "SELECT title FROM books WHERE name = 'Liam Patel'"
    assert swapped == gold.replace("SELECT c.title", "SELECT p.title")
    counted = recovery.join_mistakes(gold.replace("SELECT c.title", "SELECT COUNT(*)"))[-1]
    assert counted.endswith("WHERE c.name = 'Liam Patel'")  # nothing qualified to select: the compared column swapped
    assert recovery.join_mistakes("SELECT COUNT(*) FROM books WHERE year > 2000") == []
    assert recovery.join_mistakes(gold.replace(" WHERE", " JOIN loans AS l ON l.book_id = c.id WHERE")) == []
    with closing(db.connect_readonly("library")) as connection:
        assert "JOIN goes right after FROM" in agent.tool_answer(connection, "library", after, [])
        assert agent.tool_answer(connection, "library", left_out, []).startswith(
            "Error: no such column: name. The columns of the tables you used: books(")
        assert agent.tool_answer(connection, "library", swapped, []).endswith(
            "title is a column of books, which the query names c: use c.title")


def test_the_demonstration_mix_draws_each_kind_from_training_questions_only_and_the_same_each_time() -> None:
    train_questions = db.load_questions("train")
    mix = recovery.demonstration_mix(train_questions)
    assert mix == recovery.demonstration_mix(train_questions)
    by_question = {q["question"]: q for q in train_questions}
    assert all(chat["messages"][1]["content"] in by_question for chat in mix)  # no held-out question among them
    first_calls = [json.loads(chat["messages"][2]["tool_calls"][0]["function"]["arguments"])["query"] for chat in mix]
    starts_right = [sql == by_question[chat["messages"][1]["content"]]["gold"] for chat, sql in zip(mix, first_calls)]
    joins = [any(sql in recovery.join_mistakes(q["gold"]) for q in train_questions) for sql in first_calls]
    assert (len(mix), sum(joins), sum(starts_right)) == (sum(recovery.MIX.values()), recovery.MIX["joins"],
                                                         recovery.MIX["right"])
    for chat, sql, right_first in zip(mix, first_calls, starts_right):  # a fix of a mistake that fails, ending right
        question = by_question[chat["messages"][1]["content"]]
        assert right_first or db.query_fails(question["db"], sql)
        assert chat["messages"][-1] == {"role": "assistant", "content": f"```sql\n{question['gold']}\n```"}
    right = mix[starts_right.index(True)]["messages"]
    assert [m["role"] for m in right] == ["system", "user", "assistant", "tool", "assistant"]
    assert all("weight" not in m for m in right)  # every turn of a chat that starts right is taught
