"""Decoding over the static KV cache (`agentgrad.engine.slots`, what CUDA graphs replay on a GPU) generates what the
dynamic cache does: the same tokens, logprobs within 1e-3 in fp32 (the two caches sum attention in different orders:
1-2e-5 of the tiny model's ~0.2-nat logits on an AVX-512 CPU, 4e-4 once they are scaled to ~5), with rows joining and
leaving mid-decode, under grammars, and with the prefix cache; run here on the CPU, eagerly, on a tiny Qwen2 model
with the real tokenizer. And the decoder's LoRA product is peft's."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.constraints import json_schema_grammar
from agentgrad.engine.decode import LeanDecoder
from agentgrad.engine.detokenize import full_text
from agentgrad.engine.graphs import column_bucket, row_bucket
from agentgrad.engine.kv_cache import new_cache
from agentgrad.engine.rows import Completion
from tests.engine.test_decode import _tiny

LOGIT_SCALE = 30.0
"""How much the tiny model's output layer is scaled: next-token logits spread over ~5 nats instead of ~0.2."""

QUESTIONS = ["Hi", "What is 2+3? Think.", "Name a colour please.", "x", "Count to ten, slowly, in words.", "Why?"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer

    from agentgrad.engine.model import resolve_model

    path = tmp_path_factory.mktemp("tiny-qwen2")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model())
    model = _tiny("qwen2", vocab_size=len(tokenizer), max_position_embeddings=512).float()
    with torch.no_grad():  # a random network's next token is a near-tie among 49k (logprobs ~-10.8), which rounding
        model.lm_head.weight.mul_(LOGIT_SCALE)  # 1e-5 apart flips; scaled, its top tokens stand apart as trained ones do
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def engines(folder: Path) -> Iterator[dict[str, Engine]]:
    made = {mode: Engine(folder, sampling_dtype="float32", device="cpu", decode=mode) for mode in ("static", "dynamic")}
    yield made
    for engine in made.values():
        engine.close()


SYSTEM = "You are a careful assistant. Answer in one short sentence, and check your arithmetic twice. " * 5
"""Long enough that a next turn's hit in the prefix cache is taken (`prefill.PREFIX_HIT_ALONE_TOKENS`)."""


def _prompts(engine: Engine, system: bool = False) -> list[list[int]]:
    turn = [{"role": "system", "content": SYSTEM}] if system else []
    return [engine.chat_prompt_ids([*turn, {"role": "user", "content": q}]) for q in QUESTIONS]


def _same(static: list[Completion], dynamic: list[Completion], tolerance: float = 1e-3) -> None:
    assert [c.token_ids for c in static] == [c.token_ids for c in dynamic]
    for a, b in zip(static, dynamic):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < tolerance
        assert a.text == b.text and a.finish_reason == b.finish_reason
        assert [[t for t, _ in top] for top in a.top_logprobs] == [[t for t, _ in top] for top in b.top_logprobs]


