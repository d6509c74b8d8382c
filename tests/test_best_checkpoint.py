"""The best checkpoint: a GRPO or SFT run names the checkpoint that validated best in its run record, keeps it from
`keep_checkpoints`' pruning, and a resumed run still knows it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

import agentgrad as ag
from agentgrad.algorithms.grpo import GRPO, GRPOConfig
from agentgrad.engine import Engine
from agentgrad.policy.config import PolicyConfig
from agentgrad.types import Rollout
from examples.calc_agent import build_messages, make_splits, parse_answer

pytestmark = pytest.mark.model

VAL_PASSED = {0: 1, 1: 3, 2: 2, 3: 1, 4: 0}
"""How many of the 4 validation tasks pass at each step: validation is injected, so the best (step 1, 0.75) is known."""
VAL = [{"i": i} for i in range(4)]


@ag.rollout
def scheduled(task: dict[str, Any], llm: ag.LLM, rollout: Rollout) -> float:
    """Training: the calc agent with a graded reward, through the model. Validation: the schedule above."""
    if rollout.mode == "val":
        return 1.0 if task["i"] < VAL_PASSED[rollout.metadata["step"]] else 0.0
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    reply = (
        client.chat.completions.create(
            model=llm.model, messages=build_messages(task["question"]), **llm.sampling_parameters
        )
        .choices[0]
        .message.content
        or ""
    )
    answer = parse_answer(reply)
    return 0.0 if answer is None else 1.0 / (1.0 + abs(answer - task["answer"]))


def test_a_run_records_its_best_checkpoint_keeps_it_from_pruning_and_a_resumed_run_knows_it(tmp_path: Path) -> None:
    engine = Engine(sampling_dtype="float32", device="cpu")
    train, _ = make_splits(n_train=20, n_val=2, seed=9)
    checkpoints = tmp_path / "ckpt"
    store = ag.SqliteStore(tmp_path / "store.db")
    config = GRPOConfig(
        steps=3,
        prompts_per_step=2,
        group_size=2,
        max_tokens=8,
        val_every=1,
        success_threshold=0.5,
        checkpoint_dir=str(checkpoints),
        checkpoint_every=1,
        keep_checkpoints=1,
        policy=PolicyConfig(lora_rank=4),
    )
    try:
        result = ag.Trainer(
            GRPO(config, local_engine=engine), n_runners=1, runner_concurrency=4, store=store, run_name="three"
        ).fit(scheduled, train, VAL)
        # step-2 went (keep_checkpoints=1 keeps the newest), step-1 stayed: it validated best
        assert sorted(p.name for p in checkpoints.iterdir()) == ["step-1", "step-3"]
        assert result.best_checkpoint is not None and result.best_checkpoint.path == str(checkpoints / "step-1")
        (run,) = asyncio.run(store.query_runs())
        assert run.best_checkpoint == str(checkpoints / "step-1")
        assert run.best_checkpoint_validation == {"val/accuracy": 0.75, "step": 1.0}
        assert run.checkpoints == [str(checkpoints / "step-1"), str(checkpoints / "step-3")]
        assert run.best == {"val/accuracy": 0.75, "step": 1.0}

        # resumed to step 4 (a new process: a fresh engine): the best is step-1's still (from the checkpoint's
        # state), spared again
        engine.close()
        engine = Engine(sampling_dtype="float32", device="cpu")
        resumed = GRPO(config, steps=4, local_engine=engine)
        ag.Trainer(resumed, n_runners=1, runner_concurrency=4, store=store, run_name="four").fit(scheduled, train, VAL)
        assert sorted(p.name for p in checkpoints.iterdir()) == ["step-1", "step-4"]
        four = asyncio.run(store.query_runs())[-1]
        assert four.name == "four" and four.best_checkpoint == str(checkpoints / "step-1")
        assert four.best_checkpoint_validation == {"val/accuracy": 0.75, "step": 1.0}
        assert four.best == {"val/accuracy": 0.25, "step": 3.0}  # this run's own validations: steps 3 and 4
    finally:
        engine.close()


def test_sft_checkpoints_every_round_and_keeps_the_best_validated_one_from_pruning(tmp_path: Path) -> None:
    from agentgrad.algorithms.sft import SFT, SFTConfig

    engine = Engine(sampling_dtype="float32", device="cpu")
    train, _ = make_splits(n_train=20, n_val=2, seed=9)
    checkpoints = tmp_path / "ckpt"
    store = ag.SqliteStore(tmp_path / "store.db")
    config = SFTConfig(
        steps=3,
        prompts_per_step=2,
        group_size=2,
        max_tokens=8,
        reward_threshold=0.0,
        success_threshold=0.5,
        checkpoint_dir=str(checkpoints),
        checkpoint_every=1,
        keep_checkpoints=1,
        policy=PolicyConfig(lora_rank=4),
    )
    try:
        result = ag.Trainer(
            SFT(config, local_engine=engine), n_runners=1, runner_concurrency=4, store=store, run_name="sft"
        ).fit(scheduled, train, VAL)
    finally:
        engine.close()
    # step-2 went (keep_checkpoints=1 keeps the newest), step-1 stayed: it validated best (0.75)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-1", "step-3"]
    assert result.best_checkpoint is not None and result.best_checkpoint.path == str(checkpoints / "step-1")
    assert result.checkpoint == str(checkpoints / "step-3")
    assert result.checkpoints == [str(checkpoints / "step-1"), str(checkpoints / "step-3")]
    assert (checkpoints / "step-1" / "adapter_config.json").is_file()  # a LoRA run's checkpoint is an adapter
    (run,) = asyncio.run(store.query_runs())
    assert run.best_checkpoint == str(checkpoints / "step-1")
    assert run.best_checkpoint_validation == {"val/accuracy": 0.75, "step": 1.0}
    assert run.checkpoints == [str(checkpoints / "step-1"), str(checkpoints / "step-3")]
