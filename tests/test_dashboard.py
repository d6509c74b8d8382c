"""The dashboard as the store server serves it: the page, its assets, and every API call its script makes.

The server is built the way `agentgrad serve` builds it: every store server has the dashboard at `/`
over a SQLite store holding one run's worth of everything the page shows. No browser is needed, except
for the last test, which runs only where Chromium is installed.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from agentgrad.dashboard import STATIC, dashboard_routes
from agentgrad.serving import ServerThread
from agentgrad.store import SqliteStore
from agentgrad.store.api import OPERATIONS
from agentgrad.store.server import create_app
from agentgrad.types import LLM, Metric, PromptTemplate, Run, RunStatus, Span, SpanEvent, SpanStatus

SCRIPT = (STATIC / "dashboard.js").read_text()
SECRET_KEY = "sk-never-in-the-page"
QUESTION = "What is 17 + 25?"
STACKTRACE = 'Traceback (most recent call last):\n  File "agent.py", line 3\nZeroDivisionError: division by zero'


async def fill(store: SqliteStore) -> dict[str, str]:
    """A small finished run: two resource versions, a rewarded rollout with an LLM call, a failed one with an
    exception, one still queued, a worker and four groups of curves. Returns the ids the tests need."""
    first = await store.add_resources(
        {"main_llm": LLM(base_url="http://127.0.0.1:4780/v1", model="smollm2-135m", api_key_env="AGENTGRAD_TEST_KEY"),
         "prompt": PromptTemplate(template="Solve: {question}\nAnswer: <number>")},
        {"score": 0.25},
    )
    await store.add_resources(
        {"main_llm": LLM(base_url="http://127.0.0.1:4780/v1", model="smollm2-135m", api_key_env="AGENTGRAD_TEST_KEY"),
         "prompt": PromptTemplate(template="Add the numbers. {question}\nReply as 'Answer: <number>'.")},
        {"score": 0.75, "parent": first.resources_id, "status": "accepted"},
    )

    good = await store.start_rollout({"question": QUESTION, "answer": 42}, mode="train", worker_id="worker-1")
    gid, gat = good.rollout_id, good.attempt.attempt_id
    trace = "ab" * 16
    messages = [{"role": "system", "content": "Reply as 'Answer: <number>'."}, {"role": "user", "content": QUESTION}]
    await store.add_spans([
        Span(rollout_id=gid, attempt_id=gat, trace_id=trace, span_id="1" * 16, name="agentgrad.rollout",
             start_time=100.0, end_time=101.5, attributes={"agentgrad.rollout_id": gid, "agentgrad.agent.name": "calc"}),
        Span(rollout_id=gid, attempt_id=gat, trace_id=trace, span_id="2" * 16, parent_id="1" * 16, name="chat smollm2",
             start_time=100.1, end_time=101.0, attributes={
                 "gen_ai.operation.name": "chat", "gen_ai.request.model": "smollm2-135m",
                 "gen_ai.input.messages": json.dumps(messages),
                 "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": "Answer: 42"}]),
                 "gen_ai.usage.input_tokens": 31, "gen_ai.usage.output_tokens": 5,
                 "agentgrad.llm.latency_ms": 912.5, "agentgrad.llm.weights_version": 2,
                 "agentgrad.llm.prompt_token_ids": list(range(31)), "agentgrad.llm.response_token_ids": [1, 2, 3, 4, 5],
             }),
        Span(rollout_id=gid, attempt_id=gat, trace_id=trace, span_id="3" * 16, parent_id="1" * 16,
             name="agentgrad.reward", start_time=101.1, end_time=101.1, attributes={"agentgrad.reward": 1.0}),
    ])
    await store.update_attempt(gid, gat, status="succeeded", reward=1.0)

    bad = await store.start_rollout({"question": "What is 1/0?"}, mode="val", worker_id="worker-1")
    bid, bat = bad.rollout_id, bad.attempt.attempt_id
    await store.add_spans([Span(
        rollout_id=bid, attempt_id=bat, span_id="4" * 16, name="agentgrad.exception", status=SpanStatus(code="ERROR"),
        attributes={"exception.type": "ZeroDivisionError", "exception.message": "division by zero",
                     "exception.stacktrace": STACKTRACE},
        events=[SpanEvent(name="log", time=1.0, attributes={"line": "<script>alert(1)</script>"})],
    )])
    await store.update_attempt(bid, bat, status="failed", error="ZeroDivisionError: division by zero")

    queued = await store.enqueue_rollout({"question": "What is 3 + 4?"}, mode="train")
    await store.heartbeat("worker-1", status="busy", active_attempts=[(gid, gat)], info={"host": "box", "pid": 4242})
    await store.add_metrics([
        Metric(name=name, step=step, value=value(step))
        for step in range(10)
        for name, value in {
            "train/reward_mean": lambda s: 0.2 + 0.05 * s, "train/loss": lambda s: 1.0 / (s + 1),
            "val/accuracy": lambda s: 0.24 + 0.04 * s, "perf/tokens_per_s": lambda s: 250.0 + s,
            "apo/score": lambda s: 0.5,
        }.items()
    ])
    await fill_runs(store)
    return {"good": gid, "good_attempt": gat, "bad": bid, "bad_attempt": bat, "queued": queued.rollout_id}


RUNS = {"run-slow": ("grpo-lr1e-5", lambda s: 0.2 + 0.03 * s), "run-fast": ("grpo-lr3e-5", lambda s: 0.2 + 0.08 * min(s, 6) - 0.05 * max(0, s - 6))}
"""Two recorded runs whose val/accuracy curves differ: the second rises faster, then falls after step 6."""


async def fill_runs(store: SqliteStore) -> None:
    for i, (run_id, (name, curve)) in enumerate(RUNS.items()):
        await store.put_run(Run(
            run_id=run_id, name=name, algorithm="GRPO", status=RunStatus.SUCCEEDED, start_time=1796170000.0 + 700 * i,
            end_time=1796170600.0 + 700 * i, config={"learning_rate": 1e-5 * (1 + 2 * i)}, final={"val/accuracy": curve(9)},
            best={"val/accuracy": max(curve(s) for s in range(10)), "step": 9 if i == 0 else 6},
            checkpoints=[f"/ckpt/{name}/step-{9 if i == 0 else 6}"], best_checkpoint=f"/ckpt/{name}/step-{9 if i == 0 else 6}",
            best_checkpoint_validation={"val/accuracy": max(curve(s) for s in range(10)), "step": 9 if i == 0 else 6},
        ))
        await store.add_metrics([Metric(name="val/accuracy", step=s, value=curve(s), run_id=run_id) for s in range(10)])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    store = SqliteStore(tmp_path_factory.mktemp("dashboard") / "store.db")
    ids = asyncio.run(fill(store))
    with ServerThread(create_app(store)) as server:
        yield server.url, ids
    asyncio.run(store.close())


def script_calls() -> set[tuple[str, str]]:
    """Every `call("METHOD", "api/...")` in the script: the endpoints the page depends on."""
    found = re.findall(r'\bcall\("(GET|POST|PATCH)", "(api/[^"]*)"', SCRIPT)
    assert len(found) == len(re.findall(r"\bcall\(", SCRIPT)) - 1, "a call in the script has no literal method and path"
    return set(found)


def keys(*names: str) -> Callable[[Any], None]:
    """A check that a JSON object has the fields the script reads."""

    def check(item: Any) -> None:
        assert isinstance(item, dict) and set(names) <= set(item), f"{sorted(item)} lacks some of {names}"

    return check


def each(check: Callable[[Any], None]) -> Callable[[Any], None]:
    def check_all(items: Any) -> None:
        assert isinstance(items, list) and items, "expected a non-empty list"
        for item in items:
            check(item)

    return check_all


ROLLOUT = keys("rollout_id", "status", "mode", "num_attempts", "reward", "start_time", "end_time", "enqueue_time",
               "input", "metadata", "resources_id")
ATTEMPT = keys("attempt_id", "sequence", "status", "worker_id", "start_time", "end_time", "reward", "error")
SPAN = keys("span_id", "parent_id", "sequence_id", "name", "start_time", "end_time", "attributes", "events", "status")
SNAPSHOT = keys("resources_id", "version", "create_time", "metadata", "resources")
WORKER = keys("worker_id", "status", "last_heartbeat_time", "active_attempts", "info")
METRIC = keys("name", "step", "value")
RUN = keys("run_id", "name", "algorithm", "status", "start_time", "end_time", "best", "best_checkpoint", "checkpoints",
           "best_checkpoint_validation")


def run_metrics(points: Any) -> None:
    each(METRIC)(points)
    assert {p["run_id"] for p in points} == {"run-fast"}


def has_llm_call(spans: list[dict[str, Any]]) -> None:
    each(SPAN)(spans)
    llm = next(s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat")
    assert json.loads(llm["attributes"]["gen_ai.input.messages"])[1] == {"role": "user", "content": QUESTION}
    assert llm["status"]["code"] in ("UNSET", "OK", "ERROR")


def healthy(body: Any) -> None:
    assert body == {"status": "ok"}


def query_body(ids: dict[str, str]) -> dict[str, Any]:
    """The body the script sends, with every field it may set."""
    return {"status": ["succeeded", "queuing"], "mode": "train", "limit": 50, "offset": 0}


# (method, path as the script writes it) → (how the test fills it, body, check of the answer)
EXPECTED: dict[tuple[str, str], tuple[Callable[[dict[str, str]], dict[str, str]], Any, Callable[[Any], None]]] = {
    ("GET", "api/health"): (lambda ids: {}, None, healthy),
    ("GET", "api/stats"): (lambda ids: {}, None, keys("rollouts", "attempts", "spans", "workers", "resources")),
    ("GET", "api/metrics"): (lambda ids: {}, None, each(METRIC)),
    ("POST", "api/rollouts/query"): (lambda ids: {}, query_body, each(ROLLOUT)),
    ("GET", "api/rollouts/{rollout_id}"): (lambda ids: {"rollout_id": ids["good"]}, None, ROLLOUT),
    ("GET", "api/rollouts/{rollout_id}/attempts"): (lambda ids: {"rollout_id": ids["bad"]}, None, each(ATTEMPT)),
    ("GET", "api/spans?rollout_id={rollout_id}&attempt_id={attempt_id}"): (
        lambda ids: {"rollout_id": ids["good"], "attempt_id": ids["good_attempt"]}, None, has_llm_call),
    ("GET", "api/resources"): (lambda ids: {}, None, each(SNAPSHOT)),
    ("GET", "api/workers"): (lambda ids: {}, None, each(WORKER)),
    ("GET", "api/runs"): (lambda ids: {}, None, each(RUN)),
    ("GET", "api/metrics?run_id={run_id}"): (lambda ids: {"run_id": "run-fast"}, None, run_metrics),
}


def test_the_page_is_served_at_the_root_with_every_asset_it_references(served) -> None:  # type: ignore[no-untyped-def]
    url, _ = served
    page = httpx.get(url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assets = re.findall(r'(?:src|href)="(dashboard/[^"]+)"', page.text)
    assert {Path(a).suffix for a in assets} == {".js", ".css"}
    expected_type = {".js": "text/javascript", ".css": "text/css"}
    for asset in assets:
        answer = httpx.get(f"{url}/{asset}")
        assert answer.status_code == 200, asset
        assert answer.headers["content-type"].split(";")[0] == expected_type[Path(asset).suffix], asset
        assert answer.content == (STATIC / Path(asset).name).read_bytes()
    assert httpx.get(url + "/dashboard/missing.js").status_code == 404


def test_every_endpoint_the_script_calls_exists_and_answers_with_what_the_script_reads(served) -> None:  # type: ignore[no-untyped-def]
    url, ids = served
    calls = script_calls()
    routes = {(op.method, op.path) for op in OPERATIONS} | {("GET", "/api/health")}
    for method, template in calls:
        assert (method, "/" + template.split("?")[0]) in routes, f"the script calls {method} {template}, which the server lacks"
    assert calls == set(EXPECTED), "the script's calls and this test's table have drifted apart"
    for (method, template), (params_of, body_of, check) in EXPECTED.items():
        path = template.format(**params_of(ids))
        answer = httpx.request(method, f"{url}/{path}", json=body_of(ids) if body_of else None)
        assert answer.status_code == 200, f"{method} {path}: {answer.text}"
        check(answer.json())


def test_the_stats_and_the_rollout_query_agree_on_counts_for_newest_first_paging(served) -> None:  # type: ignore[no-untyped-def]
    """Newest first pages from the end of the enqueue order, using the stats' counts by status."""
    url, ids = served
    stats = httpx.get(url + "/api/stats").json()
    assert stats["rollouts"] == {"succeeded": 1, "failed": 1, "queuing": 1}
    everything = httpx.post(url + "/api/rollouts/query", json={"status": None, "mode": None, "limit": 2, "offset": 1}).json()
    assert [r["rollout_id"] for r in everything] == [ids["bad"], ids["queued"]]


