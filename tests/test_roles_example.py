"""`examples/roles`: the solver-and-verifier program trained with one adapter per role, and with one shared policy,
end to end on the real model (one tiny step each)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentgrad import semconv as sc
from agentgrad.store import SqliteStore
from examples.roles import train
from examples.roles.agents import ROLES


async def model_calls(path: Path) -> list[tuple[str | None, str | None]]:
    """(agent name, adapter that served it) of every model call a run's store holds."""
    store = SqliteStore(path)
    try:
        return [
            (sc.agent_name(span), span.attributes.get(sc.ADAPTER_NAME))
            for rollout in await store.query_rollouts()
            for span in await store.query_spans(rollout.rollout_id)
            if sc.is_llm_call(span)
        ]
    finally:
        await store.close()


@pytest.mark.model
def test_the_roles_example_trains_each_role_and_the_shared_policy_and_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train.main(
        ["--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--val-size", "1", "--max-tokens", "12",
         "--run-dir", str(tmp_path)]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "after (roles)" in printed and "after (shared)" in printed and "peak RSS (GiB)" in printed
    assert all(f"{role} " in printed for role in ROLES)

    roles_calls = asyncio.run(model_calls(tmp_path / "roles.db"))
    assert {agent for agent, _ in roles_calls} == set(ROLES)  # both roles called (the held-out tasks hold both kinds)
    assert all(adapter == agent for agent, adapter in roles_calls)  # each call served by its role's adapter
    shared_calls = asyncio.run(model_calls(tmp_path / "shared.db"))
    assert {agent for agent, _ in shared_calls} == set(ROLES)
    assert {adapter for _, adapter in shared_calls} == {None}  # one adapter for every call: none named per call
