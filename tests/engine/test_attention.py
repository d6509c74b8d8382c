"""The engine's attention (`agentgrad.engine.attention`): grouped key/value heads under a padding mask without
copying them, computing what transformers' SDPA path computes, and leaving training's path as it was."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.attention import ENGINE_ATTENTION, engine_attention, register, shared_prefix_attention
from agentgrad.engine.kv_cache import new_cache
from agentgrad.engine.model import load_model
from tests.tiny_models import tiny_engine_of


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine

QUESTIONS = ["What is 2+3?", "Name three colours of the sky at dusk, please.", "Hi", "Why is 7 smaller than 12?"]
DECODE_STEPS = 12


class _Grouped(torch.nn.Module):
    num_key_value_groups = 3


def _padded(batch: int, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Random grouped query/keys/values (9 query heads, 3 key/value heads) and a left-padding mask."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(batch, 9, 1, 64, generator=generator).to(dtype)
    keys, values = (torch.randn(batch, 3, length, 64, generator=generator).to(dtype) for _ in range(2))
    starts = torch.tensor([0, 5, length - 1, 17][:batch])
    mask = (torch.arange(length)[None, :] >= starts[:, None])[:, None, None, :]
    return query, keys, values, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_heads_under_a_mask_give_bit_for_bit_what_copying_them_gives(dtype: torch.dtype) -> None:
    query, keys, values, mask = _padded(4, 40, dtype)
    copied = torch.nn.functional.scaled_dot_product_attention(
        query, keys.repeat_interleave(3, 1), values.repeat_interleave(3, 1), attn_mask=mask, scale=0.125
    ).transpose(1, 2)
    with torch.no_grad():
        output, weights = engine_attention(_Grouped(), query, keys, values, mask, scaling=0.125)
    assert weights is None
    assert output.shape == (4, 1, 9, 64)
    assert torch.equal(output, copied)


def test_autograd_takes_transformers_own_path() -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    query, keys, values, mask = _padded(4, 40, torch.float32)
    grads = []
    for attention in (engine_attention, sdpa_attention_forward):
        leaf = query.clone().requires_grad_()
        output, _ = attention(_Grouped(), leaf, keys, values, mask, scaling=0.125)
        output.square().sum().backward()
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1])


def _batch(tokenizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Chat prompts of different lengths, left-padded, with their mask."""
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in QUESTIONS
    ]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(len(i) for i in ids)
    assert min(len(i) for i in ids) < width - 8, "the prompts must differ in length for the padding to matter"
    padded = torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    return padded, mask


def _teacher_forced_logits(model: Any, ids: torch.Tensor, mask: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
    """Logits of a padded prefill's last position and of `forced`'s tokens fed one decode step at a time, as the
    engine runs them (growing cache, positions from the mask): [steps + 1, batch, vocabulary], fp32."""
    cache = new_cache()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1
        )
        logits = [out.logits[:, -1].float()]
        next_position = mask.sum(-1)
        for step in range(forced.shape[1]):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = model(
                input_ids=forced[:, step : step + 1],
                attention_mask=mask,
                position_ids=(next_position + step)[:, None],
                cache=cache,
                use_cache=True,
            )
            logits.append(out.logits[:, -1].float())
    return torch.stack(logits)


def _with_attention(model: Any, implementation: str) -> Any:
    model.set_attn_implementation(implementation)
    return model


def _compare_paths(path: str) -> dict[str, float]:
    """Largest logit difference between transformers' SDPA and the engine's attention, per dtype, on one model;
    and, in bf16, each path's distance from fp32 (the new one must be no farther than the old)."""
    model, tokenizer = load_model(path)
    model.eval()
    ids, mask = _batch(tokenizer)
    forced = torch.randint(100, 1000, (ids.shape[0], DECODE_STEPS), generator=torch.Generator().manual_seed(0))
    half = copy.deepcopy(model).to(torch.bfloat16)
    logits = {
        (dtype, name): _teacher_forced_logits(_with_attention(m, name), ids, mask, forced)
        for dtype, m in (("fp32", model), ("bf16", half))
        for name in ("sdpa", register())
    }
    reference = logits["fp32", "sdpa"]
    return {
        "fp32": float((logits["fp32", ENGINE_ATTENTION] - reference).abs().max()),
        "bf16": float((logits["bf16", ENGINE_ATTENTION] - logits["bf16", "sdpa"]).abs().max()),
        "bf16_old_to_fp32": float((logits["bf16", "sdpa"] - reference).abs().max()),
        "bf16_new_to_fp32": float((logits["bf16", ENGINE_ATTENTION] - reference).abs().max()),
    }


def test_smollm2_logits_match_transformers_sdpa_on_a_padded_batch(tiny_smollm2_dir: Path) -> None:
    found = _compare_paths(str(tiny_smollm2_dir))  # SmolLM2's family and tokenizer: Llama, tied embeddings
    assert found["fp32"] < 5e-4, found  # fp32 rounding
    assert found["bf16_new_to_fp32"] <= 1.25 * found["bf16_old_to_fp32"], found


