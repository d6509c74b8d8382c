"""The engine's written-out decode step (`agentgrad.engine.decode`): bit-identical logits to transformers' forward
as the engine runs it (its attention, its packed layers) on the same cache, bf16 and fp32, for Llama and Qwen2
(biased projections), padded or not; the same generations through the engine with it and without it, also after
`publish` brings new weights (fp32: never stale packed weights while training changes them in place); and no
decoder where it would not be exact."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import pytest
import torch

from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.attention import use_engine_attention
from agentgrad.engine.decode import LeanDecoder
from agentgrad.engine.kv_cache import new_cache
from agentgrad.engine.prefix_cache import PrefixCache
from agentgrad.engine.prepack import pack_linears, packing_available
from agentgrad.engine.rows import Completion
from tests.tiny_models import tiny_engine_of, tiny_network


def _tiny(
    architecture: str, dtype: torch.dtype = torch.bfloat16, pack: bool = True, **overrides: object
) -> torch.nn.Module:
    model = tiny_network(architecture, num_hidden_layers=3, **overrides).to(dtype).eval()  # qwen2: biased q, k, v
    if pack:
        pack_linears(model)  # as the engine packs its sampling model
    use_engine_attention(model)  # and attends with it (fp32 padded rows: transformers' own SDPA rounds apart)
    return model


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_logits_are_bit_identical_to_transformers_forward(architecture: str, padded: bool, dtype: torch.dtype) -> None:
    model = _tiny(architecture, dtype)
    decoder = LeanDecoder.build(model)
    assert decoder is not None
    ids = torch.randint(0, 300, (5, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :4] = mask[3, :7] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        theirs = new_cache()
        model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=theirs, use_cache=True)
        mine = copy.deepcopy(theirs)
        tokens, positions = ids[:, -1], positions[:, -1] + 1
        for step in range(6):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            expected = model(
                input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None], cache=theirs,
                use_cache=True,
            ).logits[:, -1]
            found = decoder(tokens, positions, mask, mine)
            assert torch.equal(found, expected), f"step {step}: {(found - expected).abs().max()}"
            for layer_theirs, layer_mine in zip(theirs.layers, mine.layers):
                assert torch.equal(layer_theirs.keys, layer_mine.keys)
                assert torch.equal(layer_theirs.values, layer_mine.values)
            tokens, positions = expected.argmax(-1), positions + 1


def test_no_decoder_where_it_would_not_be_exact() -> None:
    assert LeanDecoder.build(_tiny("llama", torch.float16)) is None
    for dtype in (torch.bfloat16, torch.float32):
        unpacked = _tiny("llama", dtype, pack=False)
        # plain layers where this machine packs them: not what the engine serves (bf16 on AVX2 alone: it is)
        assert (LeanDecoder.build(unpacked) is None) == packing_available(dtype)
    assert LeanDecoder.build(_tiny("llama", hidden_act="gelu")) is None
    from peft import LoraConfig, get_peft_model

    assert LeanDecoder.build(get_peft_model(_tiny("llama"), LoraConfig(r=2, target_modules=["q_proj"]))) is None


def _generations(engine: Engine, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    params = [SamplingParams(max_tokens=24, temperature=0), SamplingParams(max_tokens=24, temperature=1.0, seed=3, n=2)]
    return [
        (completion.token_ids, completion.logprobs)
        for p in params
        for generation in engine.generate(prompts, p)
        for completion in generation.completions
    ]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_engine_generates_the_same_with_and_without_it_also_after_publish(tiny_qwen_dir: Path, dtype: str) -> None:
    engine = tiny_engine_of(tiny_qwen_dir, sampling_dtype=dtype, prefix_cache_bytes=0)  # each run prefills alike
    try:
        assert engine._weights.decoder is not None
        prompts = [engine.chat_prompt_ids([{"role": "user", "content": q}]) for q in ("Hi", "What is 2+3? Think.")]
        before: list[tuple[list[int], list[float]]] = []
        for publish in (False, True):
            if publish:
                with engine.training() as trained, torch.no_grad():
                    # fp32 sampling trains the served weights in place: its packed twin is set aside meanwhile
                    assert (engine._weights.decoder is None) == (dtype == "float32")
                    for layer in trained.model.layers:
                        layer.mlp.up_proj.weight.mul_(-2.0)
                        layer.self_attn.k_proj.bias.add_(1.0)
                if dtype == "float32":  # before the publish: the new weights, plain
                    assert engine._weights.sampler is engine.model and _generations(engine, prompts) != before
                engine.publish()
                assert engine._weights.decoder is not None
            decoder = engine._weights.decoder
            lean = _generations(engine, prompts)
            engine._weights.decoder = None
            try:
                plain = _generations(engine, prompts)
            finally:
                engine._weights.decoder = decoder
            assert lean == plain
            if publish:
                assert lean != before
            before = lean
    finally:
        engine.close()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_rows_sharing_a_long_system_prompt_read_it_once_and_generate_what_whole_rows_do(
    tiny_smollm2_dir: Path, tmp_path: Path, dtype: str
) -> None:
    """A GRPO step's rows share a system prompt: held once (`kv_cache.SharedPrefix`), it is read once a step for
    all rows. Rows join the running batch mid-way (another task's prompt) and the next turns reuse the finished
    turns (the prefix cache keeps the held prefix with each row's own columns): the tokens are those of whole
    rows through transformers' forward, the logprobs to rounding (a tiny Qwen2 model with SmolLM2's tokenizer, its
    weights drawn as transformers draws them: bf16 rounds logits apart in proportion to their size)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_smollm2_dir)
    _tiny("qwen2", vocab_size=len(tokenizer), max_position_embeddings=512, initializer_range=0.02).float().save_pretrained(
        tmp_path
    )
    tokenizer.save_pretrained(tmp_path)
    engine = tiny_engine_of(tmp_path, sampling_dtype=dtype)
    system = "You are a careful assistant. Answer in one short sentence, and check your arithmetic twice. " * 5
    questions = ["What is 2+3?", "Name a colour.", "Say hi.", "Count to three.", "Spell cat.", "What is 7*6?"]
    prompts = [
        engine.chat_prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": q}])
        for q in questions
    ]
    params = SamplingParams(max_tokens=12, temperature=0)

    def run(with_cache: bool) -> list[list[Completion]]:
        engine.prefix_cache = PrefixCache() if with_cache else PrefixCache(0)
        started = threading.Event()
        first = [engine.submit(p, params, on_token=lambda *_: started.set()) for p in prompts[:3]]
        assert started.wait(120)  # the first rows are generating: the others join their batch
        turns = [[f.result().completions[0] for f in first + [engine.submit(p, params) for p in prompts[3:]]]]
        follow_ups = [p + c.token_ids + engine.tokenizer.encode("\nAnd why?") for p, c in zip(prompts, turns[0])]
        turns.append([g.completions[0] for g in engine.generate(follow_ups, params)])
        return turns

    try:
        decoder = engine._weights.decoder
        assert decoder is not None
        lean = run(with_cache=True)
        assert engine.stats["held_once_steps"] > 0
        assert engine.stats["prefix_cache_tokens"] > 0  # the next turns reused the first
        engine._weights.decoder = None  # transformers' forward over whole rows: nothing held once
        held = engine.stats["held_once_steps"]
        whole = run(with_cache=False)
        assert engine.stats["held_once_steps"] == held
    finally:
        engine.close()
    tolerance = 1e-4 if dtype == "float32" else 2e-2  # a few bf16 roundings of the logits apart
    for lean_turn, whole_turn in zip(lean, whole):
        for a, b in zip(lean_turn, whole_turn):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < tolerance
