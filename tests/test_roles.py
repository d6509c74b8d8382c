"""One GRPO run that trains every role (`GRPOConfig(roles=...)`, `agentgrad.algorithms.roles`): one LoRA adapter per
role on one frozen base, each trained on exactly its role's calls with its own rewards, and checkpointed per role."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.algorithms.grpo import GRPO, GRPOConfig
from agentgrad.algorithms.roles import role_reward
from agentgrad.algorithms.updates import RoleUpdate
from agentgrad.engine import Engine
from agentgrad.engine.adapters import adapter_parameters
from agentgrad.policy.config import PolicyConfig
from agentgrad.types import Span

ROLES = {"solver": "^solver$", "verifier": "^verifier$"}
LORA = PolicyConfig(lora_rank=4)


def ask(llm: ag.LLM, text: str) -> str:
    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0, timeout=900)
    answer = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": text}])
    return answer.choices[0].message.content or ""


def solver_and_verifier(task: dict[str, int], llm: ag.LLM) -> float:
    """An ordinary two-agent program: the solver answers, the verifier judges; each has its own reward."""
    answer = ask(llm.for_agent("solver"), f"What is {task['a']}+{task['b']}?")
    verdict = ask(llm.for_agent("verifier"), f"Is {answer!r} the sum of {task['a']} and {task['b']}? Say yes or no.")
    ag.emit_reward(len(verdict) / 100, agent="verifier")  # the verifier's own reward
    return len(answer) / 100  # the rollout's reward: the solver's (it emits none of its own)


def snapshot(model: torch.nn.Module, keep: Any) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters() if keep(name)}


def record_role_batches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, list[Any]]]:
    """Each step's per-role batches, as `RoleUpdate.step` gets them; the real update still runs on them."""
    trained: list[dict[str, list[Any]]] = []
    real_step = RoleUpdate.step

    def spied_step(self: RoleUpdate, batches: dict[str, list[Any]]) -> dict[str, float]:
        trained.append(batches)
        return real_step(self, batches)

    monkeypatch.setattr(RoleUpdate, "step", spied_step)
    return trained


