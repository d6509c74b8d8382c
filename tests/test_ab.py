"""A/B serving: the gateway splits one model between two versions, sticky per rollout, the arm on each span,
and `agentgrad ab report` finds a known difference between them."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.cli.ab_report import collect, compare
from agentgrad.gateway import Gateway
from agentgrad.gateway.ab import ABSplit
from agentgrad.gateway.upstreams import Backend
from agentgrad.serving import ServerThread
from tests.helpers import free_port, wait_until


def version(answer: str) -> Starlette:
    """A model version that always answers `answer`: an OpenAI-compatible chat endpoint on loopback."""

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@ag.rollout
def two_call_agent(task: dict, llm: ag.LLM) -> float:
    """Asks twice (both calls must reach the same arm); reward 1 when the second answer is right."""
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    messages = [{"role": "user", "content": f"{task['a']} + {task['b']}?"}]
    first = client.chat.completions.create(model=llm.model, messages=messages).choices[0].message.content or ""
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "Sure?"}]
    second = client.chat.completions.create(model=llm.model, messages=messages).choices[0].message.content or ""
    return 1.0 if second.strip() == "42" else 0.0


@pytest.mark.slow
def test_each_rollout_sticks_to_one_arm_and_the_report_finds_the_better_version(tmp_path: Path) -> None:
    store = ag.SqliteStore(tmp_path / "ab.db")
    with ServerThread(version("41")) as old, ServerThread(version("42")) as new:
        split = ABSplit(
            "policy", {"a-old": Backend(old.url + "/v1"), "b-new": Backend(new.url + "/v1")}, share={"b-new": 0.5}
        )
        with ServerThread(Gateway(store, routers={"policy": split})) as gateway:
            llm = ag.LLM(base_url=gateway.url + "/v1", model="policy", proxied=True)
            trainer = ag.Trainer(store=store, n_runners=2, resources={"llm": llm})
            trainer.fit(two_call_agent, [{"a": 20, "b": 22, "i": i} for i in range(40)])

    async def arms_by_rollout() -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for rollout in await store.query_rollouts():
            spans = await store.query_spans(rollout.rollout_id)
            found[rollout.rollout_id] = [s.attributes[sc.AB_ARM] for s in spans if sc.AB_ARM in s.attributes]
        return found

    arms = asyncio.run(arms_by_rollout())
    assert all(len(calls) == 2 and len(set(calls)) == 1 for calls in arms.values())  # sticky: both calls, one arm
    assert all(calls[0] == split.arm_of(rid) for rid, calls in arms.items())
    shares = Counter(calls[0] for calls in arms.values())
    assert shares["a-old"] >= 5 and shares["b-new"] >= 5  # both arms saw traffic

    report = asyncio.run(collect(store))
    old_arm, new_arm = report.arms
    assert (old_arm.name, old_arm.reward_mean, new_arm.name, new_arm.reward_mean) == ("a-old", 0.0, "b-new", 1.0)
    assert report.difference == 1.0 and report.mixed == 0 and report.p_value == 0.0

    printed = subprocess.run(
        [sys.executable, "-m", "agentgrad.cli", "ab", "report", "--store", str(tmp_path / "ab.db")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert printed.returncode == 0, printed.stdout + printed.stderr
    assert (
        "b-new" in printed.stdout and "100.0%" in printed.stdout and "reward b-new - a-old: +1.0000" in printed.stdout
    )


def test_the_interval_of_a_known_difference_covers_it_and_excludes_zero() -> None:
    a = [1.0] * 30 + [0.0] * 70  # 30% success
    b = [1.0] * 60 + [0.0] * 40  # 60%
    report = compare({"a": a, "b": b})
    assert report.difference == pytest.approx(0.3)
    low, high = report.interval  # type: ignore[misc]
    se = (0.3 * 0.7 * 100 / 99 / 100 + 0.6 * 0.4 * 100 / 99 / 100) ** 0.5
    assert (low, high) == pytest.approx((0.3 - 1.959964 * se, 0.3 + 1.959964 * se), abs=1e-6)
    assert low > 0 and report.p_value is not None and report.p_value < 1e-4
    same = compare({"a": a, "b": list(a)})
    assert same.interval is not None and same.interval[0] < 0 < same.interval[1] and same.p_value == pytest.approx(1.0)
    assert compare({"a": [1.0]}).difference is None  # one arm: nothing to compare


def test_a_split_checks_its_arms_and_shares_and_is_sticky_across_restarts() -> None:
    arms = {"a": Backend("http://127.0.0.1:9/v1"), "b": Backend("http://127.0.0.1:10/v1")}
    with pytest.raises(ValueError, match="two arms"):
        ABSplit("m", {"a": arms["a"]})
    with pytest.raises(ValueError, match="does not have"):
        ABSplit("m", arms, share={"c": 0.5})
    with pytest.raises(ValueError, match="add up to 1"):
        ABSplit("m", arms, share={"a": 0.5, "b": 0.6})
    tenth = ABSplit("m", arms, share={"b": 0.1})
    picks = Counter(tenth.arm_of(f"ro-{i}") for i in range(2000))
    assert 140 < picks["b"] < 260  # about 10%
    again = ABSplit("m", arms, share={"b": 0.1})
    assert all(again.arm_of(f"ro-{i}") == tenth.arm_of(f"ro-{i}") for i in range(200))


@ag.rollout
def asks_twice(task: dict, llm: ag.LLM) -> float:
    """Asks the same question twice, greedy (both calls must reach the same arm); reward 1 when both answers are
    the one `task["better"]` names."""
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=600)
    question = [{"role": "user", "content": "Name a colour of the sky."}]
    answers = [
        client.chat.completions.create(model=llm.model, messages=question, max_tokens=8, temperature=0)  # type: ignore[arg-type]
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    return 1.0 if answers == [task["better"]] * 2 else 0.0


@pytest.mark.slow
def test_one_engine_serves_both_arms_as_adapters_and_the_report_finds_the_better_one(
    two_versions: Any, tmp_path: Path
) -> None:
    from agentgrad.engine import SamplingParams
    from agentgrad.engine.server import create_engine_app

    engine = two_versions
    ids = engine.chat_prompt_ids([{"role": "user", "content": "Name a colour of the sky."}])
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    text = {
        a: engine.submit(ids, greedy, adapter=a).result(timeout=600).completions[0].text for a in ("step-1", "step-3")
    }
    assert text["step-1"] != text["step-3"], "the two versions must answer differently"

    store = ag.SqliteStore(tmp_path / "ab.db")
    with ServerThread(create_engine_app(engine)) as served:
        arms = {
            "a": Backend(served.url + "/v1", model="step-1", system="agentgrad"),
            "b": Backend(served.url + "/v1", model="step-3", system="agentgrad"),
        }
        split = ABSplit("policy", arms)
        with ServerThread(Gateway(store, routers={"policy": split})) as gateway:
            llm = ag.LLM(base_url=gateway.url + "/v1", model="policy", proxied=True)
            ag.Trainer(store=store, n_runners=2, resources={"llm": llm}).fit(
                asks_twice, [{"better": text["step-3"], "i": i} for i in range(12)]
            )

    async def calls_by_rollout() -> dict[str, list[tuple[str, str]]]:
        found = {}
        for rollout in await store.query_rollouts():
            spans = await store.query_spans(rollout.rollout_id)
            found[rollout.rollout_id] = [
                (s.attributes[sc.AB_ARM], s.attributes[sc.ADAPTER_NAME]) for s in spans if sc.is_llm_call(s)
            ]
        return found

    calls = asyncio.run(calls_by_rollout())
    assert len(calls) == 12 and all(len(c) == 2 and len(set(c)) == 1 for c in calls.values())  # sticky
    adapter_of = {"a": "step-1", "b": "step-3"}
    assert all(
        arm == split.arm_of(rid) and adapter == adapter_of[arm] for rid, c in calls.items() for arm, adapter in c
    )
    assert {c[0][0] for c in calls.values()} == {"a", "b"}  # both arms saw traffic

    report = asyncio.run(collect(store))
    assert [(arm.name, arm.reward_mean) for arm in report.arms] == [("a", 0.0), ("b", 1.0)]
    assert report.difference == 1.0


def answers_by_model() -> Starlette:
    """One upstream serving two versions by model name, as one engine serves two adapters: `step-3` answers 42,
    any other model 41."""

    async def chat(request: Request) -> JSONResponse:
        model = (await request.json())["model"]
        return JSONResponse(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "42" if model == "step-3" else "41"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            }
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


SPLIT_FILE = """
[upstreams.old]
url = "{url}/v1"
model = "step-1"

