"""The PostgreSQL store's own guarantees, past the contract suite: what a wrong address says, how an older
schema is migrated or refused, what an exhausted pool answers, and that a database restart is ridden out."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import asyncpg
import httpx
import pytest

from agentgrad.cli.main import main
from agentgrad.serving import ServerThread
from agentgrad.store import StoreError, open_store
from agentgrad.store.client import StoreClient
from agentgrad.store.http_errors import exception_answer
from agentgrad.store.postgres import PostgresStore
from agentgrad.store.postgres_schema import LOCK_KEYS, MIGRATIONS, VERSION
from agentgrad.store.server import create_app
from agentgrad.types import AttemptStatus, RolloutConfig, RolloutStatus, Span
from tests.helpers import ManualClock, wait_until
from tests.postgres_server import PASSWORD, connect_to_schema, fresh_schema_url, shared_server


def test_a_wrong_password_names_host_port_database_and_user_but_never_the_password() -> None:
    server = shared_server()
    wrong = "not-the-Secret-42"
    with pytest.raises(StoreError) as refused:
        open_store(server.url(password=wrong))
    message = str(refused.value)
    assert f"127.0.0.1:{server.port}" in message and "'postgres'" in message and "password" in message
    assert wrong not in message and PASSWORD not in message


def test_an_unknown_database_says_how_to_create_it() -> None:
    server = shared_server()
    with pytest.raises(StoreError) as refused:
        open_store(server.url("no_such_db"))
    assert "'no_such_db'" in str(refused.value) and f"createdb -h 127.0.0.1 -p {server.port} no_such_db" in str(
        refused.value
    )


def test_nothing_listening_is_an_error_naming_the_address() -> None:
    from agentgrad.serving import free_port

    port = free_port()
    with pytest.raises(StoreError, match=f"127.0.0.1:{port}.*is PostgreSQL running there"):
        open_store(f"postgresql://someone:pw@127.0.0.1:{port}/agentgrad")


@pytest.mark.parametrize("option", ["pool_size", "write_lanes"])
def test_a_store_url_option_below_one_or_not_a_number_is_refused_naming_it(option: str) -> None:
    with pytest.raises(StoreError, match=f"the store URL's {option} must be at least 1"):
        open_store(f"postgresql://someone@127.0.0.1:1/agentgrad?{option}=0")
    with pytest.raises(StoreError, match=f"the store URL's {option}='two' is not a number"):
        open_store(f"postgresql://someone@127.0.0.1:1/agentgrad?{option}=two")


async def _at_version_1(url: str) -> str:
    """A schema as agentgrad's first PostgreSQL release left it, with one rollout in it; returns its id."""
    store = PostgresStore(url, sweep_seconds=None)
    rollout = await store.enqueue_rollout({"kept": True})
    await store.close()
    conn = await connect_to_schema(url)
    await conn.execute(
        "DROP TABLE replies; DROP TRIGGER rollout_finished ON rollouts; DROP FUNCTION announce_finished_rollout(); "
        "UPDATE schema_version SET version = 1"
    )
    await conn.close()
    return rollout.rollout_id


async def test_a_database_at_an_older_schema_is_migrated_forward_keeping_its_rows() -> None:
    assert VERSION == len(MIGRATIONS) > 1
    url = fresh_schema_url()
    kept = await _at_version_1(url)
    store = PostgresStore(url, sweep_seconds=None)
    assert (store.schema_found, store.schema_version) == (1, VERSION)
    assert (await store.get_rollout(kept)).input == {"kept": True}
    answer = await store.run_once("k1", lambda: _answer(store))  # the table version 2 added is there
    assert answer == await store.run_once("k1", lambda: _answer(store))
    await store.close()


async def _answer(store: PostgresStore) -> tuple[int, bytes]:
    rollout = await store.enqueue_rollout({"once": True})
    return 200, rollout.rollout_id.encode()


