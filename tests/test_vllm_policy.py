"""vLLM as the policy engine, on the session's real vLLM server from .venv-vllm (tests/conftest.py's `smollm2_vllm`).

Each test attaches its own `VLLMPolicy` (trainer weights, gateway, transport) to the shared
server; attaching syncs the policy's weights into it first, so tests do not see each other's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import agentgrad as ag
from agentgrad import semconv
from agentgrad.algorithms.grpo import GRPO
from agentgrad.algorithms.sft import SFT, SFTConfig
from agentgrad.engine.model import resolve_model
from agentgrad.engine.tools import functions, parse_reply
from agentgrad.engine.training import ScoredSequence, sequence_logprobs
from agentgrad.policy.config import PolicyConfig
from agentgrad.policy.vllm import VLLMPolicy
from agentgrad.policy.vllm_server import VLLMServer
from agentgrad.store import MemoryStore, SqliteStore
from agentgrad.types import RolloutStatus
from examples.calc_agent import CALCULATE_TOOL, build_messages, calc_agent, make_splits
from tests.test_training_e2e import close_enough

pytestmark = [pytest.mark.vllm, pytest.mark.model]

NAME = "smollm2-135m"
LOGPROB_MEAN_TOLERANCE = 0.1
"""Mean |vLLM - trainer| per sampled token: vLLM samples in bf16 (fp32 on CPUs without bf16), the trainer in fp32.
The session's server has LoRA enabled, which doubles it for the base model's calls: 0.015-0.023 over 30 calls of 24
tokens at temperature 0.7, against 0.007-0.009 on a server without LoRA (AVX-512 BF16; 3 questions: up to 0.063)."""
LOGPROB_MAX_TOLERANCE = 1.0


@pytest.fixture
def policy(smollm2_vllm: VLLMServer) -> Iterator[VLLMPolicy]:
    with VLLMPolicy(MemoryStore(), urls=[smollm2_vllm.url]) as policy:
        yield policy


def chat(policy: VLLMPolicy, question: str, **params: Any) -> httpx.Response:
    body = {"model": NAME, "messages": build_messages(question), "return_token_ids": True, "logprobs": True, **params}
    response = httpx.post(f"{policy.gateway_url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response


def test_logprobs_vllm_samples_with_match_the_trainers_forward_pass(policy: VLLMPolicy) -> None:
    diffs: list[torch.Tensor] = []
    for question in ("What is 17 + 25?", "What is 9 * 8?", "What is 100 - 37?"):
        answer = chat(policy, question, temperature=0.7, max_tokens=24).json()
        choice = answer["choices"][0]
        prompt, response = answer["prompt_token_ids"], choice["token_ids"]
        sampled = torch.tensor([entry["logprob"] for entry in choice["logprobs"]["content"]])
        with torch.no_grad():
            (trainer,) = sequence_logprobs(
                policy.model,
                [ScoredSequence(prompt + response, len(prompt))],
                0.7,
                policy.engine.tokenizer.pad_token_id,
            )
        diffs.append((trainer - sampled).abs())
    every = torch.cat(diffs)
    assert every.mean() < LOGPROB_MEAN_TOLERANCE and every.max() < LOGPROB_MAX_TOLERANCE, (every.mean(), every.max())


def test_after_an_update_and_a_sync_responses_name_the_new_version_and_follow_the_new_weights(
    policy: VLLMPolicy,
) -> None:
    before = chat(policy, "What is 2 + 2?", temperature=0.0, max_tokens=8)
    old_version = int(before.headers[semconv.VERSION_HEADER])
    prompt = before.json()["prompt_token_ids"]
    target = policy.engine.tokenizer.encode(" banana")[0]
    assert before.json()["choices"][0]["token_ids"][0] != target
    # a deliberately large update: raise the logit of a rare token 10 above the trainer's best at the answer's start
    with policy.engine.training() as model, torch.no_grad():
        head = model.get_output_embeddings()
        seen: list[torch.Tensor] = []
        hook = head.register_forward_hook(lambda module, args, out: seen.append(args[0][0, -1]))
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
        hook.remove()
        hidden = seen[0]
        head.weight[target] += (logits.max() - logits[target] + 10.0) * hidden / hidden.square().sum()
        trainer_greedy = int(model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())
    version = policy.engine.publish()
    policy.sync()
    after = chat(policy, "What is 2 + 2?", temperature=0.0, max_tokens=8)
    assert int(after.headers[semconv.VERSION_HEADER]) == version > old_version
    assert trainer_greedy == target
    assert after.json()["choices"][0]["token_ids"][0] == target


async def test_a_sync_while_16_requests_are_in_flight_loses_none_and_mixes_no_versions(policy: VLLMPolicy) -> None:
    store = policy.store
    rollouts = [await store.start_rollout(i) for i in range(16)]
    old_version = policy.engine.version

    async def call(rollout: Any, client: httpx.AsyncClient) -> httpx.Response:
        route = f"{policy.gateway_url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"
        body = {
            "model": NAME,
            "messages": build_messages("Count from one to twenty."),
            "max_tokens": 48,
            "temperature": 1.0,
        }
        return await client.post(route + "/chat/completions", json=body, timeout=300)

    async with httpx.AsyncClient() as client:
        calls = [asyncio.ensure_future(call(r, client)) for r in rollouts]
        while not any(policy.pool.in_flight):  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
        with torch.no_grad(), policy.engine.training() as model:
            for p in model.parameters():
                p.mul_(1.001)
        policy.engine.publish()
        sync = asyncio.ensure_future(asyncio.to_thread(policy.sync))
        while policy.pool.open:  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
        late = [asyncio.ensure_future(call(r, client)) for r in rollouts[:4]]  # arrive during the sync
        await sync
        responses = await asyncio.gather(*calls, *late)
    assert [r.status_code for r in responses] == [200] * 20
    versions = [int(r.headers[semconv.VERSION_HEADER]) for r in responses]
    assert set(versions[:16]) <= {old_version, policy.engine.version}
    assert versions[16:] == [policy.engine.version] * 4
    httpx.post(f"{policy.gateway_url}/v1/agentgrad/flush", timeout=60)
    spans = [s for r in rollouts for s in await store.query_spans(r.rollout_id)]
    assert len(spans) == 20
    assert sorted(s.attributes[semconv.WEIGHTS_VERSION] for s in spans) == sorted(versions)


def test_a_few_grpo_steps_on_vllm_write_metrics_and_a_checkpoint_and_resume(
    tmp_path: Path, smollm2_vllm: VLLMServer
) -> None:
    train, val = make_splits(n_train=40, n_val=4, seed=7)
    checkpoints = tmp_path / "checkpoints"
    config = dict(
        prompts_per_step=2,
        group_size=4,
        max_tokens=16,
        val_every=0,
        checkpoint_dir=str(checkpoints),
        checkpoint_every=1,
        keep_checkpoints=1,
        learning_rate=1e-5,
        success_threshold=0.99,
        engine="vllm",
        vllm_urls=[smollm2_vllm.url],
        tis_cap=2.0,
    )
    store = SqliteStore(tmp_path / "run.db")
    result = ag.Trainer(GRPO(steps=1, **config), n_runners=1, runner_concurrency=8, store=store).fit(
        close_enough, train, val
    )
    assert [h["step"] for h in result.history] == [1]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-1"]

    async def metric(name: str) -> list[Any]:
        return await store.query_metrics(name)

    for name in ("train/reward_mean", "train/logprob_diff", "train/tis_truncated", "perf/sync_seconds"):
        assert [m.step for m in asyncio.run(metric(name))] == [1], name
    # step 1 samples and scores the same weights; later steps add the fp32 updates bf16 serving rounds away
    assert 0 <= asyncio.run(metric("train/logprob_diff"))[0].value < LOGPROB_MEAN_TOLERANCE
    resumed = ag.Trainer(GRPO(steps=2, **config), n_runners=1, runner_concurrency=8, store=store).fit(
        close_enough, train, val
    )
    assert [h["step"] for h in resumed.history] == [1, 2]  # step 1 restored from the checkpoint, step 2 run
    # pruning keeps the latest and spares the best validated: step-1 (a tie stays earlier) unless step 2 beat it
    best = resumed.best_checkpoint
    assert best is not None and best.path in (str(checkpoints / "step-1"), str(checkpoints / "step-2"))
    assert sorted(p.name for p in checkpoints.iterdir()) == sorted({"step-2", Path(best.path).name})
    assert len(asyncio.run(store.query_rollouts(mode="train"))) == 2 * 2 * 4


def test_an_sft_round_on_vllm_trains_syncs_and_the_next_responses_name_the_new_version(smollm2_vllm: VLLMServer) -> None:
    train, val = make_splits(n_train=20, n_val=4, seed=3)
    store = MemoryStore()
    # a low threshold (within 9 of the answer) keeps some of 16 samples even from the untrained model
    config = SFTConfig(
        steps=1,
        prompts_per_step=4,
        group_size=4,
        reward_threshold=0.1,
        max_tokens=16,
        epochs=1,
        policy=PolicyConfig(engine="vllm", vllm_urls=[smollm2_vllm.url]),
    )
    result = ag.Trainer(SFT(config), n_runners=1, runner_concurrency=8, store=store).fit(close_enough, train, val)
    (round_,) = result.history
    assert round_["train/kept"] > 0 and round_["train/loss"] == round_["train/loss"]  # trained: not NaN

    async def versions(mode: str) -> list[int]:
        spans = [s for r in await store.query_rollouts(mode=mode) for s in await store.query_spans(r.rollout_id)]
        return sorted(s.attributes[semconv.WEIGHTS_VERSION] for s in spans if semconv.WEIGHTS_VERSION in s.attributes)

    collected = asyncio.run(versions("train"))
    assert len(collected) == 4 * 4 and len(set(collected)) == 1  # one version collected the round
    (before,) = set(collected)
    # validation before the round on the old weights, after it (post-sync) on the new ones
    assert asyncio.run(versions("val")) == [before] * 4 + [before + 1] * 4


def test_a_chat_call_with_tools_and_auto_choice_is_served_and_its_calls_parsed_with_exact_token_ids(
    policy: VLLMPolicy,
) -> None:
    """The server agentgrad starts for SmolLM2 parses pythonic calls (`tool_flags`; without them vLLM answered 400),
    from the very prompt the built-in engine builds, tools and a tool round included."""
    tools = [CALCULATE_TOOL]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "calculate", "arguments": json.dumps({"expression": "123 + 456"})},
    }
    question = build_messages("What is 123 + 456?", "function")
    tool_round = [
        *question,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "579"},
    ]
    called = 0
    for messages in (question, tool_round):
        body = {
            "model": NAME,
            "messages": messages,
            "tools": tools,
            "tool_choice": "auto",
            "n": 16,
            "seed": 1,
            "return_token_ids": True,
            "temperature": 1.0,
            "max_tokens": 32,
        }
        response = httpx.post(f"{policy.gateway_url}/v1/chat/completions", json=body, timeout=300)
        assert response.status_code == 200, response.text
        assert response.json()["prompt_token_ids"] == policy.engine.chat_prompt_ids(messages, tools)
        for choice in response.json()["choices"]:
            text = policy.engine.tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
            ours = parse_reply(text, functions(tools))  # what the built-in engine makes of the same tokens
            theirs = choice["message"].get("tool_calls") or []
            called += bool(theirs)
            assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in theirs] == [
                (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in ours.tool_calls
            ], text
    print(f"{called}/32 replies called the calculator")
    # the spans say vLLM's pythonic parser read the calls, and that agentgrad's parser reads their text alike
    httpx.post(f"{policy.gateway_url}/v1/agentgrad/flush", timeout=60)
    spans = [s for s in asyncio.run(policy.store.query_spans(None)) if semconv.is_llm_call(s)]
    parsers = [s.attributes.get(semconv.TOOL_CALLS_PARSER) for s in spans]
    assert len(spans) == 2 and {p for p in parsers if p} == ({"vllm:pythonic"} if called else set()), parsers
    assert not [
        s.attributes.get(semconv.TOOL_CALLS_OTHER_PARSE)
        for s in spans
        if semconv.TOOL_CALLS_PARSER_DISAGREES in s.attributes
    ]


def test_one_grpo_step_of_the_function_calling_agent_on_vllm_fails_no_rollout(
    tmp_path: Path, smollm2_vllm: VLLMServer
) -> None:
    train, val = make_splits(n_train=40, n_val=2, seed=5, demo="function")
    config = dict(
        prompts_per_step=2,
        group_size=4,
        max_tokens=32,
        val_every=0,
        learning_rate=1e-5,
        engine="vllm",
        vllm_urls=[smollm2_vllm.url],
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )
    store = MemoryStore()
    result = ag.Trainer(GRPO(steps=1, **config), n_runners=1, runner_concurrency=8, store=store).fit(
        calc_agent, train, val
    )
    assert [h["step"] for h in result.history] == [1]
    rollouts = asyncio.run(store.query_rollouts(mode="train"))
    assert len(rollouts) == 2 * 4
    assert [r.status for r in rollouts if r.status != RolloutStatus.SUCCEEDED] == []


def test_a_policy_given_only_an_engine_starts_its_servers_from_that_engines_model(tmp_path: Path) -> None:
    """Given the trainer's engine and no model name, the servers must serve the engine's model, not the default."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from agentgrad.engine import Engine

    smollm2 = resolve_model()
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = Engine(tmp_path, sampling_dtype="float32")
    try:
        assert engine.source == str(tmp_path)
        policy = VLLMPolicy(MemoryStore(), engine)
        assert policy.model_path == str(tmp_path) != smollm2
    finally:
        engine.close()
