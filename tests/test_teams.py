"""An AutoGen team (`RoundRobinGroupChat`) and a CrewAI `Crew`, unchanged, each agent on its own gateway route.

Against the fake upstream: every model call names the agent that made it. Against a tiny engine of the test's own:
one GRPO step with `roles=` trains one LoRA adapter per agent, and each agent's calls were served by its own.
The teams run as `agentgrad runner` processes of their frameworks' environments (`make envs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.algorithms.baseline import Baseline
from agentgrad.store import SqliteStore, Store
from examples.frameworks.run import TEAMS, roles_of, run
from examples.frameworks.tasks import TASKS
from tests.conftest import Served
from tests.helpers import agent_params, crewai_events_late


async def calls_by_agent(store: Store) -> dict[str, list[Any]]:
    """Every recorded model call, by the agent name the gateway recorded on it."""
    found: dict[str, list[Any]] = {}
    for rollout in await store.query_rollouts():
        for span in await store.query_spans(rollout.rollout_id):
            if sc.is_llm_call(span):
                found.setdefault(str(span.attributes.get(sc.AGENT_NAME)), []).append(span)
    return found


@pytest.mark.parametrize("team", agent_params(TEAMS))
async def test_each_agent_of_the_team_calls_on_its_own_route_and_its_tool_run_is_traced(
    team: str, served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    crewai_events_late(team, monkeypatch)  # a crew's tool events arrive after the next model call: still one span
    llm = ag.LLM(base_url=served.url + "/v1", model="policy", proxied=True, sampling_parameters={"temperature": 0.0})
    log = tmp_path / f"runner-{team}.log"
    results = await run(team, Baseline(), served.store, TASKS[:1], llm=llm, workers=1, log=log)
    await served.gateway.flush()
    assert results["train"].succeeded == 1, log.read_text()
    by_agent = await calls_by_agent(served.store)
    assert set(by_agent) == set(roles_of(team) or {}), log.read_text()  # every call named, by both agents
    (rollout,) = await served.store.query_rollouts()
    spans = await served.store.query_spans(rollout.rollout_id)
    assert [s.attributes[sc.GEN_AI_TOOL_NAME] for s in spans if s.attributes.get(sc.GEN_AI_OPERATION) == "execute_tool"] == ["calculate"]


@pytest.mark.parametrize("team", agent_params(TEAMS))
async def test_one_grpo_step_trains_an_adapter_per_agent_and_each_agents_calls_reach_its_own(
    team: str, fresh_tiny_engine: Any, tmp_path: Path
) -> None:
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.policy.config import PolicyConfig

    engine = fresh_tiny_engine  # the step puts an adapter per agent on it: an engine of its own (wiring, not learning)

    roles = roles_of(team)
    assert roles is not None
    store = SqliteStore(tmp_path / "run.db")
    config = GRPOConfig(steps=1, prompts_per_step=1, group_size=2, max_tokens=32, micro_batch_size=4, val_every=0,
                        checkpoint_dir=str(tmp_path / "checkpoints"), skip_uniform_groups=False, roles=roles,
                        policy=PolicyConfig(lora_rank=4), rollout_timeout=1800.0)  # a team makes up to 7 calls
    log = tmp_path / f"runner-{team}.log"
    result = await run(team, GRPO(config, local_engine=engine), store, TASKS[:1], log=log)
    (step,) = result.history
    assert step["train/failed_rollouts"] == 0, log.read_text()
    for agent, calls in (await calls_by_agent(store)).items():
        assert agent in roles and {c.attributes[sc.ADAPTER_NAME] for c in calls} == {agent}  # served by its own
        assert all(c.attributes.get(sc.PROMPT_TOKEN_IDS) for c in calls)
    assert result.checkpoint and {p.name for p in Path(result.checkpoint).iterdir()} >= set(roles), log.read_text()