async def test_twin_writes_with_one_key_on_two_stores_apply_once_and_both_get_the_first_answer() -> None:
    url = fresh_schema_url()
    stores = [PostgresStore(url, sweep_seconds=None) for _ in range(2)]
    key = "k'; DROP TABLE rollouts; --\\ é"  # quotes, a backslash and a non-ASCII letter: stored as given
    done: list[int] = []
    both_done = asyncio.Event()

    async def gated(store: PostgresStore) -> tuple[int, bytes]:  # both twins run their write before either commits
        answer = await _answer(store)
        done.append(1)
        if len(done) == 2:
            both_done.set()
        await both_done.wait()
        return answer

    answers = await asyncio.gather(*(store.run_once(key, lambda store=store: gated(store)) for store in stores))
    assert answers[0] == answers[1]  # the twin that lost the commit rolled back and answers with the first's answer
    assert (await stores[0].stats()).rollouts == {"queuing": 1}
    assert await stores[1].get_rollout(answers[0][1].decode())  # the stored answer names the rollout that exists
    for store in stores:
        await store.close()


async def test_concurrent_writes_commit_together_and_one_that_fails_is_answered_alone() -> None:
    store = PostgresStore(fresh_schema_url(write_lanes="1"), sweep_seconds=None)
    writes: list[Any] = [store.enqueue_rollout({"n": n}) for n in range(24)]
    writes.insert(12, store.update_rollout("no-such-rollout", status=RolloutStatus.CANCELLED))
    answers = await asyncio.gather(*writes, return_exceptions=True)
    failed = answers.pop(12)
    assert isinstance(failed, StoreError) and "no-such-rollout" in str(failed)
    assert sorted(rollout.input["n"] for rollout in answers) == list(range(24))  # the others all committed
    assert (await store.stats()).rollouts == {"queuing": 24}
    transactions = store._transactions
    assert transactions.writes == 24 and transactions.commits < transactions.writes  # grouped, the failed one not
    await store.close()


async def test_a_write_made_in_the_turn_the_last_committer_finishes_gets_a_committer_of_its_own() -> None:
    """A task's next write, made as soon as its previous one is answered (before the loop has reaped the committer
    that answered it), is committed: it is not left waiting for some later write to start a committer."""
    store = PostgresStore(fresh_schema_url(write_lanes="1"), sweep_seconds=None)

    async def one_after_another() -> None:
        for n in range(3):
            await store.enqueue_rollout({"n": n})

    writes = asyncio.ensure_future(one_after_another())  # awaited through no other task: it resumes first
    done, _ = await asyncio.wait([writes], timeout=10)  # the bound of a failure only: the writes take milliseconds
    if not done:
        writes.cancel()
    assert done, "a write was left waiting with no committer to run it"
    assert (await store.stats()).rollouts == {"queuing": 3}
    await store.close()


async def test_twin_writes_with_one_key_in_one_group_apply_once_and_both_get_the_first_answer() -> None:
    store = PostgresStore(fresh_schema_url(), sweep_seconds=None)
    others = [store.run_once(f"other-{n}", lambda: _answer(store)) for n in range(6)]
    twins = [store.run_once("twin", lambda: _answer(store)) for _ in range(2)]
    answers = await asyncio.gather(*others[:3], *twins, *others[3:])
    assert answers[3] == answers[4]  # the second twin's write was rolled back; it answers with the first's answer
    assert len({body for _, body in answers}) == 7
    assert (await store.stats()).rollouts == {"queuing": 7}
    await store.close()


async def _claim(store: PostgresStore) -> tuple[int, bytes]:
    claimed = await store.dequeue_rollout(worker_id="w")
    return 200, b"null" if claimed is None else claimed.rollout_id.encode()


async def test_a_claim_retried_after_its_answer_was_lost_gets_it_back_and_holds_no_other_workers_rollout() -> None:
    """A claim that committed but whose answer was lost (its connection cut while committing, at a restart) comes
    again with its key. It gets its first answer without claiming again: run again until its stored answer turned
    up, it would hold another waiting rollout `FOR UPDATE`, and that worker's own claim would skip it and find the
    queue empty (the restart test's `assert claimed is not None`, failing now and then)."""
    url = fresh_schema_url()
    store, other = (PostgresStore(url, sweep_seconds=None) for _ in range(2))
    mine = await store.enqueue_rollout({"n": 0})
    first = await store.run_once("dequeue_rollout:k", lambda: _claim(store))
    assert first == (200, mine.rollout_id.encode())
    theirs = await other.enqueue_rollout({"n": 1})
    ran, release = asyncio.Event(), asyncio.Event()

    async def claim_and_stay_open() -> tuple[int, bytes]:  # were it run again: its transaction stays open
        answer = await _claim(store)
        ran.set()
        await release.wait()
        return answer

    retry = asyncio.ensure_future(store.run_once("dequeue_rollout:k", claim_and_stay_open))
    ran_again = asyncio.ensure_future(ran.wait())
    await asyncio.wait([retry, ran_again], return_when=asyncio.FIRST_COMPLETED)
    their_claim = await other.dequeue_rollout(worker_id="them")
    release.set()
    assert await retry == first
    ran_again.cancel()
    assert their_claim is not None and their_claim.rollout_id == theirs.rollout_id
    assert not ran.is_set(), "the retry claimed again"
    for each in (store, other):
        await each.close()