@pytest.mark.slow
def test_qwen_logits_match_transformers_sdpa_on_a_padded_batch(tiny_qwen_dir: Path) -> None:
    found = _compare_paths(str(tiny_qwen_dir))  # Qwen2: biased query, key and value projections
    assert found["fp32"] < 5e-4, found  # fp32 rounding
    assert found["bf16_new_to_fp32"] <= 1.25 * found["bf16_old_to_fp32"], found


def test_the_engine_serves_with_its_attention_and_trains_with_sdpa(engine: Engine, tiny_smollm2_dir: Path) -> None:
    assert engine._weights.sampler.config._attn_implementation == ENGINE_ATTENTION
    bf16 = tiny_engine_of(tiny_smollm2_dir, sampling_dtype="bfloat16")
    try:
        assert bf16._weights.sampler.config._attn_implementation == ENGINE_ATTENTION
        assert bf16.model.config._attn_implementation == "sdpa"
    finally:
        bf16.close()


def test_greedy_tokens_and_logprobs_are_the_same_with_either_attention(engine: Engine) -> None:
    prompts = [engine.chat_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ours = engine.generate(prompts, params)
    engine._weights.sampler.set_attn_implementation("sdpa")
    try:
        theirs = engine.generate(prompts, params)
    finally:
        engine._weights.sampler.set_attn_implementation(register())
    for a, b in zip(ours, theirs, strict=True):
        assert a.completions[0].token_ids == b.completions[0].token_ids
        assert a.completions[0].logprobs == pytest.approx(b.completions[0].logprobs, abs=1e-4)


@pytest.mark.slow
def test_a_model_config_naming_the_engine_attention_builds_in_a_fresh_process() -> None:
    """A training rank is built from the engine model's config (`distributed.group.FromConfig`), which names
    the engine's attention when the engine samples with its training weights (fp32, LoRA)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentgrad.distributed.group import FromConfig
    from agentgrad.engine.attention import use_engine_attention

    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2
    )
    model = LlamaForCausalLM(config)
    use_engine_attention(model)
    assert model.config._attn_implementation == ENGINE_ATTENTION
    build = "import pickle, sys; model = pickle.load(sys.stdin.buffer)(); print(model.config._attn_implementation)"
    built = subprocess.run(
        [sys.executable, "-c", build], input=pickle.dumps(FromConfig(model.config)), capture_output=True, timeout=300
    )
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    assert built.stdout.decode().split() == [ENGINE_ATTENTION]


@pytest.mark.slow
def test_a_pickled_config_naming_the_engine_attention_builds_with_transformers_alone_in_a_fresh_process() -> None:
    """Unpickling the name registers the attention (`attention._RegisteringName`): a process that only calls
    transformers on the config (no agentgrad builder, no `register()` call) builds the model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentgrad.engine.attention import use_engine_attention

    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2
    )
    model = LlamaForCausalLM(config)
    use_engine_attention(model)
    build = (
        "import pickle, sys; from transformers import AutoModelForCausalLM; "
        "print(AutoModelForCausalLM.from_config(pickle.load(sys.stdin.buffer)).config._attn_implementation)"
    )
    built = subprocess.run(
        [sys.executable, "-c", build], input=pickle.dumps(model.config), capture_output=True, timeout=300
    )
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    assert built.stdout.decode().split() == [ENGINE_ATTENTION]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prefix_held_once_gives_attention_over_the_prefix_and_each_rows_own_columns(dtype: torch.dtype) -> None:
    query, keys, values, mask = _padded(4, 40, dtype)
    generator = torch.Generator().manual_seed(1)
    prefix_keys, prefix_values = (torch.randn(1, 3, 70, 64, generator=generator).to(dtype) for _ in range(2))
    whole_keys = torch.cat([prefix_keys.expand(4, -1, -1, -1), keys], 2)
    whole_values = torch.cat([prefix_values.expand(4, -1, -1, -1), values], 2)
    whole_mask = torch.cat([torch.ones(4, 1, 1, 70, dtype=torch.bool), mask], 3)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, whole_keys, whole_values, attn_mask=whole_mask, scale=0.125, enable_gqa=True
    )
    additive = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))
    output = shared_prefix_attention(query, prefix_keys, prefix_values, keys, values, additive, 0.125)
    assert output.shape == expected.shape and output.dtype == dtype and output.is_contiguous()
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    assert torch.allclose(output.float(), expected.float(), atol=tolerance)
    own_only = torch.nn.functional.scaled_dot_product_attention(
        query, keys, values, attn_mask=mask, scale=0.125, enable_gqa=True
    )
    prefix_only = torch.nn.functional.scaled_dot_product_attention(
        query, prefix_keys, prefix_values, scale=0.125, enable_gqa=True
    )
    assert not torch.allclose(output.float(), own_only.float(), atol=0.05)
    assert not torch.allclose(output.float(), prefix_only.float(), atol=0.05)
