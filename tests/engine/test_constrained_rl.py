"""Constrained decoding that RL can train on: what the engine records is what the trainer recomputes.

The engine samples under a grammar's mask but records the model's own logprob (before the mask) and
which tokens the grammar forced; the trainer scores the same ids without a grammar and leaves the
forced ones out. So recorded and recomputed logprobs agree as closely with a JSON schema or a forced
tool call as without constraints (docs/constrained-decoding.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import torch
from openai import OpenAI

import agentgrad as ag
from agentgrad.adapters import to_trajectories
from agentgrad.algorithms.grpo import GRPOConfig
from agentgrad.algorithms.grpo_update import grpo_update
from agentgrad.engine import Engine
from agentgrad.engine.constraints import json_schema_grammar
from agentgrad.engine.params import SamplingParams
from agentgrad.engine.training import ScoredSequence, sequence_logprobs


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CALC = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"],
                   "additionalProperties": False}}}
TOLERANCE = 1e-4
"""Absolute slack on "within 2x": the session engine samples in fp32, so the free case's difference is ~1e-6."""


def mean_abs_difference(engine: Engine, prompt: list[int], params: SamplingParams) -> tuple[float, int]:
    """Mean |recorded - recomputed| logprob over the tokens the policy chose (forced ones left out), and how many were forced."""
    generation = engine.generate([prompt], params)[0]
    sequences = [ScoredSequence(prompt + c.token_ids, len(prompt)) for c in generation.completions]
    with torch.no_grad():
        recomputed = sequence_logprobs(engine.model, sequences, params.temperature, engine.tokenizer.pad_token_id)
    total, count, forced = 0.0, 0, 0
    for completion, new in zip(generation.completions, recomputed):
        allowed = completion.allowed_tokens or [0] * len(completion.token_ids)
        for old, value, n in zip(completion.logprobs, new.tolist(), allowed):
            forced += n == 1
            if n != 1:
                total, count = total + abs(old - value), count + 1
    return total / count, forced


def test_recorded_logprobs_under_a_json_schema_are_those_the_trainer_recomputes(engine: Engine) -> None:
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Describe a person as JSON."}])
    free = SamplingParams(max_tokens=24, temperature=0.8, seed=3, n=4)
    free_difference, _ = mean_abs_difference(engine, prompt, free)
    schema_difference, forced = mean_abs_difference(engine, prompt, dataclasses.replace(free, grammar=json_schema_grammar(PERSON)))
    assert forced > 0  # `{"name": "` and the end of turn
    assert schema_difference <= 2 * free_difference + TOLERANCE, (schema_difference, free_difference)


@ag.rollout
def one_call(task: dict[str, Any], llm: ag.LLM) -> float:
    """One call: free, under a JSON schema, or a forced tool call (`task["kind"]`); the reward does not matter."""
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    extra: dict[str, Any] = {
        "free": {},
        "schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}},
        "tool": {"tools": [CALC], "tool_choice": "required"},
    }[task["kind"]]
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}],
                                   temperature=1.0, max_tokens=24, n=1, seed=task["seed"], **extra)
    return float(task["seed"] % 2)


@pytest.mark.slow
def test_a_first_grpo_step_under_a_schema_or_a_forced_tool_call_has_the_kl_of_a_free_one(engine: Engine) -> None:
    """Through the gateway, the adapter and GRPO's update (at learning rate 0, so the weights stay): train/kl and the
    mean |logprob difference| with constraints within 2x of the unconstrained case (they were 2927 and 0.217 vs 0.038)."""
    from agentgrad.policy.local import LocalPolicy

    kinds = ("free", "schema", "tool")
    questions = ["Describe a person as JSON.", "What is 12 * 7?"]
    tasks = [{"kind": kind, "question": q, "seed": seed} for kind in kinds for q in questions for seed in (1, 2)]
    store = ag.MemoryStore()
    with LocalPolicy(store, engine) as policy:
        ag.Trainer(store=store, resources={"llm": policy.llm()}).fit(one_call, tasks)
    batches: dict[str, list[Any]] = {kind: [] for kind in kinds}
    forced = 0
    for rollout in asyncio.run(store.query_rollouts()):
        spans = asyncio.run(store.query_spans(rollout.rollout_id))
        trajectories = to_trajectories(spans, reward=0.0, skip_forced=True)
        kind = rollout.input["kind"]
        batches[kind] += [(t, 1.0) for t in trajectories]
        forced += sum(kept.response_length - t.response_length for kept, t in zip(to_trajectories(spans), trajectories))
    assert forced > 0  # the grammar forced some tokens, and they left the loss
    cfg = GRPOConfig(micro_batch_size=4)  # the optimizer below steps at lr 0: the weights stay
    stats = {}
    for kind, batch in batches.items():
        assert len(batch) == len(questions) * 2
        with engine.training() as model:
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
            stats[kind] = grpo_update(model, optimizer, batch, cfg, engine.tokenizer.pad_token_id)
    for kind in ("schema", "tool"):
        for name in ("kl", "logprob_diff"):
            assert stats[kind][name] <= 2 * stats["free"][name] + TOLERANCE, (kind, name, stats)
