"""Tool runs read from the conversation (`agentgrad.gateway.tool_runs`): a plain `openai` agent that runs its own
function gets a span per tool run, with no change and no hook, against the fake upstream behind a real gateway."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.rollout.gateway_env import GatewayEnvHook
from agentgrad.rollout.instrument import uninstrument_openai
from agentgrad.rollout.runner import Runner
from agentgrad.semconv import is_llm_call
from tests.conftest import UPSTREAM_KEY, Served

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
EXAMPLE: list[dict[str, Any]] = [  # a worked exchange whose made-up call is no run of this attempt
    {"role": "user", "content": "What is 1 + 1?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "calculate", "arguments": '{"expression": "1 + 1"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "2"},
    {"role": "assistant", "content": "Answer: 2"},
]


def calculate(expression: str) -> str:
    left, right = expression.split("+")
    return str(int(left) + int(right))


def plain_agent(leak: str = "", trace_itself: bool = False) -> Any:
    """Two questions in one conversation, each answered by running the tool the model asks for; `leak` is appended to
    every tool result, and `trace_itself` records each run as an `execute_tool` span of the agent's own."""

    def agent(task: dict[str, Any]) -> float:
        client = openai.OpenAI()  # the gateway's route of the attempt, from the environment
        messages: list[Any] = [*EXAMPLE]
        for a, b in task["pairs"]:
            messages.append({"role": "user", "content": f"What is {a} + {b}?"})
            while True:
                reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
                message = reply.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    break
                for call in message.tool_calls:
                    result = calculate(**json.loads(call.function.arguments)) + leak
                    if trace_itself:
                        ag.emit_span(
                            f"execute_tool {call.function.name}",
                            sc.tool_attributes(call.function.name, call.function.arguments, result, call.id),
                        )
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return 1.0

    return agent


async def run_agent(served: Served, agent: Any, pairs: list[tuple[int, int]]) -> list[Any]:
    (rollout,) = await served.store.enqueue_rollouts([{"input": {"pairs": pairs}}])
    await Runner(agent, served.store, hooks=[GatewayEnvHook(served.url + "/v1")], max_rollouts=1).run()
    await served.gateway.flush()
    assert (await served.store.get_rollout(rollout.rollout_id)).status.value == "succeeded"
    return list(await served.store.query_spans(rollout.rollout_id))


@pytest.fixture(autouse=True)
def no_openai_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    yield
    uninstrument_openai()


def tool_spans(spans: list[Any]) -> list[Any]:
    return sorted(
        (s for s in spans if s.attributes.get(sc.GEN_AI_OPERATION) == sc.EXECUTE_TOOL), key=lambda s: s.start_time
    )


async def test_each_tool_run_of_a_plain_agent_is_a_span_once_between_the_call_that_asked_and_the_next(
    served: Served,
) -> None:
    spans = await run_agent(served, plain_agent(), [(3, 4), (20, 22)])
    runs = tool_spans(spans)
    # two runs, though the last request repeats the first, and none for the worked example's call (same id)
    assert [
        (
            r.name,
            json.loads(r.attributes[sc.GEN_AI_TOOL_CALL_ARGUMENTS])["expression"],
            r.attributes[sc.GEN_AI_TOOL_CALL_RESULT],
        )
        for r in runs
    ] == [("execute_tool calculate", "3 + 4", "7"), ("execute_tool calculate", "20 + 22", "42")]
    assert all(r.attributes[sc.TOOL_RUN_SOURCE] == sc.TOOL_RUN_FROM_CONVERSATION for r in runs)
    calls = sorted((s for s in spans if is_llm_call(s)), key=lambda s: s.start_time)
    assert len(calls) == 4  # ask, answer, ask, answer
    for run, asked, answered in ((runs[0], calls[0], calls[1]), (runs[1], calls[2], calls[3])):
        assert asked.end_time <= run.start_time <= run.end_time <= answered.start_time  # between the two calls
        assert run.attributes[sc.GEN_AI_TOOL_CALL_ID] in asked.attributes[sc.GEN_AI_OUTPUT_MESSAGES]
        assert (run.trace_id, run.parent_id) == (answered.trace_id, answered.parent_id)  # beside it in the tree


async def test_an_agent_that_traces_its_tool_runs_gets_none_from_the_conversation(served: Served) -> None:
    runs = tool_spans(await run_agent(served, plain_agent(trace_itself=True), [(3, 4), (5, 6)]))
    assert [r.attributes[sc.GEN_AI_TOOL_CALL_RESULT] for r in runs] == ["7", "11"]
    assert not any(sc.TOOL_RUN_SOURCE in r.attributes for r in runs)  # its own, not a second copy


async def test_a_secret_in_a_tool_result_is_not_stored_in_the_run(served: Served) -> None:
    (run,) = tool_spans(await run_agent(served, plain_agent(leak=f" {UPSTREAM_KEY}"), [(3, 4)]))
    assert run.attributes[sc.GEN_AI_TOOL_CALL_RESULT].startswith("7 ")
    assert UPSTREAM_KEY not in json.dumps(run.attributes)