@pytest.mark.model
def test_a_grpo_step_with_two_roles_trains_each_adapter_on_exactly_its_calls_and_resumes_per_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(sampling_dtype="float32", device="cpu")
    trained = record_role_batches(monkeypatch)
    store = ag.MemoryStore()
    checkpoints = tmp_path / "checkpoints"
    config = GRPOConfig(
        steps=1, prompts_per_step=2, group_size=2, max_tokens=8, val_every=0, learning_rate=1e-3,
        skip_uniform_groups=False, checkpoint_dir=str(checkpoints), roles=ROLES, policy=LORA,
    )  # fmt: skip
    tasks = [{"a": 12, "b": 30}, {"a": 7, "b": 5}]
    grpo = GRPO(config, local_engine=engine)
    peft_model: Any = None
    before: dict[str, dict[str, torch.Tensor]] = {}

    real_init = RoleUpdate.__init__

    def spied_init(self: RoleUpdate, *args: Any, **kwargs: Any) -> None:  # the weights as the run starts
        nonlocal peft_model
        real_init(self, *args, **kwargs)
        peft_model = self.policy.model
        before["base"] = snapshot(peft_model, lambda n: "lora_" not in n)
        for role in ROLES:
            before[role] = snapshot(peft_model, lambda n, role=role: f".{role}." in n)

    monkeypatch.setattr(RoleUpdate, "__init__", spied_init)
    result = ag.Trainer(grpo, store=store).fit(solver_and_verifier, tasks)

    # ---- each adapter's batch holds exactly its role's calls
    (batches,) = trained
    spans = {r.rollout_id: asyncio.run(store.query_spans(r.rollout_id)) for r in asyncio.run(store.query_rollouts())}
    calls = [s for all_spans in spans.values() for s in all_spans if sc.is_llm_call(s)]
    assert len(calls) == 2 * 2 * 2
    for role in ROLES:
        expected = {s.span_id for s in calls if sc.agent_name(s) == role}
        assert {i for t, _ in batches[role] for i in t.span_ids} == expected
        assert {s.attributes[sc.ADAPTER_NAME] for s in calls if sc.agent_name(s) == role} == {role}  # served by it

    # ---- each role's reward: its own emitted one, else the rollout's
    history = result.history[0]
    verifier = [role_reward(s, "verifier", ROLES["verifier"], -1.0) for s in spans.values()]
    rollouts = asyncio.run(store.query_rollouts())
    assert history["train/verifier/reward_mean"] == pytest.approx(statistics.fmean(verifier))
    assert -1.0 not in verifier
    assert history["train/solver/reward_mean"] == pytest.approx(statistics.fmean(r.reward or 0.0 for r in rollouts))
    assert {"train/solver/loss", "train/verifier/loss", "train/solver/grad_norm"} <= set(history)

    # ---- both adapters moved, the base did not (and it is held once: one model serves both)
    assert peft_model is engine.model
    after = {name: p.detach() for name, p in peft_model.named_parameters()}
    assert all(torch.equal(after[name], value) for name, value in before["base"].items())
    for role in ROLES:
        assert any(not torch.equal(after[name], value) for name, value in before[role].items()), role

    # ---- per-role checkpoints, and a run that resumes from them
    step = checkpoints / "step-1"
    assert {p.name for p in step.iterdir() if p.is_dir()} == set(ROLES)
    assert (step / "solver" / "adapter_model.safetensors").exists() and (step / "verifier" / "optimizer.pt").exists()
    saved = {role: [p.detach().clone() for p in adapter_parameters(peft_model, role)] for role in ROLES}
    with engine.training(), torch.no_grad():
        for role in ROLES:
            for p in adapter_parameters(peft_model, role):
                p.zero_()
    resumed = ag.Trainer(GRPO(config, local_engine=engine), store=ag.MemoryStore()).fit(solver_and_verifier, tasks)
    assert resumed.history[0]["train/verifier/reward_mean"] == history["train/verifier/reward_mean"]
    for role in ROLES:
        restored = adapter_parameters(engine.model, role)
        assert all(torch.equal(a, b) for a, b in zip(restored, saved[role])), role
    engine.close()


def test_roles_need_lora_and_no_agent_match_and_run_on_either_engine() -> None:
    with pytest.raises(ValueError, match="lora_rank >= 1"):
        GRPOConfig(roles=ROLES)
    on_vllm = GRPOConfig(roles=ROLES, policy=PolicyConfig(engine="vllm", lora_rank=4))
    assert on_vllm.policy.engine == "vllm"  # vLLM serves one adapter per role too (tests/test_vllm_roles.py)
    with pytest.raises(ValueError, match="vllm_transport='lora' or 'auto'"):
        GRPOConfig(roles=ROLES, policy=PolicyConfig(engine="vllm", lora_rank=4, vllm_transport="file"))
    assert GRPOConfig(roles=ROLES, policy=LORA, credit="per_turn").credit == "per_turn"  # per role (test_per_turn_credit)
    assert GRPOConfig(roles=ROLES, policy=LORA, rollback_on_drop=0.1).rollback_on_drop == 0.1
    with pytest.raises(ValueError, match="train_processes=1"):
        GRPOConfig(roles=ROLES, policy=LORA, train_processes=2)
    with pytest.raises(ValueError, match="agent_match=None"):
        GRPOConfig(roles=ROLES, policy=LORA, agent_match="solver")
    with pytest.raises(ValueError, match="'base' names the base model"):
        GRPOConfig(roles={"base": "x"}, policy=LORA)
    roles = dict(ROLES)
    assert GRPOConfig(roles=roles, policy=LORA).roles is not roles  # copied: the caller's stays theirs
    grpo = GRPO(roles=ROLES, lora_rank=8)  # the policy's override counts when the roles are checked
    assert (grpo.config.roles, grpo.config.policy.lora_rank) == (ROLES, 8)


