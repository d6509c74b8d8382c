"""One LoRA adapter per agent role on vLLM (`GRPOConfig(roles=..., engine="vllm")`), on the session's real vLLM
server from .venv-vllm, started with `--enable-lora --max-loras 2` (tests/conftest.py's `smollm2_vllm`).

Each test attaches its own `VLLMPolicy` (a fresh trainer engine holding the two role adapters, its gateway and LoRA
transport) to the server; attaching pushes the policy's adapters first, so tests do not see each other's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.algorithms.grpo import GRPO
from agentgrad.algorithms.updates import RoleUpdate
from agentgrad.engine.adapters import adapter_parameters
from agentgrad.engine.training import ScoredSequence, sequence_logprobs
from agentgrad.policy.transports import LORA_NAME, LoRATransport
from agentgrad.policy.vllm import VLLMPolicy
from agentgrad.policy.vllm_server import VLLMServer
from agentgrad.store import MemoryStore
from tests.helpers import VLLM_LORA_RANK
from tests.test_roles import ROLES, snapshot, solver_and_verifier

pytestmark = [pytest.mark.vllm, pytest.mark.model]

NAME = "smollm2-135m"
RANK = VLLM_LORA_RANK  # the session server is started for it
TEMPERATURE = 0.7
ADAPTER_LOGPROB_TOLERANCE = 0.5
"""Mean |vLLM - trainer| per sampled token under the same adapter. vLLM serves bf16 (adapters included) where the CPU
has native bf16, the trainer fp32: 0.013-0.157 measured with these random adapters (0.157 in CI, a sampled answer with
unlikely tokens), 1.6-3.5 under another one; 0.5 sits between."""
ADAPTER_GAP_RATIO = 4.0
"""Under any other adapter (or the base) the trainer's logprobs are at least this many times further from vLLM's."""
PROMPTS = ("Write one sentence about the sea.", "Name a colour.")
"""Open questions: many next tokens are near each other, so different adapters answer differently even greedily (the
calculator's few-shot prompt makes the model so sure of `Answer: 42` that small adapters change nothing)."""
ADAPTER_SCALE = 0.2
"""Standard deviation of the random LoRA B entries the tests give the adapters: greedy answers then differ per adapter
(at 0.05 they did not on the calculator prompt), and the logprobs under another adapter are 1.6-3.5 apart per token."""


@pytest.fixture
def policy(smollm2_vllm: VLLMServer) -> Iterator[VLLMPolicy]:
    with VLLMPolicy(MemoryStore(), urls=[smollm2_vllm.url], adapters=ROLES, lora_rank=RANK) as policy:
        yield policy
    policy.engine.close()


def set_adapter_weights(policy: VLLMPolicy, role: str, seed: int) -> None:
    """Give `role`'s adapter random non-zero LoRA B matrices (at start they are zero: the adapter is the base), and
    publish: the next `sync()` pushes them."""
    generator = torch.Generator().manual_seed(seed)
    with policy.engine.training() as model, torch.no_grad():
        for name, weight in model.named_parameters():
            if f"lora_B.{role}." in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * ADAPTER_SCALE)
    policy.engine.publish()


