"""Asynchronous training on the real model: new weights between calls, and GRPO with max_staleness=1."""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from openai import OpenAI

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.algorithms.async_rollouts import fresh_groups
from agentgrad.algorithms.grpo import GRPO, GRPOConfig
from agentgrad.algorithms.sft import SFT, SFTConfig
from agentgrad.engine import Engine
from agentgrad.engine.training import ScoredSequence, sequence_logprobs
from agentgrad.policy.local import LocalPolicy
from agentgrad.store import SqliteStore
from examples.calc_agent import build_messages, make_splits, parse_answer
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
    config = SFTConfig(steps=2, prompts_per_step=2, group_size=2, reward_threshold=0.0, max_tokens=8, epochs=1,
                       max_staleness=1)
    result = ag.Trainer(SFT(config, local_engine=own_engine), n_runners=2, runner_concurrency=4,
                        store=store).fit(close_enough, train)
    assert [h["step"] for h in result.history] == [1, 2]
    assert own_engine.version == version + 2  # every round kept samples and published once
    for h in result.history:
        assert h["train/kept"] > 0 and h["async/staleness_max"] <= 1 and h["async/dropped_groups"] == 0
    rollouts = asyncio.run(store.query_rollouts(mode="train"))
    assert [r.metadata["step"] for r in rollouts] == [1] * 4 + [2] * 4  # round 2 queued with round 1
    for rollout in rollouts:
        versions = {sc.weights_version(s) for s in asyncio.run(store.query_spans(rollout.rollout_id)) if sc.is_llm_call(s)}
        assert len(versions) == 1 and versions <= {version, version + 1}


def chat(policy: LocalPolicy, rollout_id: str, attempt_id: str) -> None:
    """One short model call of the given attempt, through the gateway."""
    client = OpenAI(base_url=sc.gateway_route(policy.llm().base_url, rollout_id, attempt_id), api_key="unused")
    client.chat.completions.create(model=policy.engine.name, messages=build_messages("What is 2+3?"), max_tokens=4)


def versions_of(store: ag.MemoryStore, rollout_id: str, calls: int | None = None) -> list[int | None]:
    """The weights version of each of the rollout's model calls (once `calls` of them are recorded)."""

    def recorded() -> list[int | None]:
        return [sc.weights_version(s) for s in asyncio.run(store.query_spans(rollout_id)) if sc.is_llm_call(s)]

    return recorded() if calls is None else wait_until(lambda: len(v := recorded()) == calls and v, "the spans")


def test_a_publish_waits_for_the_attempts_mid_flight_so_an_attempts_calls_share_one_version(own_engine: Engine) -> None:
    store = ag.MemoryStore()
    with LocalPolicy(store, own_engine) as policy:
        policy.train_beside_serving()
        pool, version = policy.calls, own_engine.version
        assert pool is not None
        began = asyncio.run(store.start_rollout({"q": 1}, mode="train"))  # a two-call attempt, between its calls
        new = asyncio.run(store.start_rollout({"q": 2}, mode="train"))  # an attempt that has not called yet
        chat(policy, began.rollout_id, began.attempt.attempt_id)
        published: list[int] = []
        publisher = threading.Thread(target=lambda: published.append(policy.publish()))
        publisher.start()
        wait_until(lambda: pool._attempts_held, "the publish holding new attempts")
        first = threading.Thread(target=chat, args=(policy, new.rollout_id, new.attempt.attempt_id))
        first.start()
        wait_until(lambda: pool.held_calls == 1, "the new attempt's first call held")
        chat(policy, began.rollout_id, began.attempt.attempt_id)  # its second call goes on, on the same weights
        assert publisher.is_alive() and first.is_alive() and own_engine.version == version  # waiting for its end
        asyncio.run(store.update_attempt(began.rollout_id, began.attempt.attempt_id, status="succeeded", reward=1.0))
        publisher.join(60)
        first.join(60)
        assert published == [version + 1] and policy.straddling == []
        assert versions_of(store, began.rollout_id, 2) == [version, version]
        assert versions_of(store, new.rollout_id, 1) == [version + 1]


def test_an_attempt_the_publish_stops_waiting_for_straddles_the_swap_and_is_dropped_from_training_and_counted(
    own_engine: Engine,
) -> None:
    store = ag.MemoryStore()
    with LocalPolicy(store, own_engine, attempt_wait_s=0) as policy:
        policy.train_beside_serving()
        version = own_engine.version
        straddling = asyncio.run(store.start_rollout({"q": 1}, mode="train"))
        chat(policy, straddling.rollout_id, straddling.attempt.attempt_id)
        assert policy.publish() == version + 1 and policy.straddling == [straddling.rollout_id]
        chat(policy, straddling.rollout_id, straddling.attempt.attempt_id)
        sibling = asyncio.run(store.start_rollout({"q": 1}, mode="train"))  # the same group, after the swap
        chat(policy, sibling.rollout_id, sibling.attempt.attempt_id)
        for attempt in (straddling, sibling):
            asyncio.run(store.update_attempt(attempt.rollout_id, attempt.attempt.attempt_id, status="succeeded",
                                             reward=1.0))
        assert versions_of(store, straddling.rollout_id, 2) == [version, version + 1]
        assert versions_of(store, sibling.rollout_id, 1) == [version + 1]
    rollouts = asyncio.run(store.query_rollouts(rollout_ids=[straddling.rollout_id, sibling.rollout_id]))
    fresh = asyncio.run(fresh_groups(store, rollouts, [0, 0], current_version=version + 1, max_staleness=1))
    assert [r.rollout_id for r in fresh.rollouts] == [sibling.rollout_id]  # never trained on a mix of versions
    assert fresh.metrics()["async/mixed_version_rollouts"] == 1 and fresh.dropped == 0