def _completions(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
    return [c for g in engine.generate(prompts, params) for c in g.completions]


def test_static_decoding_gives_the_dynamic_caches_tokens_and_logprobs(engines: dict[str, Engine]) -> None:
    for engine in engines.values():
        engine.prefix_cache.max_bytes = 0  # each run prefills alike
    prompts = _prompts(engines["static"])
    for params in (
        SamplingParams(max_tokens=24, temperature=0),
        SamplingParams(max_tokens=24, temperature=0.8, seed=5, n=2, top_logprobs=3),
    ):
        static = _completions(engines["static"], prompts, params)
        assert engines["static"].stats["decode"] == "static slots"
        dynamic = _completions(engines["dynamic"], prompts, params)
        assert engines["dynamic"].stats["decode"] == "written-out step"
        _same(static, dynamic)
        tokenizer = engines["static"].tokenizer
        for c in static:  # the text is decoded once, at the end: the whole decode's, the end of turn left out
            assert c.text == full_text(tokenizer, c.token_ids[:-1] if c.finish_reason == "stop" else c.token_ids)


def test_rows_join_and_leave_the_static_batch_mid_decode(engines: dict[str, Engine]) -> None:
    """A long request decodes; the others join its batch at different steps, finish at different steps (their own
    max_tokens) and leave, and the next turns start from the finished ones (prefix cache hits): every token is what
    the dynamic cache gives each request alone."""
    results: dict[str, list[list[Completion]]] = {}
    for mode, engine in engines.items():
        engine.prefix_cache.max_bytes = 2**26
        prompts = _prompts(engine, system=True)
        started = threading.Event()
        first = engine.submit(
            prompts[4], SamplingParams(max_tokens=60, temperature=0, ignore_eos=True), on_token=lambda *_: started.set()
        )
        assert started.wait(120)
        late = [engine.submit(p, SamplingParams(max_tokens=6 + 5 * i, temperature=0)) for i, p in enumerate(prompts)]
        turns = [[first.result(120).completions[0], *[f.result(120).completions[0] for f in late]]]
        follow_ups = [p + c.token_ids + engine.tokenizer.encode(" And then?") for p, c in zip(prompts, turns[0][1:])]
        cached = engine.stats["prefix_cache_tokens"]
        turns.append(_completions(engine, follow_ups, SamplingParams(max_tokens=10, temperature=0)))
        assert engine.stats["prefix_cache_tokens"] > cached  # the next turns started from the finished rows
        results[mode] = turns
    assert engines["static"].stats["decode"] == "static slots"
    for static, dynamic in zip(results["static"], results["dynamic"]):
        _same(static, dynamic)
    alone = engines["dynamic"]
    alone.prefix_cache.max_bytes = 0
    solo = [
        _completions(alone, [p], SamplingParams(max_tokens=6 + 5 * i, temperature=0))[0]
        for i, p in enumerate(_prompts(alone, system=True))
    ]
    _same(results["static"][0][1:], solo)


@pytest.mark.slow
def test_constrained_rows_decode_under_the_static_cache_beside_free_ones(engines: dict[str, Engine]) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    grammar = json_schema_grammar(schema)
    outputs = {}
    for mode, engine in engines.items():
        engine.prefix_cache.max_bytes = 0
        prompts = _prompts(engine)
        futures = [
            engine.submit(p, SamplingParams(max_tokens=40, temperature=1.0, seed=i, grammar=grammar if i % 2 else None))
            for i, p in enumerate(prompts)
        ]
        outputs[mode] = [f.result(120).completions[0] for f in futures]
    _same(outputs["static"], outputs["dynamic"])
    for i, completion in enumerate(outputs["static"]):
        if i % 2:
            assert completion.allowed_tokens and 1 in completion.allowed_tokens
            if completion.finish_reason == "stop":
                assert set(json.loads(completion.text)) == {"name", "age"}


def test_graph_buckets_pad_rows_and_columns_without_changing_a_token(engines: dict[str, Engine]) -> None:
    """What a CUDA graph replays, stood in for on the CPU (`graphs.StepGraphs`): the batch padded to a bucket of rows
    (padding rows in unused slots) and of columns (masked): the same tokens and logprobs as the step run as is."""
    from agentgrad.engine.graphs import StepGraphs

    engine = engines["static"]
    engine.prefix_cache.max_bytes = 0
    prompts = _prompts(engine)[:5]  # 5 rows: a bucket of 8
    params = SamplingParams(max_tokens=20, temperature=0)
    direct = _completions(engine, prompts, params)
    static = engine._static_decoding()
    assert static is not None and static.graphs is None  # a CPU runs the step directly
    static.graphs = StepGraphs(engine.max_batch_size, torch.device("cpu"))
    try:
        replayed = _completions(engine, prompts, params)
        assert static.graphs._graphs and all(rows == 8 for rows, _ in static.graphs._graphs)
    finally:
        static.graphs = None
    _same(replayed, direct)


def test_buckets_hold_the_batch_and_never_exceed_the_cache() -> None:
    assert [row_bucket(rows, 64) for rows in (1, 3, 8, 9, 33, 64)] == [1, 4, 8, 16, 48, 64]
    assert row_bucket(200, 192) == 192 and row_bucket(300, 512) == 320
    assert [column_bucket(columns, 1024) for columns in (1, 128, 129, 700)] == [128, 128, 256, 1024]
    assert column_bucket(700, 600) == 600


def test_the_decoders_lora_product_is_pefts() -> None:
    """On a GPU the written-out step serves one LoRA adapter over the base (a CPU samples LoRA through transformers'
    forward): its logits are peft's, here on fp32 plain layers."""
    from peft import LoraConfig, get_peft_model

    model = _tiny("llama", torch.float32, pack=False)
    adapted = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    adapted.eval()
    decoder = LeanDecoder(adapted)
    assert decoder.layers[0].qkv[0].lora is not None
    ids = torch.randint(0, 300, (3, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        theirs = new_cache()
        adapted(input_ids=ids, attention_mask=mask, position_ids=positions, cache=theirs, use_cache=True)
        mine = new_cache()
        adapted(input_ids=ids, attention_mask=mask, position_ids=positions, cache=mine, use_cache=True)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        tokens, positions = ids[:, -1], positions[:, -1] + 1
        expected = adapted(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=positions[:, None],
            cache=theirs,
            use_cache=True,
        ).logits[:, -1]
        found = decoder(tokens, positions, mask, mine)
        with adapted.disable_adapter():  # the same step without the adapter
            base = adapted(input_ids=torch.cat([ids, tokens[:, None]], 1)).logits[:, -1]
    assert torch.allclose(found, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(found, base, atol=1e-2)  # the adapter moves the logits: it was applied