def reward_span(value: float, agent: str | None, sequence: int, dimensions: dict[str, float] | None = None) -> Span:
    """A reward span as `emit_reward(value, agent=agent)` writes it, or `emit_reward(dimensions, primary=...)`."""
    attributes: dict[str, Any] = {f"{sc.REWARD}.{key}": v for key, v in (dimensions or {}).items()}
    attributes[sc.REWARD] = value
    if agent:
        attributes[sc.REWARD_AGENT] = agent
    return Span(
        rollout_id="r", attempt_id="a", sequence_id=sequence, span_id=f"s{sequence}", name=sc.REWARD_SPAN, start_time=float(sequence), end_time=float(sequence), attributes=attributes,
    )  # fmt: skip


def test_a_roles_reward_is_the_last_one_emitted_for_it_else_the_rollouts() -> None:
    spans = [reward_span(0.2, "verifier", 1), reward_span(0.7, None, 2), reward_span(0.9, "verifier", 3)]
    assert role_reward(spans, "verifier", ROLES["verifier"], 0.5) == 0.9
    assert role_reward(spans, "solver", ROLES["solver"], 0.5) == 0.5


def test_a_reward_with_dimensions_named_after_roles_gives_each_role_its_own() -> None:
    both = {"solver": 1.0, "verifier": 0.0}  # emit_reward(both, primary="solver"): the rollout's reward is 1.0
    spans = [reward_span(0.3, None, 1, {"solver": 0.3, "verifier": 0.6}), reward_span(1.0, None, 2, both)]
    assert role_reward(spans, "solver", ROLES["solver"], 1.0) == 1.0
    assert role_reward(spans, "verifier", ROLES["verifier"], 1.0) == 0.0  # its dimension, not the primary
    assert role_reward(spans, "planner", "^planner$", 0.5) == 0.5  # no dimension of its name: the rollout's


def test_a_roles_own_reward_wins_over_a_dimension_named_after_it() -> None:
    spans = [reward_span(0.8, "verifier", 1), reward_span(1.0, None, 2, {"solver": 1.0, "verifier": 0.0})]
    assert role_reward(spans, "verifier", ROLES["verifier"], 1.0) == 0.8
    assert role_reward(spans, "solver", ROLES["solver"], 0.0) == 1.0


def solver_verifier_and_critic(task: dict[str, int], llm: ag.LLM) -> float:
    """`solver_and_verifier` plus a call from an agent no role names (a critic) and an unnamed one."""
    reward = solver_and_verifier(task, llm)
    ask(llm.for_agent("critic"), f"Is {task['a']}+{task['b']} hard? Say yes or no.")
    ask(llm, "Say hello.")
    return reward


@pytest.mark.model
def test_a_default_role_serves_and_trains_the_agents_no_role_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(sampling_dtype="float32", device="cpu")
    trained = record_role_batches(monkeypatch)
    store = ag.MemoryStore()
    config = GRPOConfig(
        steps=1, prompts_per_step=1, group_size=2, max_tokens=6, val_every=0, skip_uniform_groups=False,
        roles=ROLES, default_role="solver", policy=LORA,
    )  # fmt: skip
    ag.Trainer(GRPO(config, local_engine=engine), store=store).fit(solver_verifier_and_critic, [{"a": 12, "b": 30}])
    engine.close()

    (batches,) = trained
    calls = [
        s
        for r in asyncio.run(store.query_rollouts())
        for s in asyncio.run(store.query_spans(r.rollout_id))
        if sc.is_llm_call(s)
    ]
    served = {(sc.agent_name(s), s.attributes.get(sc.ADAPTER_NAME)) for s in calls}
    assert served == {("solver", "solver"), ("verifier", "verifier"), ("critic", "solver"), (None, "solver")}
    trained_ids = {role: {i for t, _ in batch for i in t.span_ids} for role, batch in batches.items()}
    assert trained_ids["verifier"] == {s.span_id for s in calls if sc.agent_name(s) == "verifier"}
    assert trained_ids["solver"] == {s.span_id for s in calls if sc.agent_name(s) != "verifier"}  # critic, unnamed too


def test_a_default_role_must_be_one_of_the_roles() -> None:
    with pytest.raises(ValueError, match="default adapter 'critic' is not one of the adapters"):
        GRPOConfig(roles=ROLES, default_role="critic", policy=LORA)
    with pytest.raises(ValueError, match="give roles= too"):
        GRPOConfig(default_role="solver", policy=LORA)