PUBLISHING = threading.Event()  # set while LocalPolicy.publish runs: what `two_calls`'s tool waits for
TOOL_SECONDS = 20.0


@ag.rollout
def two_calls(task: dict[str, Any], llm: ag.LLM) -> float:
    """A two-turn calc agent: it asks, waits on a tool, then asks again with the first answer; the last one scores."""
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    messages = build_messages(task["question"])
    first = client.chat.completions.create(model=llm.model, messages=messages, **llm.sampling_parameters)
    # the tool: it answers once a publish has begun (or after TOOL_SECONDS), so a publish lands here if it can
    PUBLISHING.wait(TOOL_SECONDS)
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": "Check it and answer again."}]
    reply = client.chat.completions.create(model=llm.model, messages=messages, **llm.sampling_parameters)
    answer = parse_answer(reply.choices[0].message.content or "")
    return 0.0 if answer is None else 1.0 / (1.0 + abs(answer - task["answer"]))


def test_grpo_with_max_staleness_1_and_a_two_call_agent_trains_no_attempt_that_mixes_versions(
    own_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish, publishes = LocalPolicy.publish, []

    def watched(policy: LocalPolicy) -> int:
        publishes.append(time.time())
        PUBLISHING.set()  # the next step's attempts, between their two calls, go on now
        try:
            return publish(policy)
        finally:
            PUBLISHING.clear()

    monkeypatch.setattr(LocalPolicy, "publish", watched)
    train, _ = make_splits(n_train=20, n_val=2, seed=3)
    store = ag.MemoryStore()
    config = GRPOConfig(steps=3, prompts_per_step=2, group_size=2, max_tokens=6, val_every=0, max_staleness=1,
                        success_threshold=0.99)
    result = ag.Trainer(GRPO(config, local_engine=own_engine), n_runners=1, runner_concurrency=4,
                        store=store).fit(two_calls, train)  # one step at a time: the next runs during the update
    rollouts = asyncio.run(store.query_rollouts(mode="train"))
    calls = {r.rollout_id: [s for s in asyncio.run(store.query_spans(r.rollout_id)) if sc.is_llm_call(s)]
             for r in rollouts}
    assert all(len(c) == 2 for c in calls.values())  # both calls of every attempt recorded
    straddled = [rid for rid, (first, second) in calls.items()
                 if any(first.start_time < t < second.start_time for t in publishes)]
    assert straddled  # a publish began between some attempt's two calls ...
    mixed = [rid for rid, c in calls.items() if len({sc.weights_version(s) for s in c}) > 1]
    assert mixed == []  # ... and waited for it to end: no attempt's calls mix versions
    assert [h["async/mixed_version_rollouts"] for h in result.history] == [0] * 3
    assert all(h["async/staleness_max"] <= 1 for h in result.history)


def test_grpo_resumed_mid_run_trains_the_groups_queued_before_the_crash_once_and_samples_none_again(
    tmp_path: Path, own_engine: Engine
) -> None:
    train, _ = make_splits(n_train=20, n_val=2, seed=13)
    checkpoints = tmp_path / "checkpoints"
    config = GRPOConfig(steps=3, prompts_per_step=2, group_size=2, max_tokens=8, val_every=0, max_staleness=1,
                        checkpoint_dir=str(checkpoints), checkpoint_every=1, keep_checkpoints=0, success_threshold=0.99)
    ag.Trainer(GRPO(config, local_engine=own_engine), n_runners=2, runner_concurrency=4,
               store=SqliteStore(tmp_path / "run.db")).fit(close_enough, train)
    shutil.rmtree(checkpoints / "step-3")  # the process died after step 3's rollouts ran, before its checkpoint
    saved = json.loads((checkpoints / "step-2" / "agentgrad.json").read_text())
    assert list(saved["queued"]) == ["3"]  # step 3's groups were queued (and ran) while step 2 trained

    store = SqliteStore(tmp_path / "run.db")
    before = {r.rollout_id: r for r in asyncio.run(store.query_rollouts(mode="train"))}
    oldest = {}  # step 3's groups: the oldest version among their calls, recorded before the crash
    for rollout in before.values():
        if rollout.metadata["step"] == 3:
            versions = [sc.weights_version(s) for s in asyncio.run(store.query_spans(rollout.rollout_id))
                        if sc.is_llm_call(s)]
            group = rollout.metadata["group"]
            oldest[group] = min(oldest.get(group, versions[0]), *versions)
    restarted = Engine(sampling_dtype="float32", device="cpu")  # a new process: its engine counts from 0
    result = ag.Trainer(GRPO(config, local_engine=restarted), n_runners=2, runner_concurrency=4,
                        store=store).fit(close_enough, train)
    assert [h["step"] for h in result.history] == [1, 2, 3]  # steps 1-2 from the checkpoint, step 3 once more
    after = {r.rollout_id for r in asyncio.run(store.query_rollouts(mode="train"))}
    assert after == set(before) and set(saved["queued"]["3"]["ids"]) <= after  # none sampled again
    step_3 = result.history[-1]
    assert step_3["train/failed_rollouts"] == 0 and step_3["async/dropped_groups"] == 0  # none lost
    lags = [saved["engine_version"] - v for v in oldest.values()]  # the restored weights keep their version
    assert step_3["async/staleness_mean"] == sum(lags) / len(lags) and max(lags) <= 1
    assert json.loads((checkpoints / "step-3" / "agentgrad.json").read_text())["queued"] == {}
