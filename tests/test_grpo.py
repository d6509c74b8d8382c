"""GRPO's math against values worked out by hand, and one update on a tiny model."""

from __future__ import annotations

import dataclasses
import inspect
import math
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentgrad.adapters import Trajectory
from agentgrad.algorithms.credit import group_advantages
from agentgrad.algorithms.grpo import GRPO, GRPOConfig
from agentgrad.algorithms.grpo_update import grpo_update, policy_loss
from agentgrad.algorithms.sampling import TaskSampler
from agentgrad.algorithms.sft import SFT, SFTConfig
from agentgrad.engine.training import ScoredSequence, sequence_logprobs
from agentgrad.policy.checkpoints import TRAINER_STATE, latest_checkpoint, prune_checkpoints
from agentgrad.policy.config import PolicyConfig


def test_advantages_are_normalized_within_each_group() -> None:
    advantages = group_advantages([1, 0, 1, 0, 0.5, 0.5, 1.0, 0.0], [0, 0, 0, 0, 1, 1, 2, 2])
    assert advantages[:4] == pytest.approx([1, -1, 1, -1], abs=1e-5)  # mean 0.5, std 0.5
    assert advantages[4:6] == [0.0, 0.0]  # a uniform group has nothing to say
    assert advantages[6:] == pytest.approx([1, -1], abs=1e-5)
    assert group_advantages([1, 0, 0, 0], [0] * 4, normalize_std=False) == [0.75, -0.25, -0.25, -0.25]


def test_clipped_loss_matches_the_hand_computed_values() -> None:
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, diagnostics = policy_loss(new, old, advantages, clip_eps=0.2)
    # ratio 1.5, A=+1: min(1.5, 1.2) = 1.2 (clipped) | ratio 1.5, A=-1: min(-1.5, -1.2) = -1.5
    # ratio 0.5, A=+1: min(0.5, 0.8) = 0.5           | ratio 0.5, A=-1: min(-0.5, -0.8) = -0.8 (clipped)
    assert loss.tolist() == pytest.approx([-1.2, 1.5, -0.5, 0.8])
    assert diagnostics["clipped"].tolist() == [1.0, 0.0, 0.0, 1.0]
    # k3 estimate of KL(new || old): r - 1 - log r with r = old/new
    high, low = 1 / 1.5 - 1 + math.log(1.5), 2 - 1 + math.log(0.5)
    assert diagnostics["kl"].tolist() == pytest.approx([high, high, low, low])


def test_the_kl_penalty_adds_k3_to_the_reference() -> None:
    new = torch.log(torch.tensor([1.5]))
    loss, _ = policy_loss(new, new.clone(), 0.0, 0.2, ref_logprobs=torch.zeros(1), kl_coef=0.5)
    assert loss.item() == pytest.approx(0.5 * (1 / 1.5 + math.log(1.5) - 1))


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def test_one_update_raises_the_rewarded_completions_and_lowers_the_others() -> None:
    model = tiny_model()
    prompt = list(range(1, 11))
    completions = {"good": [20, 21, 22], "bad": [30, 31, 32], "also_good": [20, 25, 26], "also_bad": [33, 34, 35]}
    rewards = {"good": 1.0, "bad": 0.0, "also_good": 1.0, "also_bad": 0.0}

    def logprobs() -> dict[str, float]:
        with torch.no_grad():
            values = sequence_logprobs(model, [ScoredSequence(prompt + c, len(prompt)) for c in completions.values()])
        return {name: float(v.sum()) for name, v in zip(completions, values)}

    before = logprobs()
    names = list(completions)
    advantages = group_advantages([rewards[n] for n in names], [0] * len(names))
    with torch.no_grad():
        old = sequence_logprobs(model, [ScoredSequence(prompt + completions[n], len(prompt)) for n in names])
    batch = [
        (Trajectory(token_ids=prompt + completions[n], loss_mask=[0] * len(prompt) + [1] * 3,
                    logprobs=[0.0] * len(prompt) + old[i].tolist(), prompt_length=len(prompt)), advantages[i])
        for i, n in enumerate(names)
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = grpo_update(model, optimizer, batch, GRPOConfig(micro_batch_size=3))
    after = logprobs()
    assert after["good"] > before["good"] and after["also_good"] > before["also_good"]
    assert after["bad"] < before["bad"] and after["also_bad"] < before["also_bad"]
    assert stats["clip_fraction"] == 0.0  # on-policy: the ratio starts at 1
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6)


def test_task_sampler_is_reproducible_and_resumes_where_it_left_off() -> None:
    first = TaskSampler(10, seed=3)
    taken = first.take(25)
    assert sorted(taken[:10]) == list(range(10)) and sorted(taken[10:20]) == list(range(10))
    resumed = TaskSampler(10, seed=3, skip=16)
    assert resumed.take(9) == taken[16:25]


