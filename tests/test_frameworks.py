"""Every framework's unchanged tool-using agent (`examples/frameworks/`), run by agentgrad from outside.

Against a fake upstream that calls the tool (fast, every framework), and against the real
engine (marked `model`): the engine returns a tool call, the framework executes it, the gateway
records every call with token ids, the reward lands, and the adapter masks exactly the tool
results. CrewAI and AutoGen run as `agentgrad runner` processes of their own environments
(`make env-crewai`, `make env-autogen`), joining the store over HTTP.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

import agentgrad as ag
from agentgrad.adapters import llm_calls, to_trajectories
from agentgrad.algorithms.baseline import Baseline
from agentgrad.rollout.venvs import ROOT
from agentgrad.semconv import is_llm_call
from agentgrad.store import SqliteStore, Store
from examples.frameworks.run import FRAMEWORKS, run
from examples.frameworks.tasks import EXAMPLE_QUESTION, EXAMPLE_RESULT, TASKS, calculate, make_tasks
from tests.conftest import Served
from tests.helpers import agent_params, crewai_events_late

AGENT_FILES = {"openai": "openai_agent.py", "langchain": "langchain_agent.py", "langgraph": "langgraph_agent.py",
               "openai-agents": "openai_agents_sdk_agent.py", "autogen": "autogen_agent.py", "crewai": "crewai_agent.py",
               "agent-framework": "agent_framework_agent.py", "agentscope": "agentscope_agent.py"}


def test_the_framework_agent_files_know_nothing_of_agentgrad() -> None:
    for name in AGENT_FILES.values():
        tree = ast.parse((ROOT / "examples" / "frameworks" / name).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not any(module.split(".")[0] == "agentgrad" for module in imported), name


async def run_framework(framework: str, store: Store, llm: ag.LLM, tasks: list[dict[str, Any]], tmp_path: Path,
                        gateway: str, workers: int = 2) -> Any:
    """A Baseline pass over `tasks` with the framework's runners in their own process (and environment)."""
    log = tmp_path / f"runner-{framework}.log"
    try:
        return await run(framework, Baseline(), store, tasks, llm=llm, gateway=gateway, workers=workers, log=log)
    except Exception:
        print(log.read_text())
        raise


# ----------------------------------------------------------------------------- a fake upstream that calls the tool

def check_tool_span(spans: list[Any], answer: str) -> None:
    """The tool run is its own span, once, under the attempt's rollout span: its name, arguments, result and duration.
    The frameworks' runs come from their hooks (`agentgrad.rollout.frameworks`); the plain `openai` agent's, which runs
    its own function, from the conversation (`agentgrad.gateway.tool_runs`); the worked example's call is no run."""
    (tool,) = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    assert tool.name == "execute_tool calculate" and tool.attributes["gen_ai.tool.name"] == "calculate"
    assert "+" in tool.attributes["gen_ai.tool.call.arguments"]  # the expression the model asked for
    assert answer in tool.attributes["gen_ai.tool.call.result"]
    assert tool.end_time is not None and tool.end_time >= tool.start_time and tool.status.code != "ERROR"
    (root,) = [s for s in spans if s.name == "agentgrad.rollout"]
    assert tool.trace_id == root.trace_id  # in the attempt's tree
    model_calls = [s for s in spans if is_llm_call(s)]  # the gateway's alone: a framework's own is a step of the tree
    assert model_calls and all("agentgrad.llm.api" in s.attributes for s in model_calls)


