"""Live route changes on the gateway: a table swapped under load loses no call, calls in flight finish on the table
they started with, each span names its table, a bad table is refused whole and the old one keeps serving, a
rollback swaps one route (in process and over HTTP), and the CLI reads and sets the table."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest

from agentgrad import semconv as sc
from agentgrad.gateway import Backend, Gateway
from agentgrad.gateway.admin import ROUTES_PATH
from agentgrad.gateway.routing import parse_routes
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from agentgrad.types import Span
from tests.fake_upstream import FakeUpstream
from tests.prometheus import scrape, value

AGENTS = 64
CALLS_BEFORE = 600
CALLS_AFTER = 3000
"""Calls each side of the swap: past it, each rollout's arm is a hash of its id, so the share of ~3,000 rollouts
on a 90 % arm is within 2 points of 90 % by over three standard deviations (0.55 points)."""
HELLO = [{"role": "user", "content": "hi"}]


def split(url: str, share_b: float) -> dict[str, Any]:
    """A routing file splitting `policy` between two versions of one upstream, `b` taking `share_b`."""
    return {
        "upstreams": {
            "a": {"url": url, "system": "vllm", "model": "step-1"},
            "b": {"url": url, "system": "vllm", "model": "step-3"},
        },
        "ab": {"policy": {"arms": ["a", "b"], "share": {"b": share_b}}},
    }


def spans_of(store: MemoryStore, rollout_ids: list[str]) -> list[Span]:
    async def read() -> list[Span]:
        return [span for rollout_id in rollout_ids for span in await store.query_spans(rollout_id)]

    return asyncio.run(read())


def started_rollouts(store: MemoryStore, count: int) -> list[tuple[str, str]]:
    async def start() -> list[tuple[str, str]]:
        return [
            (started.rollout_id, started.attempt.attempt_id)
            for started in [await store.start_rollout({"i": i}) for i in range(count)]
        ]

    return asyncio.run(start())


@pytest.fixture
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    """A fake OpenAI-compatible upstream on loopback (one copy serves both arms: the span names the arm), and its URL."""
    fake = FakeUpstream()
    with ServerThread(fake.app) as server:
        yield fake, server.url + "/v1"


@pytest.mark.slow
def test_a_split_moved_from_50_50_to_90_10_under_64_agents_loses_no_call_and_serves_the_new_shares(
    upstream: tuple[FakeUpstream, str],
) -> None:
    _, url = upstream
    store = MemoryStore()
    rollouts = started_rollouts(store, CALLS_BEFORE + CALLS_AFTER + 1000)
    gateway = Gateway(store, parse_routes(split(url, 0.5), "test"))
    old = gateway.table.id
    statuses: list[int] = []
    calls_started_after_swap = 0  # these can only take the new table; the test runs until CALLS_AFTER of them
    swapped = asyncio.Event()
    swap_answer: dict[str, Any] = {}

    async def agent(session: aiohttp.ClientSession, queue: list[tuple[str, str]]) -> None:
        nonlocal calls_started_after_swap
        body = json.dumps({"model": "policy", "messages": HELLO})
        while queue and calls_started_after_swap < CALLS_AFTER:
            rollout_id, attempt_id = queue.pop()
            after_swap = swapped.is_set()
            path = f"/rollouts/{rollout_id}/attempts/{attempt_id}/v1/chat/completions"
            async with session.post(path, data=body, headers={"content-type": "application/json"}) as answer:
                await answer.read()
                statuses.append(answer.status)
            calls_started_after_swap += after_swap

    async def operator(base: str) -> None:
        while len(statuses) < CALLS_BEFORE:
            await asyncio.sleep(0.01)
        routes = {"routes": split(url, 0.9), "if_id": old}
        async with (
            aiohttp.ClientSession(base) as session,  # its own connection: the agents hold theirs
            session.put(ROUTES_PATH, json=routes) as answer,
        ):
            swap_answer.update(await answer.json(), status=answer.status)
        swapped.set()

    async def load(base: str) -> float:
        queue = list(reversed(rollouts))
        started = time.perf_counter()
        connector = aiohttp.TCPConnector(limit=AGENTS)
        async with aiohttp.ClientSession(base, connector=connector) as session:
            await asyncio.gather(operator(base), *(agent(session, queue) for _ in range(AGENTS)))
        return time.perf_counter() - started

    with ServerThread(gateway) as served:
        seconds = asyncio.run(load(served.url))
        samples = scrape(served.url)
    assert swap_answer["status"] == 200 and swap_answer["generation"] == 2, swap_answer
    new = swap_answer["id"]
    assert statuses and set(statuses) == {200}  # 0 failed calls

    spans = spans_of(store, [rollout_id for rollout_id, _ in rollouts])
    assert len(spans) == len(statuses)
    by_table: dict[str, Counter[str]] = {old: Counter(), new: Counter()}
    for span in spans:
        by_table[span.attributes[sc.ROUTE_TABLE]][span.attributes[sc.AB_ARM]] += 1
    before, after = by_table[old], by_table[new]
    share_before, share_after = before["b"] / before.total(), after["b"] / after.total()
    print(
        f"\n{AGENTS} agents, {len(statuses)} calls in {seconds:.1f} s ({len(statuses) / seconds:.0f}/s), 0 failed; "
        f"50/50 table: {before.total()} calls, {share_before:.1%} on b; 90/10 table: {after.total()} calls, "
        f"{share_after:.1%} on b"
    )
    assert after.total() >= CALLS_AFTER
    assert abs(share_after - 0.9) <= 0.02
    assert abs(share_before - 0.5) <= 0.06  # fewer calls on the old table: a looser bound
    assert value(samples, "agentgrad_gateway_route_table_swaps_total", outcome="applied") == 1
    assert value(samples, "agentgrad_gateway_ab_calls_total", model="policy", arm="b") == before["b"] + after["b"]


def test_calls_in_flight_finish_on_the_table_they_started_with_and_later_calls_take_the_new_one(
    upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = upstream
    fake.stream_gate = threading.Event()
    store = MemoryStore()
    rollouts = started_rollouts(store, 5)
    gateway = Gateway(store, {"policy": Backend(url, system="vllm", model="step-1")})
    old = gateway.table.id
    with ServerThread(gateway) as served:

        def call(rollout: tuple[str, str]) -> str:
            client = openai.OpenAI(
                base_url=f"{served.url}/rollouts/{rollout[0]}/attempts/{rollout[1]}/v1", api_key="-", max_retries=0
            )
            stream = client.chat.completions.create(model="policy", messages=HELLO, stream=True)
            return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

        held = [threading.Thread(target=call, args=(rollout,)) for rollout in rollouts[:4]]
        for thread in held:
            thread.start()
        deadline = time.monotonic() + 30
        while len(fake.requests) < 4 and time.monotonic() < deadline:  # all four reached the upstream, and wait
            time.sleep(0.01)
        new = gateway.reroute("policy", Backend(url, system="vllm", model="step-3"))
        fake.stream_gate.set()
        for thread in held:
            thread.join(30)
        call(rollouts[4])
    spans = {span.rollout_id: span for span in spans_of(store, [rollout_id for rollout_id, _ in rollouts])}
    assert len(spans) == 5 and all(span.status.code == "OK" for span in spans.values())
    assert [spans[r].attributes[sc.ROUTE_TABLE] for r, _ in rollouts] == [old] * 4 + [new.id]
    assert [request["model"] for request in fake.requests] == ["step-1"] * 4 + ["step-3"]
    assert new.generation == 2 and new.id != old


BAD_TABLES = [
    ({"upstreams": {"a": {"url": "{url}", "models": ["policy"], "colour": "red"}}}, "unknown keys ['colour']"),
    ({"upstreams": {"a": {"url": "ftp://nowhere", "models": ["policy"]}}}, "is not an http(s) URL"),
    ({"upstreams": {"a": {"url": "{url}", "models": ["policy"], "key_env": "NO_SUCH_KEY_VAR"}}}, "$NO_SUCH_KEY_VAR"),
    ({"upstreams": {"a": {"url": "{url}", "models": ["policy"], "timeout_s": "soon"}}}, "a number of seconds"),
    (
        {"upstreams": {"a": {"url": "{url}"}}, "ab": {"policy": {"arms": ["a", "z"]}}},
        "[ab] arms name ['z'], which are not [upstreams.NAME] tables",
    ),
    (
        {"upstreams": {"a": {"url": "{url}", "models": ["policy"], "system": "vllm", "cache": True}}},
        "never come from a cache",
    ),
]


def test_a_bad_table_is_refused_whole_with_the_reason_and_the_old_one_keeps_serving(
    upstream: tuple[FakeUpstream, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = upstream
    gateway = Gateway(MemoryStore(), {"policy": Backend(url, system="vllm")}, token="tok")
    auth = {"authorization": "Bearer tok"}
    with ServerThread(gateway) as served:
        assert httpx.get(served.url + ROUTES_PATH).status_code == 401  # the admin route needs the token
        assert httpx.put(served.url + ROUTES_PATH, json={"routes": split(url, 0.9)}).status_code == 401
        shown = httpx.get(served.url + ROUTES_PATH, headers=auth).json()
        for table, reason in BAD_TABLES:
            posted = json.loads(json.dumps(table).replace("{url}", url))
            answer = httpx.put(served.url + ROUTES_PATH, json={"routes": posted}, headers=auth)
            assert answer.status_code == 400, answer.text
            message = answer.json()["error"]["message"]
            assert reason in message and f"the old one ({shown['id']}) keeps serving" in message, message
        stale = httpx.put(served.url + ROUTES_PATH, json={"routes": split(url, 0.5), "if_id": "0" * 12}, headers=auth)
        assert stale.status_code == 409 and "changed since you read it" in stale.json()["error"]["message"]
        with monkeypatch.context() as patched:  # a table past the body limit is refused as such, not read in part
            patched.setattr("agentgrad.gateway.admin.MAX_BODY_BYTES", 100)
            large = httpx.put(served.url + ROUTES_PATH, json={"routes": split(url, 0.5)}, headers=auth)
        assert large.status_code == 413 and "limit of 100 bytes" in large.json()["error"]["message"]
        assert httpx.get(served.url + ROUTES_PATH, headers=auth).json() == shown  # untouched
        client = openai.OpenAI(base_url=served.url + "/v1", api_key="tok", max_retries=0)
        assert client.chat.completions.create(model="policy", messages=HELLO).choices[0].message.content
        samples = scrape(served.url, "tok")
    assert value(samples, "agentgrad_gateway_route_table_swaps_total", outcome="refused") == len(BAD_TABLES)
    assert value(samples, "agentgrad_gateway_route_table_swaps_total", outcome="conflict") == 1
    assert shown["generation"] == 1 and shown["routes"]["upstreams"]["policy"]["models"] == ["policy"]


def test_the_cli_shows_the_table_and_sets_one_from_a_toml_file_refusing_a_bad_one(
    upstream: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    _, url = upstream
    gateway = Gateway(MemoryStore(), {"policy": Backend(url, system="vllm", model="step-3")}, token="tok")
    good, bad = tmp_path / "rollback.toml", tmp_path / "bad.toml"
    good.write_text(f'[upstreams.best]\nurl = "{url}"\nsystem = "vllm"\nmodel = "step-1"\nmodels = ["policy"]\n')
    bad.write_text(f'[upstreams.best]\nurl = "{url}"\nmodels = ["policy"]\ntimeout_s = -1\n')

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/bin:/bin", "AGENTGRAD_TOKEN": "tok", "COLUMNS": "200"}
        command = [sys.executable, "-m", "agentgrad.cli", "gateway", "routes", *args, "--gateway", served.url]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)

    with ServerThread(gateway) as served:
        shown = cli("show")
        assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == gateway.table.id, shown.stdout
        refused = cli("set", str(bad))
        assert refused.returncode == 2 and "timeout_s is a number above 0" in refused.stdout, refused.stdout
        applied = cli("set", str(good), "--if-id", gateway.table.id)
        assert applied.returncode == 0 and "generation 2" in applied.stdout, applied.stdout + applied.stderr
        answer = openai.OpenAI(base_url=served.url + "/v1", api_key="tok").chat.completions.create(
            model="policy", messages=HELLO
        )
    assert answer.model == "step-1"  # the upstream was asked for the version the new table names
    assert gateway.table.spec["upstreams"]["policy"]["model"] == "step-1"
