"""FSDP2 over real processes (gloo on CPU): N ranks compute exactly the update of one process."""

from __future__ import annotations

import asyncio
import copy
import threading
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentgrad.adapters import Trajectory
from agentgrad.algorithms.grpo import GRPOConfig
from agentgrad.algorithms.grpo_update import grpo_update, sharded_grpo_step
from agentgrad.algorithms.sft import Kept, SFTConfig, fine_tune, sharded_fine_tune
from agentgrad.algorithms.updates import ShardedUpdate, Update, open_update
from agentgrad.distributed.fsdp import split_by_tokens
from agentgrad.distributed.group import SpawnedGroup
from agentgrad.engine import Engine
from agentgrad.policy.local import LocalPolicy
from agentgrad.store import MemoryStore
from tests.helpers import wait_until
from tests.test_async_training import chat

pytestmark = pytest.mark.distributed  # a process group of its own: `make test-fast` leaves it out

CONFIG = LlamaConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=True,
)
GRPO_CFG = GRPOConfig(micro_batch_size=2, learning_rate=1e-3, max_grad_norm=0.05, updates_per_step=2)
OPTIONS = {"learning_rate": GRPO_CFG.learning_rate, "weight_decay": 0.01}


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(copy.deepcopy(CONFIG))


def trajectory(prompt: list[int], response: list[int], seed: int) -> Trajectory:
    generator = torch.Generator().manual_seed(seed)
    old = (-2.0 - torch.rand(len(response), generator=generator)).tolist()  # off-policy: some ratios clip
    return Trajectory(
        token_ids=prompt + response,
        loss_mask=[0] * len(prompt) + [1] * len(response),
        logprobs=[0.0] * len(prompt) + old,
        prompt_length=len(prompt),
    )


def step_batch(lengths: list[int]) -> list[tuple[Trajectory, float]]:
    prompt = list(range(1, 13))
    return [
        (trajectory(prompt, [(7 * i + j) % 60 + 2 for j in range(n)], i), (-1.0) ** i * (0.5 + 0.1 * i))
        for i, n in enumerate(lengths)
    ]


def assert_same_weights(
    sharded: dict[str, torch.Tensor], local: torch.nn.Module, start: dict[str, torch.Tensor]
) -> None:
    moved = 0.0
    for name, value in local.state_dict().items():
        if name not in sharded:
            assert name == "lm_head.weight"  # tied to the embeddings
            continue
        assert torch.linalg.norm(sharded[name] - value) <= 1e-5 * torch.linalg.norm(value), name
        # elementwise: Adam divides by sqrt(v), so a weight whose gradient is ~0 may move by float noise
        assert float((sharded[name] - value).abs().max()) < 1e-2 * OPTIONS["learning_rate"], name  # 1% of a step
        moved = max(moved, float((value - start[name]).abs().max()))
    assert moved > 1e-4  # the update did change the weights, well past the tolerance


def grpo_update_of(policy: LocalPolicy, cfg: GRPOConfig) -> Update:
    """GRPO's update of `policy` where `cfg` says it runs (`train_processes=2`: two spawned ranks)."""
    return open_update(policy, cfg, None, partial(grpo_update, cfg=cfg), partial(sharded_grpo_step, cfg=cfg))


def test_split_by_tokens_balances_tokens_not_counts_and_keeps_each_share_in_order() -> None:
    assert split_by_tokens([100, 10, 10, 10, 10, 10], 2) == [[0], [1, 2, 3, 4, 5]]
    assert split_by_tokens([5, 5, 5, 5], 2) == [[0, 2], [1, 3]]
    assert split_by_tokens([3], 2) == [[0], []]


def test_two_training_processes_and_one_end_with_the_parameters_of_a_plain_update() -> None:
    batch = step_batch([6, 9, 4, 7, 5, 8, 3, 6])
    cfg = replace(GRPO_CFG, kl_coef=0.05)  # the frozen reference is sharded too
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIONS["learning_rate"], weight_decay=OPTIONS["weight_decay"])
    stats = [grpo_update(model, optimizer, batch, cfg, 0, tiny_model().requires_grad_(False))]
    start = tiny_model().state_dict()
    for world_size in (2, 1):
        group = SpawnedGroup(world_size, CONFIG, start, kl_reference=True, **OPTIONS)
        try:
            sharded_stats = group.call("run", sharded_grpo_step, batch, 0, cfg)
            weights = group.call("full_state_dict")
        finally:
            group.close()
        assert_same_weights(weights, model, start)
        assert sharded_stats["loss"] == pytest.approx(stats[0]["loss"], rel=1e-5)
        assert sharded_stats["grad_norm"] == pytest.approx(stats[0]["grad_norm"], rel=1e-5)
        assert sharded_stats["clip_fraction"] == pytest.approx(stats[0]["clip_fraction"], rel=1e-6)
        assert sharded_stats["kl"] == pytest.approx(stats[0]["kl"], rel=1e-5)


def test_a_sharded_sft_step_ends_with_the_parameters_of_a_plain_one() -> None:
    # SFT's update on the same loop: every batch split by tokens over the ranks, the NLL over its global count;
    # five sequences in batches of 2 leave one rank idle in the last batch
    kept = Kept([t for t, _ in step_batch([6, 9, 4, 7, 5])], shuffle_seed="0/1")
    cfg = SFTConfig(epochs=2, batch_size=2, learning_rate=OPTIONS["learning_rate"], weight_decay=OPTIONS["weight_decay"])
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    plain = fine_tune(model, optimizer, kept, pad_token_id=0, reference=None, cfg=cfg)
    start = tiny_model().state_dict()
    group = SpawnedGroup(2, CONFIG, start, **OPTIONS)
    try:
        sharded = group.call("run", sharded_fine_tune, kept, 0, cfg)
        weights = group.call("full_state_dict")
    finally:
        group.close()
    assert_same_weights(weights, model, start)
    assert sharded["loss"] == pytest.approx(plain["loss"], rel=1e-5)


