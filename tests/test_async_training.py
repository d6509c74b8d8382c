"""Asynchronous training on the real model: new weights between calls, and GRPO with max_staleness=1."""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from pathlib import Path

import pytest
import torch
from openai import OpenAI

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.algorithms.grpo import GRPO, GRPOConfig
from agentgrad.algorithms.sft import SFT, SFTConfig
from agentgrad.engine import Engine
from agentgrad.engine.training import ScoredSequence, sequence_logprobs
from agentgrad.policy.local import LocalPolicy
from agentgrad.store import SqliteStore
from examples.calc_agent import build_messages, make_splits
from tests.helpers import wait_until
from tests.test_training_e2e import close_enough

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def own_engine() -> Engine:
    """An engine of this module's own, sampling from its fp32 training weights: training changes them."""
    return Engine(sampling_dtype="float32", device="cpu")


def test_new_weights_reach_the_engine_between_calls_never_inside_one(own_engine: Engine) -> None:
    store = ag.MemoryStore()
    old = copy.deepcopy(own_engine.model)
    with LocalPolicy(store, own_engine) as policy:
        policy.train_beside_serving()
        before = own_engine.version
        with policy.training() as model, torch.no_grad():
            model.get_input_embeddings().weight.mul_(1.5)  # the update: a copy changes, what is served does not
        assert torch.equal(own_engine.model.get_input_embeddings().weight, old.get_input_embeddings().weight)
        attempt = asyncio.run(store.start_rollout({"q": 1}, mode="train"))
        client = OpenAI(base_url=sc.gateway_route(policy.llm().base_url, attempt.rollout_id,
                                                  attempt.attempt.attempt_id), api_key="unused")
        call = threading.Thread(target=lambda: client.chat.completions.create(
            model=own_engine.name, messages=build_messages("What is 12+30?"), max_tokens=40, temperature=1.0))
        call.start()
        assert policy.calls is not None
        wait_until(lambda: policy.calls.in_flight[0] == 1, "the call in flight")  # type: ignore[union-attr]
        assert policy.publish() == before + 1  # waits for the call in flight, then swaps
        published_at = time.time()
        call.join()
        (span,) = wait_until(lambda: [s for s in asyncio.run(store.query_spans(attempt.rollout_id))
                                      if sc.is_llm_call(s)], "the call's span")
    assert sc.weights_version(span) == before
    assert span.end_time is not None and span.end_time <= published_at  # the swap came after its last token
    prompt, response = span.attributes[sc.PROMPT_TOKEN_IDS], span.attributes[sc.RESPONSE_TOKEN_IDS]
    recorded = torch.tensor(span.attributes[sc.RESPONSE_LOGPROBS])
    sequence = [ScoredSequence(prompt + response, len(prompt))]
    with torch.no_grad():
        (under_old,) = sequence_logprobs(old, sequence)
        (under_new,) = sequence_logprobs(own_engine.model, sequence)
    assert (recorded - under_old).abs().max() < 1e-3  # every token from the old weights
    assert (under_new - under_old).abs().max() > 0.05  # which the new ones would not have given
    assert torch.equal(own_engine.model.get_input_embeddings().weight, policy.model.get_input_embeddings().weight)
    with torch.no_grad():  # give the module's engine its weights back
        own_engine.model.load_state_dict(old.state_dict())
        own_engine.publish()


def test_grpo_with_max_staleness_1_trains_within_the_bound_and_checkpoints_the_queued_step(
    tmp_path: Path, own_engine: Engine
) -> None:
    train, _ = make_splits(n_train=20, n_val=2, seed=11)
    store = SqliteStore(tmp_path / "run.db")
    checkpoints = tmp_path / "checkpoints"
    config = GRPOConfig(steps=3, prompts_per_step=2, group_size=2, max_tokens=8, val_every=0, max_staleness=1,
                        checkpoint_dir=str(checkpoints), checkpoint_every=1, keep_checkpoints=0, success_threshold=0.99)
    result = ag.Trainer(GRPO(config, local_engine=own_engine), n_runners=2, runner_concurrency=4,
                        store=store).fit(close_enough, train)
    assert [h["step"] for h in result.history] == [1, 2, 3]
    for h in result.history:
        assert h["async/staleness_max"] <= 1 and h["async/dropped_groups"] == 0
        assert h["async/staleness_0"] + h["async/staleness_1"] == 2  # every group of the step has a version
    rollouts = asyncio.run(store.query_rollouts(mode="train"))
    assert len(rollouts) == 3 * 2 * 2  # nothing queued past the last step
    for rollout in rollouts:  # each attempt's calls name one version
        versions = {sc.weights_version(s) for s in asyncio.run(store.query_spans(rollout.rollout_id)) if sc.is_llm_call(s)}
        assert len(versions) == 1 and None not in versions
    saved = json.loads((checkpoints / "step-1" / "agentgrad.json").read_text())
    step_2 = [r.rollout_id for r in rollouts if r.metadata["step"] == 2]
    assert saved["queued"]["2"]["ids"] == step_2  # queued during step 1, kept for a resume
    assert json.loads((checkpoints / "step-3" / "agentgrad.json").read_text())["queued"] == {}
    metrics = {m.name for m in asyncio.run(store.query_metrics(prefix="async/"))}
    assert {"async/staleness_mean", "async/dropped_groups", "async/mixed_version_rollouts"} <= metrics
    assert {m.name for m in asyncio.run(store.query_metrics(prefix="train/is_weight"))} == {
        "train/is_weight_mean", "train/is_weight_max"} or not any(h.get("train/loss") for h in result.history)


def test_sft_with_max_staleness_1_queues_the_next_round_and_fine_tunes_within_the_bound(own_engine: Engine) -> None:
    train, _ = make_splits(n_train=20, n_val=2, seed=5)
    store = ag.MemoryStore()
    version = own_engine.version
    config = SFTConfig(rounds=2, tasks_per_round=2, samples_per_task=2, reward_threshold=0.0, max_tokens=8, epochs=1,
                       max_staleness=1)
    result = ag.Trainer(SFT(config, local_engine=own_engine), n_runners=2, runner_concurrency=4,
                        store=store).fit(close_enough, train)
    assert [h["round"] for h in result.history] == [1, 2]
    assert own_engine.version == version + 2  # every round kept samples and published once
    for h in result.history:
        assert h["train/kept"] > 0 and h["async/staleness_max"] <= 1 and h["async/dropped_groups"] == 0
    rollouts = asyncio.run(store.query_rollouts(mode="train"))
    assert [r.metadata["step"] for r in rollouts] == [1] * 4 + [2] * 4  # round 2 queued with round 1
    for rollout in rollouts:
        versions = {sc.weights_version(s) for s in asyncio.run(store.query_spans(rollout.rollout_id)) if sc.is_llm_call(s)}
        assert len(versions) == 1 and versions <= {version, version + 1}
