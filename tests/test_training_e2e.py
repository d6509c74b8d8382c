"""GRPO, SFT and a multi-turn tool agent on the real model, through runners → gateway → engine."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

import agentgrad as ag
from agentgrad import semconv
from agentgrad.adapters import llm_calls, to_trajectories
from agentgrad.algorithms.grpo import GRPO, GroupBatches, GRPOConfig
from agentgrad.algorithms.sft import SFT, SFTConfig
from agentgrad.engine import Engine
from agentgrad.rollout.instrument import instrument_openai, uninstrument_openai
from agentgrad.store import SqliteStore
from examples.calc_agent import build_messages, make_splits, parse_answer

pytestmark = pytest.mark.model


@ag.rollout
def close_enough(task: dict[str, Any], llm: ag.LLM) -> float:
    """The calc agent with a graded reward (closer answers earn more), so every group has signal."""
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    reply = client.chat.completions.create(model=llm.model, messages=build_messages(task["question"]),
                                           **llm.sampling_parameters).choices[0].message.content or ""
    answer = parse_answer(reply)
    return 0.0 if answer is None else 1.0 / (1.0 + abs(answer - task["answer"]))


@pytest.fixture(scope="module")
def own_engine() -> Engine:
    """An engine of this module's own: training changes its weights."""
    return Engine(sampling_dtype="float32", device="cpu")


def test_three_grpo_steps_write_metrics_and_a_checkpoint_and_resume_from_it(tmp_path: Path, own_engine: Engine) -> None:
    train, val = make_splits(n_train=40, n_val=6, seed=7)
    checkpoints = tmp_path / "checkpoints"
    config = dict(prompts_per_step=2, group_size=4, max_tokens=16, val_every=0, checkpoint_dir=str(checkpoints),
                  checkpoint_every=1, keep_checkpoints=1, learning_rate=1e-5, success_threshold=0.99)
    store = SqliteStore(tmp_path / "run.db")
    result = ag.Trainer(GRPO(GRPOConfig(steps=3, **config), local_engine=own_engine), n_runners=2, runner_concurrency=8,
                        store=store).fit(close_enough, train, val)
    assert [h["step"] for h in result.history] == [1, 2, 3]
    assert own_engine.version >= 1  # at least one step had signal and updated the weights
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-3"]  # each older one deleted once the next was saved
    assert result.checkpoint == str(checkpoints / "step-3")

    async def metric_steps(name: str) -> list[int]:
        return [m.step for m in await store.query_metrics(name)]

    for name in ("train/reward_mean", "train/loss", "train/kl", "train/clip_fraction", "perf/tokens_per_s", "perf/step_seconds",
                 "perf/peak_memory_gib"):
        assert asyncio.run(metric_steps(name)) == [1, 2, 3], name
    peaks = [m.value for m in asyncio.run(store.query_metrics("perf/peak_memory_gib"))]
    assert all(0.3 < peak < 64 for peak in peaks) and peaks == sorted(peaks)  # the process's peak so far, in GiB
    assert asyncio.run(metric_steps("val/accuracy")) == [0, 3]
    first_run_rollouts = len(asyncio.run(store.query_rollouts(mode="train")))
    assert first_run_rollouts == 3 * 2 * 4

    # a new run on the same checkpoint folder picks up at step 3 and only runs step 4
    resumed = ag.Trainer(GRPO(GRPOConfig(steps=4, **config), local_engine=own_engine), n_runners=2, runner_concurrency=8,
                         store=store).fit(close_enough, train, val)
    assert [h["step"] for h in resumed.history] == [1, 2, 3, 4]
    assert resumed.initial == result.initial  # the run's evaluation before step 1, not the one at the resume point
    assert len(asyncio.run(store.query_rollouts(mode="train"))) == first_run_rollouts + 2 * 4
    # step 3's validation was saved with its checkpoint: logged for the resumed run, not run again (a curve by step
    # would count its rollouts twice)
    assert asyncio.run(metric_steps("val/accuracy")) == [0, 3, 3, 4]
    assert len(asyncio.run(store.query_rollouts(mode="val"))) == 3 * len(val)
    # pruning keeps the latest and spares the best validated: step-3 (a tie stays earlier) unless step 4 beat it
    best = resumed.best_checkpoint
    assert best is not None and best.path in (str(checkpoints / "step-3"), str(checkpoints / "step-4"))
    assert sorted(p.name for p in checkpoints.iterdir()) == sorted({"step-4", Path(best.path).name})
    assert asyncio.run(metric_steps("train/loss"))[-1] == 4


@ag.rollout
def rewarded_when_the_answer_is_even(task: dict[str, Any], llm: ag.LLM) -> float:
    """Calls the model, then rewards by the task alone: which rollouts SFT keeps does not hang on sampling luck."""
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    client.chat.completions.create(model=llm.model, messages=build_messages(task["question"]), **llm.sampling_parameters)
    return 1.0 if task["answer"] % 2 == 0 else 0.0


