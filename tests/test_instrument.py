"""Zero-change paths: agents that build `OpenAI()` with no arguments, and one client shared by concurrent rollouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest

from agentgrad.rollout.gateway_env import GatewayEnvHook
from agentgrad.rollout.instrument import instrument_openai, uninstrument_openai
from agentgrad.rollout.runner import Runner
from agentgrad.semconv import is_llm_call
from tests.conftest import Served


@pytest.fixture(autouse=True)
def clean_openai_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "the user's own key")
    yield
    uninstrument_openai()


async def assert_each_rollout_has_its_call(served: Served, rollouts: list, expected: int = 1) -> None:  # type: ignore[type-arg]
    await served.gateway.flush()
    for rollout in rollouts:
        stored = await served.store.get_rollout(rollout.rollout_id)
        assert stored.status.value == "succeeded", (await served.store.query_attempts(rollout.rollout_id))[-1].error
        calls = [s for s in await served.store.query_spans(rollout.rollout_id) if is_llm_call(s)]
        assert len(calls) == expected
        for call in calls:
            assert json.loads(call.attributes["gen_ai.input.messages"])[0]["content"] == f"task {rollout.input}"
    assert [s for s in await served.store.query_spans(None) if is_llm_call(s)] == []


def ask(client: openai.OpenAI, task: int) -> float:
    answer = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": f"task {task}"}])
    return float(answer.choices[0].message.content == f"echo: task {task}")


async def test_the_env_hook_routes_an_agent_that_builds_openai_with_no_arguments(served: Served) -> None:
    rollouts = await served.store.enqueue_rollouts([{"input": i} for i in range(3)])
    seen: list[str] = []

    def agent(task: int) -> float:
        seen.append(os.environ["OPENAI_BASE_URL"])
        return ask(openai.OpenAI(), task)  # unchanged agent code

    await Runner(agent, served.store, hooks=[GatewayEnvHook(served.url + "/v1")], max_rollouts=3).run()
    await assert_each_rollout_has_its_call(served, rollouts)
    assert len(set(seen)) == 3 and all("/rollouts/" in url for url in seen)
    assert "OPENAI_BASE_URL" not in os.environ and os.environ["OPENAI_API_KEY"] == "the user's own key"  # restored


async def test_the_env_hook_reaches_programs_the_agent_starts(served: Served) -> None:
    (rollout,) = await served.store.enqueue_rollouts([{"input": 7}])
    child = (
        "import openai; c = openai.OpenAI().chat.completions.create(model='policy', "
        "messages=[{'role': 'user', 'content': 'task 7'}]); print(c.choices[0].message.content)"
    )

    def agent(task: int) -> float:
        out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return float(out.stdout.strip() == "echo: task 7")

    await Runner(agent, served.store, hooks=[GatewayEnvHook(served.url + "/v1")], max_rollouts=1).run()
    await assert_each_rollout_has_its_call(served, [rollout])
    assert (await served.store.get_rollout(rollout.rollout_id)).reward == 1.0


async def test_instrumented_async_rollouts_sharing_one_client_route_by_context(served: Served) -> None:
    instrument_openai()
    shared = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="agentgrad")  # no route in the URL
    rollouts = await served.store.enqueue_rollouts([{"input": i} for i in range(16)])

    async def agent(task: int) -> float:
        rewards = []
        for _ in range(2):
            answer = await shared.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": f"task {task}"}]
            )
            rewards.append(answer.choices[0].message.content == f"echo: task {task}")
        return float(all(rewards))

    await Runner(agent, served.store, concurrency=8, max_rollouts=16).run()
    await shared.close()  # in this test's loop, not a later test's (where the garbage collector would close it)
    await assert_each_rollout_has_its_call(served, rollouts, expected=2)
    spans = await served.store.query_spans(rollouts[0].rollout_id)
    (root,) = [s for s in spans if s.name == "agentgrad.rollout"]
    assert all(s.parent_id == root.span_id and s.trace_id == root.trace_id for s in spans if is_llm_call(s))


async def test_instrumented_sync_rollouts_in_threads_sharing_one_client_route_by_context(served: Served) -> None:
    instrument_openai()
    instrument_openai()  # idempotent
    shared = openai.OpenAI(base_url=served.url + "/v1", api_key="agentgrad")
    rollouts = await served.store.enqueue_rollouts([{"input": i} for i in range(12)])
    await Runner(lambda task: ask(shared, task), served.store, concurrency=4, max_rollouts=12).run()
    await assert_each_rollout_has_its_call(served, rollouts)


async def test_the_env_hook_falls_back_to_context_routing_when_attempts_overlap(served: Served) -> None:
    rollouts = await served.store.enqueue_rollouts([{"input": i} for i in range(8)])
    await Runner(
        lambda task: ask(openai.OpenAI(), task),
        served.store,
        hooks=[GatewayEnvHook(served.url + "/v1")],
        concurrency=4,
        max_rollouts=8,
    ).run()
    await assert_each_rollout_has_its_call(served, rollouts)
    assert "OPENAI_BASE_URL" not in os.environ


async def test_outside_a_rollout_the_instrumented_client_adds_nothing(served: Served) -> None:
    instrument_openai()
    ask(openai.OpenAI(base_url=served.url + "/v1", api_key="agentgrad"), 0)
    await served.gateway.flush()
    (span,) = await served.store.query_spans(None)
    assert span.rollout_id is None and span.parent_id is None


AGENTS_SDK_TRACES = """
import sys
{before}
import agentgrad as ag
ag.instrument_openai()
from agents.tracing import get_trace_provider
print(type(get_trace_provider().create_trace("rollout")).__name__)
"""


@pytest.mark.slow
@pytest.mark.parametrize("before", ["", "from agents.tracing import get_trace_provider; get_trace_provider().create_trace('x')"],
                         ids=["sdk-imported-after", "sdk-already-tracing"])
def test_instrumenting_openai_turns_off_the_agents_sdks_trace_upload(before: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_AGENTS_DISABLE_TRACING"}
    out = subprocess.run([sys.executable, "-c", AGENTS_SDK_TRACES.format(before=before)], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.strip() == "NoOpTrace"