async def test_a_keyed_write_whose_connection_is_cut_mid_transaction_runs_again_whole_and_applies_once() -> None:
    """The database ends a write's connection between two of its statements, as a restart does. The store call inside
    answers that as a 500 (the driver read the server's last words while idle, or found the socket gone); the store
    runs the transaction again on a fresh connection instead of answering it, and the write applies once."""
    url = fresh_schema_url()
    store = PostgresStore(url, sweep_seconds=None)
    killer = await connect_to_schema(url)
    backends: list[int] = []

    async def cut_once() -> tuple[int, bytes]:
        try:
            rollout = await store.enqueue_rollout({"n": len(backends)})
            backends.append(await store._transactions.read(lambda db: db.fetchval("SELECT pg_backend_pid()")))
            if len(backends) == 1:  # returns once the backend has exited
                assert await killer.fetchval("SELECT pg_terminate_backend($1, 10000)", backends[0])
            await store.get_rollout(rollout.rollout_id)
        except Exception as exc:
            return exception_answer(exc)
        return 200, rollout.rollout_id.encode()

    status, body = await store.run_once("k", cut_once)
    assert status == 200 and len(backends) == 2 and backends[0] != backends[1]
    assert [rollout.rollout_id for rollout in await store.query_rollouts()] == [body.decode()]
    await killer.close()
    await store.close()


async def test_a_connection_whose_call_was_cancelled_mid_statement_is_closed_not_pooled_again() -> None:
    url = fresh_schema_url(pool_size="1")
    store = PostgresStore(url, sweep_seconds=None)

    async def backend() -> int:
        return int(await store._transactions.read(lambda db: db.fetchval("SELECT pg_backend_pid()")))

    before = await backend()
    sleeping = asyncio.ensure_future(store._transactions.read(lambda db: db.execute("SELECT pg_sleep(60)")))
    await asyncio.to_thread(wait_until, lambda: asyncio.run(_backends(url, "query LIKE 'SELECT pg_sleep%'")) > 0, "the statement to be running")
    sleeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeping
    assert await backend() != before  # the pool's one connection is a new one
    await store.close()


async def test_a_wait_on_one_store_wakes_when_another_store_of_the_database_finishes_the_rollout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agentgrad.store.postgres as postgres

    # woken by the database's announcement, or not at all
    monkeypatch.setattr(postgres, "LISTENING_POLL_SECONDS", 600.0)
    url = fresh_schema_url()
    waiting, finishing = PostgresStore(url, sweep_seconds=None), PostgresStore(url, sweep_seconds=None)
    other = await waiting.enqueue_rollout({"n": 0})
    mine = await waiting.enqueue_rollout({"n": 1})
    assert await waiting._poll_seconds() == 600.0  # this loop listens from now on
    wait = asyncio.create_task(waiting.wait_for_rollouts([mine.rollout_id], timeout=300))
    for expected in (other, mine):  # the other server claims both and finishes them, the one not waited on first
        claimed = await finishing.dequeue_rollout()
        assert claimed is not None and claimed.rollout_id == expected.rollout_id
        await finishing.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
    (done,) = await asyncio.wait_for(wait, 60)
    assert done.rollout_id == mine.rollout_id and done.status is RolloutStatus.SUCCEEDED
    for store in (waiting, finishing):
        await store.close()


async def test_an_older_schema_is_refused_with_the_command_that_migrates_it_when_migration_is_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = fresh_schema_url()
    kept = await _at_version_1(url)
    with pytest.raises(StoreError) as refused:
        PostgresStore(url + "&migrate=false", sweep_seconds=None)
    message = str(refused.value)
    assert f"version 1, older than this agentgrad's ({VERSION})" in message
    assert "agentgrad store migrate --store postgresql://postgres@127.0.0.1:" in message
    assert PASSWORD not in message

    assert main(["store", "migrate", "--store", url + "&migrate=false"]) == 0  # the command it names
    assert f"migrated from version 1 to {VERSION}" in capsys.readouterr().out
    store = PostgresStore(url + "&migrate=false", sweep_seconds=None)
    assert (await store.get_rollout(kept)).input == {"kept": True}
    await store.close()