def test_sft_keeps_rewarded_rollouts_and_fine_tunes_on_them(tmp_path: Path, own_engine: Engine) -> None:
    train, val = make_splits(n_train=20, n_val=4, seed=3)
    store = ag.MemoryStore()
    version = own_engine.version
    result = ag.Trainer(
        SFT(SFTConfig(steps=1, prompts_per_step=4, group_size=4, reward_threshold=0.3, max_tokens=16,
                      epochs=1, checkpoint_dir=str(tmp_path / "sft")), local_engine=own_engine),
        n_runners=2, runner_concurrency=8, store=store,
    ).fit(rewarded_when_the_answer_is_even, train, val)
    (round_,) = result.history
    sampled = asyncio.run(store.query_rollouts(mode="train"))
    rewarded_tasks = {r.input["question"] for r in sampled if r.input["answer"] % 2 == 0}
    assert len(sampled) == 16 and 0 < len(rewarded_tasks) < 4  # seed 3 samples both kinds: the filter is tested
    # each rewarded task's prompt differs, so at least one kept sequence per task; identical samples count once
    assert len(rewarded_tasks) <= round_["train/kept"] <= 4 * len(rewarded_tasks)
    assert round_["train/loss"] == round_["train/loss"]  # not NaN
    assert own_engine.version == version + 1
    assert result.initial is not None and result.final is not None and result.checkpoint is not None
    assert (Path(result.checkpoint) / "trainer_state.pt").exists()
    # its one checkpoint, validated after the last round, is the run's best checkpoint
    assert result.best_checkpoint is not None and result.best_checkpoint.path == result.checkpoint
    (run,) = asyncio.run(store.query_runs())
    assert run.best_checkpoint == result.checkpoint and run.best_checkpoint_validation == {
        "val/accuracy": result.final.success_rate, "step": 1.0}


@ag.rollout
def two_turn_tool_agent(task: dict[str, Any], llm: ag.LLM) -> float:
    """Asks, returns a tool result as the next user turn, asks again: a multi-turn conversation."""
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    messages = build_messages(task["question"])
    for _ in range(2):
        reply = client.chat.completions.create(model=llm.model, messages=messages, temperature=0, max_tokens=12)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        messages.append({"role": "user", "content": f"Result: {task['answer']}. Now reply with the answer."})
    ag.emit_object({"conversation": messages[:-1]})
    return 1.0


def test_a_multi_turn_tool_agent_records_token_ids_that_decode_to_the_conversation(own_engine: Engine) -> None:
    from agentgrad.policy.local import LocalPolicy

    store = ag.MemoryStore()
    with LocalPolicy(store, own_engine) as policy:
        ag.Trainer(store=store, resources={"llm": policy.llm()}).fit(two_turn_tool_agent, make_splits(4, 1)[0][:2])
    tokenizer = own_engine.tokenizer
    for rollout in asyncio.run(store.query_rollouts()):
        spans = asyncio.run(store.query_spans(rollout.rollout_id))
        calls = llm_calls(spans)
        assert len(calls) == 2
        conversation = next(s for s in spans if s.name == "agentgrad.object").attributes["agentgrad.object.json"]
        messages = __import__("json").loads(conversation)["conversation"]
        for call, turn in zip(calls, (len(messages) - 3, len(messages) - 1)):
            assert call.prompt_token_ids == own_engine.chat_prompt_ids(messages[:turn])
            reply = tokenizer.decode(call.response_token_ids, skip_special_tokens=True)
            assert reply == messages[turn]["content"]
            assert len(call.response_logprobs or []) == len(call.response_token_ids)
        # the second prompt extends the first conversation: one trajectory, tool result masked out
        trajectories = to_trajectories(spans)
        if calls[1].prompt_token_ids[: len(calls[0].prompt_token_ids) + len(calls[0].response_token_ids)] == \
                calls[0].prompt_token_ids + calls[0].response_token_ids:
            (trajectory,) = trajectories
            assert trajectory.response_length == len(calls[0].response_token_ids) + len(calls[1].response_token_ids)
            assert re.search("Result:", tokenizer.decode([t for t, m in zip(trajectory.token_ids, trajectory.loss_mask) if not m]))
        else:
            assert len(trajectories) == 2


@ag.rollout
def writer_and_critic(task: dict[str, Any], llm: ag.LLM) -> float:
    """Two agents in one rollout: the writer answers (named by `ag.agent`), the critic judges (its own route)."""
    with ag.agent("writer"):
        reply = OpenAI(base_url=llm.base_url, api_key=llm.api_key).chat.completions.create(
            model=llm.model, messages=build_messages(task["question"]), **llm.sampling_parameters
        ).choices[0].message.content or ""
    critic = llm.for_agent("critic")
    OpenAI(base_url=critic.base_url, api_key=critic.api_key).chat.completions.create(
        model=critic.model, messages=[{"role": "user", "content": f"Is this right? {reply}"}], **critic.sampling_parameters
    )
    answer = parse_answer(reply)
    return 0.0 if answer is None else 1.0 / (1.0 + abs(answer - task["answer"]))


def test_a_grpo_step_with_agent_match_trains_on_the_matched_agents_calls_alone(
    own_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ag.MemoryStore()
    grpo = GRPO(GRPOConfig(steps=1, prompts_per_step=2, group_size=2, max_tokens=8, val_every=0,
                           skip_uniform_groups=False, agent_match="^writer$"), local_engine=own_engine)
    batches: list[list[Any]] = []
    build = GroupBatches.build

    async def recorded(self: GroupBatches, step: Any, spans: Any) -> Any:  # each step's batch, as trained
        batch = await build(self, step, spans)
        batches.append(list(batch.data))
        return batch

    monkeypatch.setattr(GroupBatches, "build", recorded)
    instrument_openai()
    try:
        ag.Trainer(grpo, store=store, runner_concurrency=4).fit(writer_and_critic, make_splits(n_train=8, n_val=1)[0])
    finally:
        uninstrument_openai()
    spans = [s for r in asyncio.run(store.query_rollouts(mode="train")) for s in asyncio.run(store.query_spans(r.rollout_id))]
    names = {s.span_id: semconv.agent_name(s) for s in spans if semconv.is_llm_call(s)}
    assert sorted(names.values()) == ["critic"] * 4 + ["writer"] * 4  # 2 tasks x 2 rollouts x (writer + critic)
    (batch,) = batches
    trained = [span_id for trajectory, _ in batch for span_id in trajectory.span_ids]
    assert sorted(trained) == sorted(i for i, name in names.items() if name == "writer")