[upstreams.new]
url = "{url}/v1"
model = "step-3"

[ab.policy]
arms = ["old", "new"]
share = {{ new = 0.5 }}
seed = 7
"""


@pytest.mark.slow
def test_the_gateway_command_serves_a_split_from_the_routing_file(tmp_path: Path) -> None:
    store_path = tmp_path / "ab.db"
    store = ag.SqliteStore(store_path)
    port = free_port()
    with ServerThread(answers_by_model()) as upstream:
        (tmp_path / "routes.toml").write_text(SPLIT_FILE.format(url=upstream.url))
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentgrad.cli",
                "gateway",
                "--store",
                str(store_path),
                "--port",
                str(port),
                "--routes",
                str(tmp_path / "routes.toml"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: served_models(url) or process.poll() is not None, "the gateway command", timeout=60)
            assert served_models(url) == ["policy"], process.stderr.read() if process.poll() is not None else ""
            llm = ag.LLM(base_url=url + "/v1", model="policy", proxied=True)
            ag.Trainer(store=store, n_runners=2, resources={"llm": llm}).fit(
                two_call_agent, [{"a": 20, "b": 22, "i": i} for i in range(30)]
            )
        finally:
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr

    async def arms_by_rollout() -> dict[str, list[str]]:
        return {
            r.rollout_id: [
                s.attributes[sc.AB_ARM] for s in await store.query_spans(r.rollout_id) if sc.AB_ARM in s.attributes
            ]
            for r in await store.query_rollouts()
        }

    arms = asyncio.run(arms_by_rollout())
    same_split = ABSplit("policy", {"old": Backend("http://x/v1"), "new": Backend("http://x/v1")}, seed=7)
    assert all(len(calls) == 2 and calls == [same_split.arm_of(rid)] * 2 for rid, calls in arms.items())
    assert set(Counter(calls[0] for calls in arms.values())) == {"old", "new"}
    report = asyncio.run(collect(store))
    assert [(arm.name, arm.reward_mean) for arm in report.arms] == [("new", 1.0), ("old", 0.0)]


def served_models(url: str) -> list[str] | None:
    """The model ids a gateway lists, or None while it is not up yet."""
    try:
        return [m["id"] for m in httpx.get(url + "/v1/models", timeout=1).json()["data"]]
    except httpx.TransportError:
        return None
