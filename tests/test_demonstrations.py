"""Demonstrations: chats in OpenAI's fine-tuning format rendered as the engine renders an agent's calls, and a run
warm-started on them (SFT before its first step) on a tiny Qwen-family model with Qwen's own tokenizer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from transformers import AutoTokenizer

import agentgrad as ag
from agentgrad.algorithms.demonstrations import DemonstrationError, to_trajectory
from agentgrad.algorithms.grpo import GRPO, GRPOConfig
from agentgrad.engine.tools import call_text, template_history
from agentgrad.engine.turns import SampledTurns
from agentgrad.policy.config import PolicyConfig
from examples.sql import db, recovery
from tests.tiny_models import tiny_engine_of


def test_only_the_weighted_assistant_turns_train_each_as_the_model_writes_it_after_the_context_the_engine_renders(
    tiny_qwen_dir: Path,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen_dir)
    task = next(q for q in db.load_questions("train") if q["kind"] == "null")
    mistake = next(sql for sql in recovery.mistakes(task["gold"]) if db.query_fails(task["db"], sql))
    shown = recovery.demonstration(task, mistake)
    trajectory = to_trajectory(shown, tokenizer)

    taught = [token for token, trained in zip(trajectory.token_ids, trajectory.loss_mask) if trained]
    fix, final = call_text("run_sql", {"query": task["gold"]}), f"```sql\n{task['gold']}\n```"
    assert tokenizer.decode(taught) == f"{fix}<|im_end|>{final}<|im_end|>"  # the mistake's call is not taught
    context = [{k: v for k, v in m.items() if k != "weight"} for m in shown["messages"][:4]]
    prompt = SampledTurns(tokenizer).prompt_ids(template_history(context), shown["tools"])
    assert trajectory.token_ids[: trajectory.prompt_length] == prompt  # what the engine renders for the fix's call
    assert mistake in tokenizer.decode(prompt) and "IS NULL" in tokenizer.decode(prompt)  # the mistake and its hint
    assert sum(trajectory.loss_mask[: trajectory.prompt_length]) == 0 and len(trajectory.token_ids) > len(prompt)


@pytest.mark.parametrize(
    ("demonstration", "message"),
    [
        ({"prompt": "hi", "completion": "hello"}, "no 'messages' list"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "o", "weight": 0}]},
         "no assistant message to train"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "message 0: a chat message has a role"),
    ],
)  # fmt: skip
def test_a_demonstration_that_cannot_be_rendered_is_refused_saying_which_and_why(
    tiny_qwen_dir: Path, demonstration: dict[str, Any], message: str
) -> None:
    with pytest.raises(DemonstrationError, match=rf"demonstration 3[:,] .*{message}"):
        to_trajectory(demonstration, AutoTokenizer.from_pretrained(tiny_qwen_dir), 3)


QUESTION = "Which word means 4?"


@ag.rollout
def says_four(task: dict[str, Any], llm: ag.LLM) -> float:
    """Asks the one question; rewarded when the reply is the demonstrated one."""
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": QUESTION}], **llm.sampling_parameters
    )
    return 1.0 if (reply.choices[0].message.content or "").strip() == "four" else 0.0


def test_a_run_warm_started_on_demonstrations_answers_as_shown_from_its_first_step_and_a_resume_does_not_repeat_it(
    tmp_path: Path, tiny_qwen_dir: Path
) -> None:
    engine = tiny_engine_of(tiny_qwen_dir, "tiny-qwen")
    shown = {"messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "four"}]}
    config = GRPOConfig(steps=1, prompts_per_step=1, group_size=2, max_tokens=4, learning_rate=1e-6, val_every=1,
                        warm_start_epochs=40, warm_start_batch_size=1, warm_start_learning_rate=3e-3,
                        checkpoint_dir=str(tmp_path / "checkpoints"))  # fmt: skip
    store = ag.MemoryStore()
    tasks = [{"id": "four"}]
    try:
        version = engine.version
        result = ag.Trainer(GRPO(config, local_engine=engine, demonstrations=[shown]), n_runners=1, store=store).fit(
            says_four, tasks, tasks
        )
        assert result.initial is not None and result.initial.success_rate == 0.0  # validated before the warm start
        assert result.final is not None and result.final.success_rate == 1.0  # greedy, it now says what it was shown
        warm = asyncio.run(store.query_metrics("warm_start/loss"))
        assert [m.step for m in warm] == [0] and warm[0].value > 0
        assert [m.value for m in asyncio.run(store.query_metrics("warm_start/demonstrations"))] == [1.0]
        assert engine.version >= version + 1  # the warm-started weights were published before step 1's rollouts
        rewards = [r.reward for r in asyncio.run(store.query_rollouts(mode="train"))]
        assert rewards and max(r or 0.0 for r in rewards) == 1.0  # step 1 sampled from the warm-started weights

        resumed = ag.Trainer(
            GRPO(config, steps=2, local_engine=engine, demonstrations=[shown]), n_runners=1, store=store
        ).fit(says_four, tasks, tasks)
        assert [h["step"] for h in resumed.history] == [1, 2]
        assert len(asyncio.run(store.query_metrics("warm_start/loss"))) == 1  # the checkpoint holds its weights
    finally:
        engine.close()


def test_demonstrations_on_an_update_sharded_or_per_role_are_refused_before_anything_runs(tiny_qwen_dir: Path) -> None:
    engine = tiny_engine_of(tiny_qwen_dir, "tiny-qwen")
    shown = {"messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "four"}]}
    store = ag.MemoryStore()
    try:
        cfg = GRPOConfig(steps=1, roles={"writer": "writer", "critic": "critic"}, default_role="writer",
                         policy=PolicyConfig(lora_rank=4))  # fmt: skip
        roles = GRPO(cfg, local_engine=engine, demonstrations=[shown])
        with pytest.raises(ValueError, match=r"demonstrations warm-start the policy in one process; .*RoleUpdate"):
            ag.Trainer(roles, n_runners=1, store=store).fit(says_four, [{"id": "four"}], [{"id": "four"}])
        assert asyncio.run(store.query_rollouts()) == []
    finally:
        engine.close()