@pytest.mark.slow
@pytest.mark.parametrize("framework", agent_params(FRAMEWORKS))
async def test_each_framework_executes_the_tool_call_and_every_call_is_recorded(
    framework: str, served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    crewai_events_late(framework, monkeypatch)  # its tool events arrive after the next model call: still one span
    tasks = TASKS[:2]
    llm = ag.LLM(base_url=served.url + "/v1", model="policy", proxied=True, sampling_parameters={"temperature": 0.0})
    results = await run_framework(framework, served.store, llm, tasks, tmp_path, served.url + "/v1", workers=1)
    await served.gateway.flush()
    assert results["train"].succeeded == len(tasks), (tmp_path / f"runner-{framework}.log").read_text()
    for rollout in await served.store.query_rollouts():
        assert rollout.reward == 1.0
        calls = [s for s in await served.store.query_spans(rollout.rollout_id) if is_llm_call(s)]
        outputs = [json.loads(s.attributes["gen_ai.output.messages"])[0] for s in calls]
        (tool_call,) = outputs[0]["tool_calls"]
        assert tool_call["function"]["name"] == "calculate"
        history = json.loads(calls[-1].attributes["gen_ai.input.messages"])
        answer = str(rollout.input["answer"])
        assert any(m["role"] == "tool" and answer in str(m["content"]) for m in history), history  # it ran the tool
        check_tool_span(await served.store.query_spans(rollout.rollout_id), answer)


@pytest.mark.slow
@pytest.mark.parametrize("framework", agent_params(FRAMEWORKS))
async def test_a_task_marked_without_the_worked_example_reaches_the_model_without_it(
    framework: str, served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make_tasks(worked_example=False)`: each agent asks the question alone (does a model call unforced?)."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    tasks = make_tasks(1, worked_example=False)
    llm = ag.LLM(base_url=served.url + "/v1", model="policy", proxied=True, sampling_parameters={"temperature": 0.0})
    results = await run_framework(framework, served.store, llm, tasks, tmp_path, served.url + "/v1", workers=1)
    await served.gateway.flush()
    assert results["train"].succeeded == 1, (tmp_path / f"runner-{framework}.log").read_text()
    (rollout,) = await served.store.query_rollouts()
    calls = [s for s in await served.store.query_spans(rollout.rollout_id) if is_llm_call(s)]
    first = calls[0].attributes["gen_ai.input.messages"]
    assert EXAMPLE_QUESTION not in first and EXAMPLE_RESULT not in first and tasks[0]["question"] in first
    assert rollout.reward == 1.0  # the fake still calls the tool, and the agent still runs it


# ----------------------------------------------------------------------------- the real engine


def masked_segments(trajectory: Any) -> list[list[int]]:
    """The runs of tokens after the first prompt that the model did not write."""
    start = trajectory.prompt_length
    pairs = zip(trajectory.token_ids[start:], trajectory.loss_mask[start:])
    return [[token for token, _ in run] for mask, run in itertools.groupby(pairs, key=lambda p: p[1]) if mask == 0]


TOOL_RESULT = re.compile(r"^(?:<\|im_end\|>)?\s*(?:<\|im_start\|>tool\n(.*?)|<\|im_start\|>user\n<tool_response>\n(.*?)\n</tool_response>)"
                         r"<\|im_end\|>\n<\|im_start\|>assistant\n$", re.DOTALL)
"""A tool result as the engine renders it: a `tool` turn (SmolLM2's pythonic format) or a user turn of `<tool_response>` (Hermes)."""


async def check_trained_through_tools(store: Store, engine: Any) -> dict[str, int]:
    """The assertions every framework shares on a run against the engine; returns what was counted."""
    counts = {"rollouts": 0, "calls": 0, "tool_calls": 0, "trajectories": 0, "masked_results": 0}
    for rollout in await store.query_rollouts():
        assert rollout.reward is not None  # the reward landed
        spans = await store.query_spans(rollout.rollout_id)
        llm_spans = [s for s in spans if is_llm_call(s)]
        calls = llm_calls(spans)
        assert llm_spans and len(calls) == len(llm_spans)  # every model call recorded with token ids
        assert all(c.prompt_token_ids and c.response_token_ids for c in calls)
        counts["rollouts"] += 1
        counts["calls"] += len(calls)
        results = []
        for span in llm_spans:
            for message in json.loads(span.attributes["gen_ai.output.messages"]):
                for call in message.get("tool_calls") or []:
                    counts["tool_calls"] += 1
                    results.append(calculate(**json.loads(call["function"]["arguments"])))
        trajectories = to_trajectories(spans, reward=rollout.reward)
        counts["trajectories"] += len(trajectories)
        for trajectory in trajectories:
            assert trajectory.reward == rollout.reward
            for segment in masked_segments(trajectory):
                text = engine.tokenizer.decode(segment)
                match = TOOL_RESULT.match(text)
                assert match, f"a masked segment that is not a tool result: {text!r}"
                assert (match.group(1) or match.group(2)) in results  # the result of a call the model made
                counts["masked_results"] += 1
    return counts


GRPO_STEP = ["langchain", "agent-framework", "agentscope"]
"""The frameworks trained for one GRPO step in a test; the two newest are checked through the engine there alone
(the same assertions, `check_trained_through_tools`), which saves CI a Baseline pass each."""


@pytest.mark.model
@pytest.mark.parametrize("framework", [f for f in FRAMEWORKS if f not in ("agent-framework", "agentscope")])
async def test_each_framework_calls_its_tool_through_the_engine_and_trains_on_the_result(
    framework: str, engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentgrad.policy.local import LocalPolicy

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    store = SqliteStore(tmp_path / "run.db")
    with LocalPolicy(store, engine) as policy:
        llm = policy.llm(temperature=0.0, max_tokens=64)
        results = await run_framework(framework, store, llm, TASKS[:4], tmp_path, policy.gateway_url + "/v1")
    assert results["train"].succeeded == 4, (tmp_path / f"runner-{framework}.log").read_text()
    counts = await check_trained_through_tools(store, engine)
    print(framework, counts)
    assert counts["tool_calls"] >= 1  # the engine returned a tool call and the framework ran it
    if framework == "autogen":  # its reflection is sent without tools: that prompt does not continue the call (README)
        assert counts["trajectories"] > counts["rollouts"]  # so an attempt that called is two trajectories
    else:
        assert counts["masked_results"] >= 1  # the call and the answer are one trajectory, the result masked


@pytest.mark.slow
@pytest.mark.parametrize("framework", agent_params(GRPO_STEP))
async def test_one_grpo_step_on_the_framework_agent_writes_a_checkpoint(
    framework: str, fresh_tiny_engine: Any, tmp_path: Path
) -> None:
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig

    engine = fresh_tiny_engine  # the step trains it

    store = SqliteStore(tmp_path / "run.db")
    config = GRPOConfig(steps=1, prompts_per_step=2, group_size=2, max_tokens=64, micro_batch_size=4, val_every=0,
                        checkpoint_dir=str(tmp_path / "checkpoints"), skip_uniform_groups=False)
    log = tmp_path / f"runner-{framework}.log"
    result = await run(framework, GRPO(config, local_engine=engine), store, TASKS[:2], log=log)
    assert result.checkpoint and (Path(result.checkpoint) / "model.safetensors").exists(), log.read_text()
    (step,) = result.history
    assert step["train/failed_rollouts"] == 0 and step["train/model_version"] >= 1
    counts = await check_trained_through_tools(store, engine)
    assert counts["rollouts"] == 4