async def test_a_schema_newer_than_this_agentgrad_is_refused_saying_to_upgrade() -> None:
    url = fresh_schema_url()
    await PostgresStore(url, sweep_seconds=None).close()
    conn = await connect_to_schema(url)
    await conn.execute("UPDATE schema_version SET version = $1", VERSION + 1)
    await conn.close()
    with pytest.raises(StoreError, match=f"version {VERSION + 1}, newer than this agentgrad's.*upgrade agentgrad"):
        PostgresStore(url, sweep_seconds=None)


def test_an_exhausted_pool_answers_503_naming_the_limit_and_serves_again_once_a_connection_is_free() -> None:
    url = fresh_schema_url(pool_size="1", pool_timeout="0.3")
    store = PostgresStore(url, sweep_seconds=None)
    rollout = asyncio.run(store.enqueue_rollout({"n": 1}))
    locker: list[asyncpg.Connection] = []
    loop = asyncio.new_event_loop()

    async def lock_row() -> None:  # another session holds the rollout's row: an update must wait for it
        conn = await connect_to_schema(url)
        await conn.execute("BEGIN")
        await conn.execute("SELECT 1 FROM rollouts WHERE rollout_id = $1 FOR UPDATE", rollout.rollout_id)
        locker.append(conn)

    loop.run_until_complete(lock_row())
    with ServerThread(create_app(store)) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        waiting = threading.Thread(
            target=lambda: httpx.patch(
                f"{server.url}/api/rollouts/{rollout.rollout_id}", json={"metadata": {"a": 1}}, timeout=30
            )
        )
        waiting.start()  # takes the pool's one connection and waits on the row lock
        wait_until(lambda: asyncio.run(_waiting_on_locks(url)) > 0, "the update to wait on the row lock", timeout=10)
        busy = http.get("/api/stats")
        assert busy.status_code == 503
        detail = busy.json()["detail"]
        assert "all 1 connections" in detail and "pool_size=N" in detail and "0.3 s" in detail
        assert PASSWORD not in detail

        loop.run_until_complete(locker[0].close())  # the lock goes: the waiting update ends, the pool is free
        waiting.join(10)
        assert http.get("/api/stats").status_code == 200
        assert asyncio.run(StoreClient(server.url).get_rollout(rollout.rollout_id)).metadata == {"a": 1}
    loop.close()
    asyncio.run(store.close())


async def _backends(url: str, where: str) -> int:
    """How many of the database's backends match `where` (a condition on pg_stat_activity), seen from another one."""
    conn = await connect_to_schema(url)
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM pg_stat_activity WHERE {where}"))
    finally:
        await conn.close()


async def _waiting_on_locks(url: str) -> int:
    return await _backends(url, "wait_event_type = 'Lock'")


@pytest.mark.slow
def test_clients_ride_out_a_postgresql_restart_mid_run_and_nothing_is_lost_or_doubled() -> None:
    pg = shared_server()
    store = PostgresStore(fresh_schema_url(), retry_seconds=60)
    total, done = 120, []
    errors: list[BaseException] = []
    with ServerThread(create_app(store)) as server:

        def work(first: int) -> None:
            async def loop() -> None:
                client = StoreClient(server.url, retry_seconds=60)
                for i in range(first, total, 4):
                    rollout = await client.enqueue_rollout({"i": i})
                    claimed = await client.dequeue_rollout(worker_id=f"w{first}")
                    assert claimed is not None
                    await client.add_spans(
                        [Span(rollout_id=claimed.rollout_id, attempt_id=claimed.attempt.attempt_id, name="s")]
                    )
                    await client.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="succeeded")
                    done.append(rollout.rollout_id)

            try:
                asyncio.run(loop())
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(done) >= total // 4 or errors, "progress before the restart")
        pg.stop("fast")  # every connection is cut; calls fail until it is back
        down_at = len(done)
        time.sleep(1.0)  # the database stays down a while: the time a restart takes
        pg.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        assert down_at < total

    async def check() -> None:
        rollouts = await store.query_rollouts()
        assert sorted(r.input["i"] for r in rollouts) == list(range(total))  # 0 lost, 0 duplicated
        assert {r.status for r in rollouts} == {RolloutStatus.SUCCEEDED}  # 0 stuck
        for rollout in rollouts:
            assert [a.status for a in await store.query_attempts(rollout.rollout_id)] == [AttemptStatus.SUCCEEDED]
            assert len(await store.query_spans(rollout.rollout_id)) == 1
        await store.close()

    asyncio.run(check())