def test_an_uneven_split_with_an_idle_rank_still_gives_the_single_process_update() -> None:
    # rank 0 takes the one long sequence; rank 1 three short ones in two micro-batches, so rank 0
    # runs an idle pass; then a step of one trajectory leaves rank 1 nothing at all
    uneven, single = step_batch([40, 5, 4, 6]), step_batch([9])
    assert split_by_tokens([len(t.token_ids) for t, _ in uneven], 2) == [[0], [1, 2, 3]]
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIONS["learning_rate"], weight_decay=OPTIONS["weight_decay"])
    grpo_update(model, optimizer, uneven, GRPO_CFG)
    grpo_update(model, optimizer, single, GRPO_CFG)
    start = tiny_model().state_dict()
    group = SpawnedGroup(2, CONFIG, start, **OPTIONS)
    try:
        group.call("run", sharded_grpo_step, uneven, 0, GRPO_CFG)
        group.call("run", sharded_grpo_step, single, 0, GRPO_CFG)
        weights = group.call("full_state_dict")
    finally:
        group.close()
    assert_same_weights(weights, model, start)


def test_a_checkpoint_saved_by_two_ranks_loads_into_one_and_the_next_update_matches(tmp_path: Path) -> None:
    first, second = step_batch([6, 9, 4, 7]), step_batch([5, 8, 3, 6, 10])
    start = tiny_model().state_dict()
    two = SpawnedGroup(2, CONFIG, start, **OPTIONS)
    try:
        two.call("run", sharded_grpo_step, first, 0, GRPO_CFG)
        two.call("save", tmp_path / "step-1")
        two.call("run", sharded_grpo_step, second, 0, GRPO_CFG)
        continued = two.call("full_state_dict")
    finally:
        two.close()
    assert (tmp_path / "step-1" / "model.safetensors").exists()  # the Hugging Face export
    assert LlamaForCausalLM.from_pretrained(tmp_path / "step-1").config.hidden_size == CONFIG.hidden_size
    one = SpawnedGroup(1, CONFIG, tiny_model().state_dict(), **OPTIONS)
    try:
        one.call("load", tmp_path / "step-1")
        one.call("run", sharded_grpo_step, second, 0, GRPO_CFG)
        resumed = one.call("full_state_dict")
    finally:
        one.close()
    model = LlamaForCausalLM(copy.deepcopy(CONFIG))
    model.load_state_dict(continued, strict=False)
    model.tie_weights()
    assert_same_weights(resumed, model, start)


def test_a_sharded_update_resumed_from_a_checkpoint_serves_its_weights_under_the_version_they_were_saved_with(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # the spans of rollouts sampled before a restart name the saved version: a resumed run's staleness needs it back
    cfg = replace(GRPO_CFG, train_processes=2)
    batch = step_batch([6, 9, 4, 7])
    first = LocalPolicy(MemoryStore(), Engine(tiny_model_dir, sampling_dtype="float32"))
    update = grpo_update_of(first, cfg)
    try:
        assert isinstance(update, ShardedUpdate)
        update.step(batch)
        update.step(batch)
        saved_version = first.engine.version
        update.save(tmp_path / "step-2", {"step": 2})
    finally:
        update.close()
    assert saved_version >= 2
    restarted = LocalPolicy(MemoryStore(), Engine(tiny_model_dir, sampling_dtype="float32"))  # a new process's
    assert restarted.engine.version < saved_version
    resumed = grpo_update_of(restarted, cfg)
    try:
        assert resumed.load(tmp_path / "step-2")["step"] == 2
        assert restarted.engine.version == saved_version
        for name, value in first.engine.model.state_dict().items():
            assert torch.equal(restarted.engine.model.state_dict()[name], value), name  # and its weights
        resumed.step(batch)
        assert restarted.engine.version == saved_version + 1  # and counts on from it
    finally:
        resumed.close()


def test_an_asynchronous_sharded_update_publishes_between_attempts_and_never_changes_the_served_weights_before(
    tiny_model_dir: Path,
) -> None:
    store = MemoryStore()
    with LocalPolicy(store, Engine(tiny_model_dir, sampling_dtype="float32")) as policy:  # fp32: serves its model
        update = grpo_update_of(policy, replace(GRPO_CFG, train_processes=2, max_staleness=1))
        try:
            assert isinstance(update, ShardedUpdate) and policy.calls is not None
            version, served = policy.engine.version, copy.deepcopy(policy.engine.model.state_dict())
            attempt = asyncio.run(store.start_rollout({"q": 1}, mode="train"))
            chat(policy, attempt.rollout_id, attempt.attempt.attempt_id)  # an attempt under way, between its calls
            stepping = threading.Thread(target=update.step, args=(step_batch([6, 9, 4, 7]),))
            stepping.start()
            wait_until(lambda: policy.calls._attempts_held, "the publish waiting for the attempt", timeout=120)  # type: ignore[union-attr]
            assert policy.engine.version == version  # the attempt's next call still gets the weights it began with
            assert all(torch.equal(v, served[k]) for k, v in policy.engine.model.state_dict().items())
            asyncio.run(
                store.update_attempt(attempt.rollout_id, attempt.attempt.attempt_id, status="succeeded", reward=1.0)
            )
            stepping.join(120)
            assert policy.engine.version == version + 1 and policy.straddling == []
            assert not all(torch.equal(v, served[k]) for k, v in policy.engine.model.state_dict().items())
        finally:
            update.close()