def test_the_script_builds_the_page_from_text_nodes_only() -> None:
    """Span attributes are user data: nothing may parse a string as HTML."""
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in SCRIPT, sink


def test_with_a_token_the_page_loads_and_only_the_api_needs_the_token(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    with ServerThread(create_app(store, token="s3cret")) as server:
        assert httpx.get(server.url + "/api/stats").status_code == 401
        assert httpx.get(server.url + "/api/stats", headers={"authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(server.url + "/").status_code == 200
        assert httpx.get(server.url + "/dashboard/dashboard.js").status_code == 200
    asyncio.run(store.close())


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def rendered(url: str, tmp_path: Path) -> str:
    """The page's DOM after its script ran (fetches included), from headless Chromium."""
    assert CHROMIUM is not None, "the browser tests need Chromium: `make test` installs it (apt-get install chromium)"
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-sync", "--disable-component-update", f"--user-data-dir={tmp_path / 'chromium'}",
         "--virtual-time-budget=4000", "--dump-dom", url],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return result.stdout


@pytest.mark.slow
def test_a_browser_renders_the_stores_data(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, ids = served
    curves = rendered(url + "/#curves", tmp_path)
    for name in ("train/reward_mean", "train/loss", "val/accuracy", "perf/tokens_per_s", "apo/score"):
        assert name in curves
    assert curves.index(">train/<") < curves.index(">val/<") < curves.index(">perf/<") < curves.index(">apo/<")

    rollouts = rendered(url + "/#rollouts", tmp_path)
    assert rollouts.index(ids["queued"]) < rollouts.index(ids["bad"]) < rollouts.index(ids["good"])  # newest first

    good = rendered(f"{url}/#rollout/{ids['good']}", tmp_path)
    assert QUESTION in good and "Answer: 42" in good and "912.5 ms" in good and "31 prompt + 5 response" in good
    assert "reward <b>1</b>" in good

    bad = rendered(f"{url}/#rollout/{ids['bad']}", tmp_path)
    assert "ZeroDivisionError" in bad and "most recent call last" in bad
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in bad and "<script>alert" not in bad

    resources = rendered(url + "/#resources", tmp_path)
    assert "Reply as 'Answer: &lt;number&gt;'." in resources and "smollm2-135m" in resources
    assert SECRET_KEY not in resources

    workers = rendered(url + "/#workers", tmp_path)
    assert "worker-1" in workers and "s ago" in workers and "pid=4242" in workers


@pytest.mark.slow
def test_a_browser_compares_the_runs_curves_on_one_chart(served, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _ = served
    runs = rendered(url + "/#runs", tmp_path)
    for run_id, (name, _) in RUNS.items():
        assert run_id in runs and f"{name} ({run_id})" in runs  # in the table and in the chart's legend
    assert "/ckpt/grpo-lr3e-5/step-6 (val/accuracy 0.680 @ step 6)" in runs  # the best checkpoint, and its figure
    assert "val/accuracy 0.680 @ step 6" in runs
    chart = runs[runs.index('aria-label="val/accuracy by run"'):]
    assert chart.count('class="run-line"') == 2  # one chart, a line per run
    shot = screenshot(url + "/#runs", tmp_path)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def screenshot(url: str, tmp_path: Path, out: Path | None = None) -> Path:
    """A PNG of the page after its script ran, from headless Chromium (`docs/images/dashboard-runs.png` is one)."""
    assert CHROMIUM is not None, "the browser tests need Chromium: `make test` installs it (apt-get install chromium)"
    out = out or tmp_path / "page.png"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-sync", "--disable-component-update", f"--user-data-dir={tmp_path / 'chromium-shot'}",
         "--virtual-time-budget=4000", "--window-size=1100,900", "--hide-scrollbars", f"--screenshot={out}", url],
        capture_output=True, text=True, timeout=60, check=True,
    )
    return out


def with_page_public(protected: Any, token: str) -> Any:
    """The store server as it will be once its guard lets the page through: `/` and `/dashboard/` open, the rest
    behind the token. `/with-<token>` is the page with `<token>` already pasted into this tab's sessionStorage."""
    page = (STATIC / "index.html").read_text()
    public = Starlette(routes=[*dashboard_routes(), *(
        Route(f"/with-{t}", lambda request, t=t: HTMLResponse(
            page.replace("<head>", f"<head><script>sessionStorage.setItem('agentgrad.token', '{t}')</script>")))
        for t in (token, "wrong")
    )])

    async def app(scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        opened = path == "/" or path.startswith(("/dashboard/", "/with-"))
        await (public if scope["type"] == "http" and opened else protected)(scope, receive, send)

    return app


@pytest.mark.slow
def test_a_browser_asks_for_the_token_and_sends_it_on_every_call(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    queued = asyncio.run(store.enqueue_rollout("a task"))
    with ServerThread(with_page_public(create_app(store, token="s3cret"), "s3cret")) as server:
        asked = rendered(server.url + "/#rollouts", tmp_path)
        assert '<form id="token-bar" class="bar">' in asked and "needs its token" in asked
        assert queued.rollout_id not in asked

        refused = rendered(server.url + "/with-wrong#rollouts", tmp_path)
        assert '<form id="token-bar" class="bar">' in refused and "token was refused" in refused

        shown = rendered(server.url + "/with-s3cret#rollouts", tmp_path)
        assert '<form id="token-bar" class="bar" hidden="">' in shown and queued.rollout_id in shown
    asyncio.run(store.close())