def test_stores_sweeping_one_database_take_turns_under_the_advisory_lock_and_end_each_attempt_once() -> None:
    clock = ManualClock()
    url = fresh_schema_url()
    first, second = (PostgresStore(url, clock=clock, sweep_seconds=None) for _ in range(2))
    config = RolloutConfig(timeout_seconds=10, max_attempts=2, retry_on=[AttemptStatus.TIMEOUT])

    async def claim_all() -> list[str]:
        rollouts = await first.enqueue_rollouts([{"input": i, "config": config} for i in range(40)])
        for _ in rollouts:
            assert await second.dequeue_rollout() is not None
        return [r.rollout_id for r in rollouts]

    ids = asyncio.run(claim_all())
    clock.advance(11)
    loop = asyncio.new_event_loop()
    holder = loop.run_until_complete(connect_to_schema(url))  # a third party sweeping: both stores must wait
    loop.run_until_complete(holder.execute("BEGIN"))
    loop.run_until_complete(
        holder.execute("SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))", LOCK_KEYS["sweep"])
    )
    sweepers = [
        threading.Thread(target=lambda store=store: asyncio.run(store.check_attempts(force=True)))
        for store in (first, second)
    ]
    for thread in sweepers:
        thread.start()
    wait_until(lambda: asyncio.run(_waiting_on_locks(url)) == 2, "both sweeps to wait for the advisory lock")
    loop.run_until_complete(holder.execute("COMMIT"))  # both sweep now, one after the other
    for thread in sweepers:
        thread.join(30)
    loop.run_until_complete(holder.close())
    loop.close()

    async def check() -> None:
        for rollout_id in ids:
            rollout = await first.get_rollout(rollout_id)
            assert rollout.status is RolloutStatus.REQUEUING and rollout.num_attempts == 1
            assert [a.status for a in await first.query_attempts(rollout_id)] == [AttemptStatus.TIMEOUT]
        assert len([await second.dequeue_rollout() for _ in ids]) == len(ids)  # each back in the queue once
        assert await second.dequeue_rollout() is None
        await first.close()
        await second.close()

    asyncio.run(check())


def test_a_write_retried_on_another_server_of_the_database_gets_its_first_answer() -> None:
    url = fresh_schema_url()
    first_store, second_store = PostgresStore(url, sweep_seconds=None), PostgresStore(url, sweep_seconds=None)
    asyncio.run(first_store.enqueue_rollouts([{"input": 1}, {"input": 2}]))
    with ServerThread(create_app(first_store)) as one, ServerThread(create_app(second_store)) as other:
        claim = {"idempotency-key": "k-claim"}
        first = httpx.post(one.url + "/api/rollouts/dequeue", json={"worker_id": "w"}, headers=claim).json()
        again = httpx.post(other.url + "/api/rollouts/dequeue", json={"worker_id": "w"}, headers=claim)
        assert again.json() == first  # the same claim, not the next rollout
        path = f"/api/rollouts/{first['rollout_id']}/attempts/{first['attempt']['attempt_id']}"
        done = httpx.patch(one.url + path, json={"status": "succeeded"}, headers={"idempotency-key": "k-done"})
        redone = httpx.patch(other.url + path, json={"status": "succeeded"}, headers={"idempotency-key": "k-done"})
        assert done.status_code == redone.status_code == 200 and redone.json() == done.json()  # not a 409
        refused = httpx.patch(other.url + path, json={"status": "failed"}, headers={"idempotency-key": "k-late"})
        assert refused.status_code == 409  # an error answer is not stored in place of a later success
        for server in (one, other):
            httpx.post(
                server.url + "/api/rollouts", json={"requests": [{"input": 3}]}, headers={"idempotency-key": "k-q"}
            )
    assert asyncio.run(first_store.stats()).rollouts == {"queuing": 2, "succeeded": 1}  # enqueued once
    for store in (first_store, second_store):
        asyncio.run(store.close())
