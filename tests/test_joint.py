"""Joint runs (APO's prompt rounds between GRPO's weight steps) on a tiny model, a real SQLite store and real HTTP.

The agent's reward is decided by its prompt (`tests/joint_agents.py`): the critic and editor there write a better
prompt at the first round and a worse one at the second, so a run must keep the first and refuse the second.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.adapters import to_trajectories
from agentgrad.algorithms.apo_text import check_rewrite, lenient
from agentgrad.algorithms.base import beats
from agentgrad.cli.run_views import TIMELINE_FIGURES, timeline_event
from agentgrad.dashboard import STATIC
from agentgrad.serving import ServerThread
from agentgrad.store import SqliteStore
from agentgrad.store.server import create_app
from agentgrad.types import ResourcesSnapshot, Rollout
from tests.helpers import sigkill_at_checkpoint
from tests.joint_agents import CriticEditor, fit, joint
from tests.test_dashboard import rendered, screenshot
from tests.tiny_models import tiny_engine_of

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def joint_run(tmp_path_factory: pytest.TempPathFactory, tiny_smollm2_dir: Path) -> Iterator[tuple[Path, CriticEditor]]:
    """A 4-step joint run on a tiny model of its own, rounds after steps 2 and 4 (no rollout succeeds: every round
    has failures to criticize); its SQLite store and the critic and editor it asked."""
    fake, path = CriticEditor(), tmp_path_factory.mktemp("joint") / "joint.db"
    with ServerThread(fake.app()) as server:
        engine = tiny_engine_of(tiny_smollm2_dir)
        fit(joint(engine, server.url + "/v1", success_threshold=1.5, rollout_timeout=300), SqliteStore(path))
        engine.close()
    yield path, fake


def metric(store: ag.Store, name: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in asyncio.run(store.query_metrics(name=name))]


def snapshots(store: ag.Store) -> dict[str, ResourcesSnapshot]:
    return {s.resources_id: s for s in asyncio.run(store.query_resources())}


def rollouts(store: ag.Store, mode: str) -> list[Rollout]:
    return asyncio.run(store.query_rollouts(mode=mode))


@pytest.mark.slow
def test_a_joint_run_alternates_weight_steps_and_prompt_rounds_and_records_both_versions_on_every_call(
    joint_run: tuple[Path, CriticEditor],
) -> None:
    path, fake = joint_run
    store = SqliteStore(path)

    # weights every step, a prompt round every second step: the first rewrite kept, the second (worse) refused
    assert metric(store, "train/model_version") == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
    assert metric(store, "prompt/version") == [(1, 0.0), (2, 1.0), (3, 1.0), (4, 1.0)]
    assert metric(store, "prompt/kept") == [(2, 1.0), (4, 0.0)]
    (_, first_best), (_, second_best) = metric(store, "prompt/candidate_best")
    (_, first_current), (_, second_current) = metric(store, "prompt/score")
    assert first_best > first_current and second_best < second_current  # better kept, worse refused
    by_id = snapshots(store)
    candidates = [s for s in by_id.values() if s.metadata.get("purpose") == "prompt_candidate"]
    assert [(s.metadata["step"], s.metadata["status"]) for s in candidates] == [(2, "kept"), (4, "refused")]
    assert candidates[0].resources["prompt"].template.startswith("BETTER ")
    assert candidates[1].resources["prompt"].template.startswith("WORSE BETTER ")

    # the critic read the rollouts GRPO had just trained on: each round's, of the step it followed
    train = rollouts(store, "train")
    for round_, request in zip((2, 4), fake.asked("critic"), strict=True):
        questions = {r.input["question"] for r in train if r.metadata["step"] == round_}
        assert any(q in request for q in questions), (round_, request[:300])

    # every rollout names the prompt version it ran with, every model call the weights version that sampled it;
    # the training steps after the first round run under the rewrite APO kept
    val = [r for r in rollouts(store, "val") if "apo_round" not in r.metadata]  # the loop's validation
    spans = asyncio.run(store.query_spans_of([r.rollout_id for r in train + val]))
    for rollout in train + val:
        snapshot = by_id[rollout.resources_id or ""]
        version, step = snapshot.metadata["prompt_version"], rollout.metadata["step"]
        assert version == (0 if step < (3 if rollout.mode == "train" else 2) else 1), (rollout.mode, step)
        assert ("BETTER" in snapshot.resources["prompt"].template) == (version == 1)
        calls = [s for s in spans[rollout.rollout_id] if sc.is_llm_call(s)]
        assert calls and all(c.attributes[sc.WEIGHTS_VERSION] == step - (rollout.mode == "train") for c in calls)
        prompt_sent = str(calls[0].attributes[sc.GEN_AI_INPUT_MESSAGES])
        assert ("BETTER" in prompt_sent) == (version == 1)

    # a round's validation rollouts run as the run's others do: GRPO's timeout (300 s here), not APO's (600 s)
    scored = [r for r in rollouts(store, "val") if "apo_round" in r.metadata]
    assert scored and {r.config.timeout_seconds for r in scored} == {300.0}

    # the run record holds both histories
    (run,) = asyncio.run(store.query_runs())
    assert run.algorithm == "Joint" and run.final["prompt/version"] == 1 and run.final["train/model_version"] == 4
    # and its configuration both algorithms' settings: GRPO's fields, APO's under "apo", the schedule
    assert run.config["steps"] == 4 and run.config["prompt_every"] == 2
    assert run.config["apo"]["branch_factor"] == 1 and run.config["apo"]["critic_model"] == "critic"


@pytest.mark.slow
def test_runs_show_and_the_dashboard_lay_weight_and_prompt_versions_on_one_timeline(
    joint_run: tuple[Path, CriticEditor], tmp_path: Path
) -> None:
    path, _ = joint_run
    store = SqliteStore(path)
    (run,) = asyncio.run(store.query_runs())
    shown = subprocess.run([sys.executable, "-m", "agentgrad.cli", "runs", "show", run.run_id, "--store", str(path)],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    rows = re.findall(r"│\s+(\d+) │\s+(v\d+) │\s+(v\d+) │[^│]*│ ([^│]*?)\s*│", shown.stdout)
    assert [(step, weights, prompt) for step, weights, prompt, _ in rows] == [
        ("0", "v0", "v0"), ("1", "v1", "v0"), ("2", "v2", "v1"), ("3", "v3", "v1"), ("4", "v4", "v1")]
    assert rows[2][3].startswith("prompt rewrite kept") and rows[4][3].startswith("prompt rewrite refused")

    # the dashboard's runs page: the same timeline, from the same figures
    script_figures = re.search(r"const TIMELINE_FIGURES = \[([^\]]*)\]", (STATIC / "dashboard.js").read_text())
    assert script_figures and re.findall(r'"([^"]+)"', script_figures.group(1)) == list(TIMELINE_FIGURES)
    with ServerThread(create_app(store)) as server:
        page = rendered(server.url + "/#runs", tmp_path)
        shot = screenshot(server.url + "/#runs", tmp_path)
    timeline = page[page.index('class="grid timeline"'):]
    cells = re.findall(r"<tr><td>(\d+)</td><td class=\"mono\">(v\d+)</td><td class=\"mono\">(v\d+)</td>", timeline)
    assert cells == [("0", "v0", "v0"), ("1", "v1", "v0"), ("2", "v2", "v1"), ("3", "v3", "v1"), ("4", "v4", "v1")]
    assert "prompt rewrite kept" in timeline and "prompt rewrite refused" in timeline
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_timeline_says_a_refused_rewrite_that_scored_higher_was_within_chance() -> None:
    def event(kept: float, best: float) -> str:
        return timeline_event({"prompt/kept": kept, "prompt/candidate_best": best, "prompt/score": 0.44})

    assert event(0.0, 0.47) == "prompt rewrite refused (0.470 vs 0.440, within chance)"
    assert event(0.0, 0.40) == "prompt rewrite refused (0.400 vs 0.440)"
    assert event(1.0, 0.72) == "prompt rewrite kept (0.720 vs 0.440)"


def test_a_joint_run_stops_after_the_step_that_ends_past_its_time_budget_validated(
    tmp_path: Path, fresh_tiny_engine: Any
) -> None:
    store = SqliteStore(tmp_path / "joint.db")
    result = fit(joint(fresh_tiny_engine, None, time_budget_s=1e-6), store)
    assert [h["step"] for h in result.history] == [1]
    assert [step for step, _ in metric(store, "val/accuracy")] == [0, 1]  # the last step validated all the same


def test_lenient_replies_take_a_small_models_unmarked_critique_and_its_fenced_rewrite() -> None:
    assert lenient("The prompt never says how to answer.", "critique") == "The prompt never says how to answer."
    assert lenient("Here it is:\n```\nSolve it.\nAnswer: N\n```\nDone.", "new_prompt") == "Solve it.\nAnswer: N"
    assert lenient("Say it in one line.", "new_prompt") == "Say it in one line."
    assert lenient("<critique>marked</critique> after", "critique") == "marked"
    with pytest.raises(ValueError, match="empty"):
        lenient("  ", "critique")
    with pytest.raises(ValueError, match="fenced block is empty"):
        lenient("Here:\n```\n```", "new_prompt")
    assert check_rewrite(ag.PromptTemplate(template="Solve it."), ag.PromptTemplate(template=" \n")) == "empty"


@pytest.mark.slow
def test_the_policy_itself_can_be_critic_and_editor_recorded_through_its_gateway_but_never_trained_on(
    tmp_path: Path, fresh_tiny_engine: Any
) -> None:
    store = SqliteStore(tmp_path / "joint.db")
    fit(joint(fresh_tiny_engine, None, steps=2, success_threshold=1.5), store)  # no base_url, no API key

    critic_calls = [s for s in asyncio.run(store.query_spans(None)) if sc.is_llm_call(s)]
    assert critic_calls, "the critic's calls reached the policy's gateway and were recorded"
    assert {c.attributes[sc.NOT_TRAINED] for c in critic_calls} == {"apo"}
    assert {c.attributes[sc.AGENT_NAME] for c in critic_calls} <= {"apo-critic", "apo-editor"}
    assert all(c.attributes[sc.WEIGHTS_VERSION] == 2 for c in critic_calls)  # after step 2's update
    assert to_trajectories(critic_calls, reward=1.0) == [], "adapters leave marked calls out of any batch"
    assert metric(store, "prompt/version") == [(1, 0.0), (2, 0.0)]  # a tiny model's critique is unusable: no change
    assert metric(store, "train/model_version") == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_the_guard_keeps_a_rewrite_only_when_it_wins_past_chance_as_the_best_of_those_compared() -> None:
    current = [1.0] * 15 + [0.0] * 17
    assert not beats(list(current), current)  # a tie
    swing = [0.0] * 4 + current[4:15] + [1.0] * 7 + current[22:]  # 7 tasks won, 4 lost: 18 against 15 of 32
    assert sum(swing) == 18 and not beats(swing, current)
    three_more = current[:15] + [1.0] * 3 + current[18:]  # 3 won, none lost
    assert beats(three_more, current) and not beats(current, three_more)
    assert not beats(three_more, current, compared=2)  # as the best of two rewrites: 1.79 errors, not 1.96
    five_more, six_more = (current[:15] + [1.0] * won + current[15 + won :] for won in (5, 6))
    assert not beats(five_more, current, compared=10) and beats(six_more, current, compared=10)  # 2.40, 2.68 vs 2.58
    assert beats([1.0, 1.01, 0.99, 1.0], [0.5, 0.5, 0.51, 0.5]) and not beats([0.0] * 4, [0.5] * 4)


def test_joint_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="prompt_every"):
        ag.Joint(prompt_every=0)
    with pytest.raises(ValueError, match="synchronously"):
        ag.Joint(grpo=ag.GRPO(max_staleness=1))


@pytest.mark.slow
def test_a_sigkilled_joint_run_resumes_with_the_prompt_and_the_weights_of_its_checkpoint(
    tmp_path: Path, tiny_smollm2_dir: Path
) -> None:
    run = tmp_path / "run"
    command = [sys.executable, "-m", "tests.joint_agents", str(tiny_smollm2_dir), str(run)]
    env = {**os.environ, "COLUMNS": "200"}
    saved = sigkill_at_checkpoint(command, run, step=2, env=env, timeout=300)  # step 2: after the first prompt round

    resumed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False, cwd=ROOT)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out
    assert re.search(rf"resumed from \S+step-{saved} \(step {saved}\)", out)
    assert saved < 4 and f"step {saved + 1}/4" in out  # killed mid-run: the resumed run trained on
    store = SqliteStore(run / "store.db")
    by_id = snapshots(store)
    (restart,) = [s for s in by_id.values() if s.metadata.get("status") == "resumed"]
    kept = [s for s in by_id.values() if s.metadata.get("purpose") == "prompt_candidate" and s.metadata["step"] <= saved
            and s.metadata["status"] == "kept"]
    assert [s.metadata["step"] for s in kept] == [2]
    assert restart.metadata["prompt_version"] == 1  # the prompt of the checkpoint, not the seed the store began with
    assert restart.resources["prompt"] == kept[0].resources["prompt"]
    # the resumed run's first validation ran under that prompt and the checkpoint's weights
    first_val = [r for r in rollouts(store, "val") if r.metadata.get("step") == saved and "apo_round" not in r.metadata
                 and by_id[r.resources_id or ""].metadata.get("prompt_version") == 1]
    spans = asyncio.run(store.query_spans_of([r.rollout_id for r in first_val]))
    versions = {s.attributes[sc.WEIGHTS_VERSION] for r in first_val for s in spans[r.rollout_id] if sc.is_llm_call(s)}
    assert versions == {saved}
    assert [step for step, _ in metric(store, "prompt/version")][-1] == 4
