"""The dashboard with roles (`GRPOConfig(roles=...)`): one chart of every role's reward, and each model call labelled
with its agent, the adapter that served it and the weights version, in headless Chromium."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentgrad.serving import ServerThread
from agentgrad.store import SqliteStore
from agentgrad.store.server import create_app
from agentgrad.types import Metric, Span
from tests.test_dashboard import QUESTION, rendered, screenshot

pytestmark = pytest.mark.slow  # a browser: `make test-fast` leaves it out


async def fill_roles(store: SqliteStore) -> str:
    """A GRPO run with two roles: each role's reward curve, and a rollout in which the solver, the verifier and an
    agent no adapter serves each made a call, rewarded per role. Returns the rollout's id."""
    rollout = await store.start_rollout({"question": QUESTION, "kind": "solve"}, mode="train", worker_id="worker-1")
    rid, aid = rollout.rollout_id, rollout.attempt.attempt_id

    def call(sequence: int, agent: str, adapter: str, reply: str) -> Span:
        return Span(
            rollout_id=rid,
            attempt_id=aid,
            span_id=f"{sequence:016x}",
            sequence_id=sequence,
            name="chat smollm2",
            start_time=100.0 + sequence,
            end_time=100.5 + sequence,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "smollm2-135m",
                "gen_ai.input.messages": json.dumps([{"role": "user", "content": QUESTION}]),
                "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": reply}]),
                "agentgrad.agent.name": agent,
                "agentgrad.adapter.name": adapter,
                "agentgrad.llm.weights_version": 3,
            },
        )

    await store.add_spans(
        [
            call(1, "solver", "solver", "Answer: 42"),
            call(2, "verifier", "verifier", "Verdict: correct"),
            call(3, "planner", "base", "Plan: add."),
            Span(
                rollout_id=rid,
                attempt_id=aid,
                span_id="4" * 16,
                sequence_id=4,
                name="agentgrad.reward",
                start_time=104.0,
                end_time=104.0,
                attributes={"agentgrad.reward": 0.5, "agentgrad.reward_agent": "verifier"},
            ),
            Span(
                rollout_id=rid,
                attempt_id=aid,
                span_id="5" * 16,
                sequence_id=5,
                name="agentgrad.reward",
                start_time=105.0,
                end_time=105.0,
                attributes={
                    "agentgrad.reward": 1.0,
                    "agentgrad.reward.primary": "solver",
                    "agentgrad.reward.solver": 1.0,
                    "agentgrad.reward.verifier": 0.0,
                },
            ),
        ]
    )
    await store.update_attempt(rid, aid, status="succeeded", reward=1.0)
    await store.add_metrics(
        [
            Metric(name=name, step=step, value=value)
            for step in range(5)
            for name, value in {
                "train/reward_mean": 0.3 + 0.1 * step,
                "train/solver/reward_mean": 0.2 + 0.15 * step,
                "train/verifier/reward_mean": 0.5 + 0.05 * step,
            }.items()
        ]
    )
    return rid


def test_a_browser_shows_each_roles_reward_curve_and_labels_calls_by_role_and_adapter(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db")
    rollout_id = asyncio.run(fill_roles(store))
    with ServerThread(create_app(store)) as server:
        curves = rendered(server.url + "/#curves", tmp_path)
        chart = curves[curves.index('aria-label="train/{role}/reward_mean by role"') :]
        assert chart.count('class="run-line"') == 2  # one chart, a line per role
        assert "</span>solver<span" in chart and "</span>verifier<span" in chart  # its legend
        assert "last 0.8" in chart and "last 0.7" in chart  # each role's last reward
        assert curves.index(">roles<") < curves.index(">train/<")  # above the other curves

        page = rendered(f"{server.url}/#rollout/{rollout_id}", tmp_path)
        assert "solver · adapter solver · v3" in page and "verifier · adapter verifier · v3" in page
        assert "planner · base model (no adapter) · v3" in page  # its agent matched no adapter
        assert "<b>solver</b>" in page and " 1 call, adapter solver, weights v3" in page  # the attempt's agents
        assert "for verifier" in page  # a role's own reward
        assert "solver 1" in page and "verifier 0" in page  # the reward's dimensions per role
        assert screenshot(f"{server.url}/#rollout/{rollout_id}", tmp_path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    asyncio.run(store.close())
