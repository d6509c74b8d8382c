"""The examples run unchanged through runner → gateway → a fake upstream."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from agentgrad.rollout.gateway_env import GatewayEnvHook
from agentgrad.rollout.runner import Runner
from agentgrad.semconv import is_llm_call, recorded_choices
from tests.conftest import Served

EXAMPLES = Path(__file__).parent.parent / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_langchain_agent_with_a_tool_is_recorded_call_by_call(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    example = load("langchain_agent")
    tasks = example.TASKS[:2]
    rollouts = await served.store.enqueue_rollouts([{"input": task} for task in tasks])
    await Runner(example.calc_agent, served.store, hooks=[GatewayEnvHook(served.url + "/v1")], max_rollouts=2).run()
    await served.gateway.flush()
    for rollout, task in zip(rollouts, tasks):
        assert (await served.store.get_rollout(rollout.rollout_id)).reward == 1.0
        asked, answered = [s for s in await served.store.query_spans(rollout.rollout_id) if is_llm_call(s)]
        (tool_call,) = json.loads(asked.attributes["gen_ai.output.messages"])[0]["tool_calls"]
        assert tool_call["function"]["name"] == "add"
        assert json.loads(asked.attributes["gen_ai.tool.definitions"])[0]["function"]["name"] == "add"
        history = json.loads(answered.attributes["gen_ai.input.messages"])
        assert [m["role"] for m in history] == ["user", "assistant", "tool"] and history[2]["content"] == str(
            task["answer"]
        )
        (choice,) = recorded_choices(answered)
        assert bytes(choice.response_token_ids or []).decode() == f"Answer: {task['answer']}"
        assert bytes(choice.prompt_token_ids or []).decode().startswith(f"<user>{task['question']}")


async def test_the_openai_agent_shares_one_client_across_concurrent_rollouts(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentgrad.rollout.instrument import instrument_openai, uninstrument_openai

    monkeypatch.setenv("OPENAI_BASE_URL", served.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "agentgrad")
    example = load("openai_agent")
    instrument_openai()
    try:
        rollouts = await served.store.enqueue_rollouts([{"input": {"question": f"say {i}"}} for i in range(8)])
        await Runner(example.echo_agent, served.store, concurrency=8, max_rollouts=8).run()
    finally:
        uninstrument_openai()
        await example.client.close()  # the module's client: closed in this test's loop, not left to a later one's
    await served.gateway.flush()
    for rollout in rollouts:
        assert (await served.store.get_rollout(rollout.rollout_id)).reward == 1.0
        (call,) = [s for s in await served.store.query_spans(rollout.rollout_id) if is_llm_call(s)]
        assert json.loads(call.attributes["gen_ai.input.messages"])[0]["content"] == rollout.input["question"]


async def test_the_calc_agent_calls_its_calculate_function_and_answers_from_the_result(served: Served) -> None:
    import agentgrad as ag

    example = load("calc_agent")
    _, tasks = example.make_splits(n_train=4, n_val=2, demo="function")
    rollouts = await served.store.enqueue_rollouts([{"input": task} for task in tasks])
    llm = ag.LLM(base_url=served.url + "/v1", model="policy", proxied=True, sampling_parameters={"temperature": 0.0})
    await served.store.add_resources({"llm": llm})
    await Runner(example.calc_agent, served.store, max_rollouts=2).run()
    await served.gateway.flush()
    for rollout, task in zip(rollouts, tasks):
        assert (await served.store.get_rollout(rollout.rollout_id)).reward == 1.0
        asked, answered = [s for s in await served.store.query_spans(rollout.rollout_id) if is_llm_call(s)]
        (tool_call,) = json.loads(asked.attributes["gen_ai.output.messages"])[0]["tool_calls"]
        assert json.loads(tool_call["function"]["arguments"]) == {"expression": f"{task['a']} + {task['b']}"}
        history = json.loads(answered.attributes["gen_ai.input.messages"])
        assert history[-1] == {"role": "tool", "tool_call_id": tool_call["id"], "content": str(task["answer"])}