def test_settings_are_checked() -> None:
    with pytest.raises(TypeError, match="no setting 'learning_rat'; the settings of GRPOConfig are: .*learning_rate"):
        GRPO(learning_rat=1e-5)
    with pytest.raises(TypeError, match="no setting 'epochs'.*lora_rank"):  # an SFT setting; the list names the policy's too
        GRPO(epochs=2)
    with pytest.raises(TypeError, match="SFT has no setting 'clip_eps'"):  # GRPO's own
        SFT(clip_eps=0.1)
    with pytest.raises(ValueError, match="group_size must be at least 2"):
        GRPO(group_size=1)
    with pytest.raises(ValueError, match="learning_rate must be > 0, got 0"):  # `agentgrad demo --learning-rate 0`
        SFT(learning_rate=0)
    with pytest.raises(ValueError, match="vllm_transport must be auto, file, lora or nccl, got 'x'"):
        GRPO(vllm_transport="x")


def test_overrides_copy_the_config_and_leave_the_given_one_unchanged() -> None:
    cfg = GRPOConfig()
    grpo = GRPO(cfg, steps=3, lora_rank=8)
    assert (grpo.config.steps, grpo.config.policy.lora_rank) == (3, 8)
    assert (cfg.steps, cfg.policy.lora_rank) == (20, 0)  # the caller's config is not theirs to change
    assert GRPO(cfg).config.steps == 20  # a later algorithm built from it shares nothing with the first
    sft_cfg = SFTConfig()
    assert SFT(sft_cfg, steps=1, lora_alpha=32).config.policy.lora_alpha == 32 and sft_cfg.steps == 3


def test_every_algorithm_is_configured_one_way_and_the_older_spellings_still_work() -> None:
    import agentgrad as ag

    for algorithm, config in ((GRPO, GRPOConfig), (SFT, SFTConfig), (ag.APO, ag.APOConfig), (ag.Baseline, ag.BaselineConfig)):
        given = config(seed=3)
        built = algorithm(given, seed=4, success_threshold=0.5)  # type: ignore[operator]
        assert (built.config.seed, built.config.success_threshold, given.seed) == (4, 0.5, 3)
        assert isinstance(built.config, ag.RunConfig) and built.config.rollout_config().max_attempts == 1
    with pytest.raises(TypeError, match="SFT takes a SFTConfig .*, got a GRPOConfig"):
        SFT(GRPOConfig())  # type: ignore[arg-type]
    assert SFT(rounds=2, tasks_per_round=5, samples_per_task=3).config.steps == 2  # SFT said "round" for a step
    assert ag.APO(rounds=4, train_batch_size=6, val_batch_size=9).config.prompts_per_step == 6
    assert GRPO(rollout_timeout=30).config.rollout_config().timeout_seconds == 30  # per attempt, everywhere
    assert ag.APO(rollout_timeout=30).config.rollout_config().timeout_seconds == 30


def test_no_setting_shares_a_name_with_a_constructor_argument() -> None:
    own = {GRPO: {"group_reward"}, SFT: set()}  # GRPO's group judge is an object, not a setting
    for algorithm, config in ((GRPO, GRPOConfig), (SFT, SFTConfig)):
        arguments = set(inspect.signature(algorithm.__init__).parameters) - {"self", "overrides"}
        settings = {f.name for f in dataclasses.fields(config)} | {f.name for f in dataclasses.fields(PolicyConfig)}
        assert arguments == {"config", "local_engine", "model", "demonstrations", *own[algorithm]}
        assert not arguments & settings


def test_the_engine_kind_is_a_setting_and_a_loaded_engine_has_its_own_argument() -> None:
    assert GRPO(engine="vllm", vllm_urls=["http://127.0.0.1:18101"]).config.policy == PolicyConfig(
        engine="vllm", vllm_urls=("http://127.0.0.1:18101",))
    assert SFT(engine="vllm").config.policy.engine == "vllm"
    assert GRPO().config.policy.engine == "local"

    class NotAnEngineKind:  # what a loaded Engine passed as engine= used to be
        pass

    with pytest.raises(TypeError, match="local_engine="):
        GRPO(engine=NotAnEngineKind())
    with pytest.raises(ValueError, match="engine must be 'local' or 'vllm', got 'sglang'"):
        GRPO(engine="sglang")


def test_pruning_keeps_the_newest_complete_checkpoints_and_the_one_being_written(tmp_path: Path) -> None:
    for step in (1, 2, 10, 3):
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / TRAINER_STATE).write_bytes(b"")
    (tmp_path / "step-11.partial").mkdir()
    deleted = prune_checkpoints(tmp_path, keep=2)
    assert [p.name for p in deleted] == ["step-1", "step-2"]  # by step number, not by name: step-10 is newest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-10", "step-11.partial", "step-3"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step-10"
    assert prune_checkpoints(tmp_path, keep=0) == []
    with pytest.raises(ValueError, match="keep_checkpoints must be >= 0"):
        GRPO(GRPOConfig(keep_checkpoints=-1))