def chat(policy: VLLMPolicy, agent: str | None, prompt: str, rollout: Any, **params: Any) -> dict[str, Any]:
    """One call through the policy's gateway as `agent` (None: no agent name), in `rollout`'s attempt."""
    route = f"{policy.gateway_url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}"
    if agent is not None:
        route += f"/agents/{agent}"
    body = {"model": NAME, "messages": [{"role": "user", "content": prompt}], "return_token_ids": True, "logprobs": True,
            "max_tokens": 12, **params}  # fmt: skip
    response = httpx.post(f"{route}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return {**response.json(), "version": int(response.headers[sc.VERSION_HEADER])}


def greedy_tokens(policy: VLLMPolicy, agent: str | None, rollout: Any) -> list[list[int]]:
    return [chat(policy, agent, p, rollout, temperature=0.0)["choices"][0]["token_ids"] for p in PROMPTS]


def llm_spans(policy: VLLMPolicy, rollout: Any) -> list[Any]:
    httpx.post(f"{policy.gateway_url}/v1/agentgrad/flush", timeout=60)
    spans = asyncio.run(policy.store.query_spans(rollout.rollout_id))
    return sorted((s for s in spans if sc.is_llm_call(s)), key=lambda s: s.sequence_id)


def trainer_logprob_gap(policy: VLLMPolicy, answer: dict[str, Any], adapter: str) -> float:
    """Mean |vLLM's logprob - the trainer's| over the sampled tokens, the trainer running `adapter` (or the base)."""
    prompt, response = answer["prompt_token_ids"], answer["choices"][0]["token_ids"]
    served = torch.tensor([entry["logprob"] for entry in answer["choices"][0]["logprobs"]["content"]])

    def logprobs(model: Any) -> torch.Tensor:
        sequence = ScoredSequence(prompt + response, len(prompt))
        (scored,) = sequence_logprobs(model, [sequence], TEMPERATURE, policy.engine.tokenizer.pad_token_id)
        return scored

    with policy.engine.training() as model, torch.no_grad():
        if adapter == sc.BASE_ADAPTER:
            with model.disable_adapter():
                trainer = logprobs(model)
        else:
            model.set_adapter(adapter)
            trainer = logprobs(model)
    return float((trainer - served).abs().mean())


def assert_sampled_by(policy: VLLMPolicy, answer: dict[str, Any], adapter: str) -> None:
    """The logprobs vLLM reported are the trainer's under `adapter` (or the base), and not under any other."""
    gaps = {other: trainer_logprob_gap(policy, answer, other) for other in (*ROLES, sc.BASE_ADAPTER)}
    own = gaps.pop(adapter)
    assert own < ADAPTER_LOGPROB_TOLERANCE and own * ADAPTER_GAP_RATIO < min(gaps.values()), (adapter, own, gaps)


def test_each_roles_calls_are_served_by_its_adapter_and_the_span_names_it(policy: VLLMPolicy) -> None:
    set_adapter_weights(policy, "solver", seed=1)
    set_adapter_weights(policy, "verifier", seed=2)
    policy.sync()
    rollout = asyncio.run(policy.store.start_rollout("task"))
    answers = {role: chat(policy, role, PROMPTS[0], rollout, temperature=TEMPERATURE) for role in ROLES}
    assert {role: a["model"] for role, a in answers.items()} == {"solver": "solver", "verifier": "verifier"}  # vLLM's
    spans = llm_spans(policy, rollout)
    assert [(sc.agent_name(s), s.attributes[sc.ADAPTER_NAME]) for s in spans] == [("solver", "solver"),
                                                                                  ("verifier", "verifier")]  # fmt: skip
    for role, answer in answers.items():
        assert_sampled_by(policy, answer, role)
    assert greedy_tokens(policy, "solver", rollout) != greedy_tokens(policy, "verifier", rollout)


def test_syncing_one_roles_changed_adapter_leaves_the_other_roles_greedy_answers_unchanged(policy: VLLMPolicy) -> None:
    set_adapter_weights(policy, "solver", seed=1)
    set_adapter_weights(policy, "verifier", seed=2)
    policy.sync()
    rollout = asyncio.run(policy.store.start_rollout("task"))
    before = {role: greedy_tokens(policy, role, rollout) for role in ROLES}
    old_version = policy.engine.version
    set_adapter_weights(policy, "solver", seed=3)  # the solver's adapter alone changes
    policy.sync()
    after = {role: greedy_tokens(policy, role, rollout) for role in ROLES}
    assert after["verifier"] == before["verifier"]
    assert after["solver"] != before["solver"]
    versions = {s.attributes[sc.WEIGHTS_VERSION] for s in llm_spans(policy, rollout)}
    assert versions == {old_version, policy.engine.version} and policy.engine.version > old_version


def test_an_agent_no_role_matches_and_a_call_with_no_agent_are_served_by_the_base_model_and_say_so(
    policy: VLLMPolicy,
) -> None:
    set_adapter_weights(policy, "solver", seed=1)
    set_adapter_weights(policy, "verifier", seed=2)
    policy.sync()
    rollout = asyncio.run(policy.store.start_rollout("task"))
    answers = [chat(policy, agent, PROMPTS[0], rollout, temperature=TEMPERATURE) for agent in ("planner", None)]
    assert [a["model"] for a in answers] == [NAME, NAME]  # vLLM ran the base model
    spans = llm_spans(policy, rollout)
    assert [(sc.agent_name(s), s.attributes[sc.ADAPTER_NAME]) for s in spans] == [("planner", sc.BASE_ADAPTER),
                                                                                  (None, sc.BASE_ADAPTER)]  # fmt: skip
    for answer in answers:
        assert_sampled_by(policy, answer, sc.BASE_ADAPTER)


def test_one_grpo_step_with_two_roles_on_vllm_changes_both_adapters_not_the_base_pushes_both_and_resumes(
    tmp_path: Path, smollm2_vllm: VLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    before: dict[str, dict[str, torch.Tensor]] = {}
    trained: list[Any] = []
    real_init: Callable[..., None] = RoleUpdate.__init__

    def spied_init(self: RoleUpdate, *args: Any, **kwargs: Any) -> None:  # the weights as the run starts
        real_init(self, *args, **kwargs)
        trained.append(self.policy.model)
        before["base"] = snapshot(self.policy.model, lambda n: "lora_" not in n)
        for role in ROLES:
            before[role] = snapshot(self.policy.model, lambda n, role=role: f".{role}." in n)

    pushes: list[tuple[int, list[str], dict[str, list[torch.Tensor]]]] = []  # version, names, adapters' weights
    real_push = LoRATransport.push

    def spied_push(self: LoRATransport, model: torch.nn.Module, version: int) -> None:
        pushes.append((version, list(self.served), adapter_weights(model)))
        real_push(self, model, version)

    monkeypatch.setattr(RoleUpdate, "__init__", spied_init)
    monkeypatch.setattr(LoRATransport, "push", spied_push)
    store = MemoryStore()
    grpo = GRPO(steps=1, prompts_per_step=2, group_size=2, max_tokens=8, val_every=0, learning_rate=1e-3,
                skip_uniform_groups=False, roles=ROLES, lora_rank=RANK, engine="vllm", vllm_urls=[smollm2_vllm.url],
                checkpoint_dir=str(tmp_path / "checkpoints"))  # fmt: skip
    result = ag.Trainer(grpo, n_runners=1, runner_concurrency=4, store=store).fit(
        solver_and_verifier, [{"a": 12, "b": 30}, {"a": 7, "b": 5}]
    )
    history = result.history[0]
    assert {"train/solver/reward_mean", "train/verifier/reward_mean", "train/solver/loss"} <= set(history)

    # ---- every call was served by its role's adapter on vLLM, and the span says so
    rollouts = asyncio.run(store.query_rollouts())
    calls = [s for r in rollouts for s in asyncio.run(store.query_spans(r.rollout_id)) if sc.is_llm_call(s)]
    assert len(calls) == 2 * 2 * 2 and all(s.attributes[sc.GEN_AI_SYSTEM] == "vllm" for s in calls)
    assert all(s.attributes[sc.ADAPTER_NAME] == sc.agent_name(s) for s in calls)

    # ---- both adapters moved, the base did not; the update's adapters reached the server under their names
    (model,) = trained
    after = {name: p.detach() for name, p in model.named_parameters()}
    assert all(torch.equal(after[name], value) for name, value in before["base"].items())
    for role in ROLES:
        assert any(not torch.equal(after[name], value) for name, value in before[role].items()), role
    assert len(pushes) == 2 and all(served == list(ROLES) for _, served, _ in pushes)  # at start, after the step
    assert pushes[1][0] == pushes[0][0] + 1  # the step's new version
    assert same_weights(pushes[1][2], adapter_weights(model))  # the step's adapters, not the ones before it
    assert {p.name for p in (tmp_path / "checkpoints" / "step-1").iterdir() if p.is_dir()} == set(ROLES)

    # ---- a resumed run restores both roles from the checkpoint and pushes them to the server
    resumed = ag.Trainer(GRPO(grpo.config), n_runners=1, runner_concurrency=4, store=MemoryStore()).fit(
        solver_and_verifier, [{"a": 12, "b": 30}, {"a": 7, "b": 5}]
    )
    assert resumed.history[0]["train/verifier/reward_mean"] == history["train/verifier/reward_mean"]
    assert len(pushes) == 4  # the fresh adapters as it starts, then the restored ones
    assert same_weights(pushes[3][2], adapter_weights(model)) and not same_weights(pushes[2][2], pushes[3][2])


def adapter_weights(model: Any) -> dict[str, list[torch.Tensor]]:
    return {role: [p.detach().clone() for p in adapter_parameters(model, role)] for role in ROLES}


def same_weights(a: dict[str, list[torch.Tensor]], b: dict[str, list[torch.Tensor]]) -> bool:
    return all(torch.equal(x, y) for role in ROLES for x, y in zip(a[role], b[role], strict=True))


def test_a_policy_with_one_adapter_and_no_roles_serves_every_agent_by_it(smollm2_vllm: VLLMServer) -> None:
    """The LoRA transport's single-adapter use, unchanged by roles: every call goes to `LORA_NAME`."""
    with VLLMPolicy(MemoryStore(), urls=[smollm2_vllm.url], lora_rank=RANK) as policy:
        rollout = asyncio.run(policy.store.start_rollout("task"))
        answers = [chat(policy, agent, PROMPTS[0], rollout, temperature=0.0) for agent in ("solver", None)]
        assert [a["model"] for a in answers] == [LORA_NAME, LORA_NAME]
        assert all(sc.ADAPTER_NAME not in s.attributes for s in llm_spans(policy, rollout))
    policy.engine.close()
