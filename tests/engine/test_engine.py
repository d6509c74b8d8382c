"""The engine's bookkeeping: exact logprobs, batching that changes nothing, stops, versions, refusals. None of it
depends on what the model says, so it runs on the tiny SmolLM2-family model (tests/tiny_models.py)."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest
import torch

from agentgrad.engine import Engine, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    return tiny_engine

SYSTEM = [
    {"role": "system", "content": "You are a calculator. Reply with 'Answer: <number>'."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "Answer: 5"},
]


def question(engine: Engine, a: int, b: int, shared: bool = True) -> list[int]:
    messages = (SYSTEM if shared else []) + [{"role": "user", "content": f"What is {a} + {b}?"}]
    return engine.chat_prompt_ids(messages)


def forward_logprobs(engine: Engine, prompt: list[int], response: list[int], temperature: float = 1.0) -> list[float]:
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + response])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [logprobs[len(prompt) - 1 + i, token].item() for i, token in enumerate(response)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_returned_logprobs_equal_a_forward_pass_on_the_same_tokens(engine: Engine, temperature: float) -> None:
    prompts = [question(engine, 12, 35), question(engine, 7, 81, shared=False), question(engine, 40, 2)]
    generations = engine.generate(prompts, SamplingParams(max_tokens=24, temperature=temperature, seed=3, n=2))
    for prompt, generation in zip(prompts, generations):
        assert generation.prompt_token_ids == prompt
        for completion in generation.completions:
            expected = forward_logprobs(engine, prompt, completion.token_ids, temperature)
            assert max(abs(a - b) for a, b in zip(expected, completion.logprobs)) < 1e-4


def test_greedy_generation_is_the_same_batched_alone_and_joining_mid_batch(engine: Engine) -> None:
    greedy = SamplingParams(max_tokens=24, temperature=0)
    prompts = [question(engine, 1, 2), question(engine, 33, 44), question(engine, 5, 6, shared=False), question(engine, 33, 44)]
    alone = [engine.generate([p], greedy)[0].completions[0].token_ids for p in prompts]
    together = [g.completions[0].token_ids for g in engine.generate(prompts, greedy)]
    assert together == alone

    # a long request is decoding when the others arrive: they join its batch at the next step
    long_running = engine.submit(prompts[2], SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
    late = [engine.submit(p, greedy) for p in prompts]
    assert [f.result(60).completions[0].token_ids for f in late] == alone
    assert long_running.result(60).completions[0].token_ids[:24] == engine.generate([prompts[2]], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0].completions[0].token_ids


def test_rows_ending_at_different_steps_and_batches_joining_late_change_no_token(engine: Engine) -> None:
    """Finished rows ride along until enough of them are dropped at once, batches join a running one,
    and each batch's shared prefix starts from a cached one with more or fewer tokens in common:
    none of it changes a token or a logprob."""
    prompts = [question(engine, a, b) for a, b in ((12, 3), (12, 34), (1, 2), (123, 4), (7, 7), (12, 3), (1, 23))]
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in (20, 3, 4, 12, 1, 6, 9)]
    alone = [engine.generate([p], q)[0].completions[0].token_ids for p, q in zip(prompts, params)]
    started = threading.Event()
    first = [engine.submit(p, q, on_token=lambda *_: started.set()) for p, q in zip(prompts[:2], params[:2])]
    assert started.wait(60)
    later = [engine.submit(p, q) for p, q in zip(prompts[2:5], params[2:5])]
    later[0].result(60)
    last = [engine.submit(p, q) for p, q in zip(prompts[5:], params[5:])]
    completions = [f.result(60).completions[0] for f in first + later + last]
    assert [c.token_ids for c in completions] == alone
    for prompt, completion in zip(prompts, completions):
        expected = forward_logprobs(engine, prompt, completion.token_ids)
        assert max(abs(a - b) for a, b in zip(expected, completion.logprobs)) < 1e-4


def test_stop_strings_max_tokens_and_n(engine: Engine) -> None:
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Count from 1 to 10, separated by commas."}])
    free = engine.generate([prompt], SamplingParams(max_tokens=40, temperature=0))[0].completions[0]
    stop = free.text[len(free.text) // 2 :][:2]  # two characters the free answer writes halfway
    stopped = engine.generate([prompt], SamplingParams(max_tokens=40, temperature=0, stop=[stop]))[0].completions[0]
    assert stopped.finish_reason == "stop" and stopped.text == free.text[: free.text.index(stop)]
    short = engine.generate([prompt], SamplingParams(max_tokens=3, temperature=0))[0].completions[0]
    assert short.finish_reason == "length" and len(short.token_ids) == 3 and short.token_ids == free.token_ids[:3]
    many = engine.generate([prompt], SamplingParams(max_tokens=5, temperature=1.0, n=4))[0]
    assert len(many.completions) == 4


def test_a_tiny_top_p_keeps_only_the_likeliest_token(engine: Engine) -> None:
    prompt = question(engine, 3, 4)
    greedy = engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0))[0].completions[0]
    nucleus = engine.generate([prompt], SamplingParams(max_tokens=10, temperature=1.0, top_p=1e-6))[0].completions[0]
    assert nucleus.token_ids == greedy.token_ids
    assert all(lp == 0.0 for lp in nucleus.logprobs)  # renormalized over a single token


def test_after_a_weight_update_the_next_response_carries_the_new_version(engine: Engine) -> None:
    prompt = question(engine, 20, 22)
    greedy = SamplingParams(max_tokens=8, temperature=0)
    before = engine.generate([prompt], greedy)[0]
    norm = engine.model.model.norm.weight
    original = norm.detach().clone()
    try:
        with engine.training(), torch.no_grad():
            norm.mul_(-1.0)
        version = engine.publish()
        after = engine.generate([prompt], greedy)[0]
        assert after.version == version == before.version + 1
        assert after.completions[0].token_ids != before.completions[0].token_ids
    finally:
        with engine.training(), torch.no_grad():
            norm.copy_(original)
        engine.publish()
    assert engine.generate([prompt], greedy)[0].completions[0].token_ids == before.completions[0].token_ids


def test_bad_requests_are_refused_with_the_reason(engine: Engine) -> None:
    with pytest.raises(ValueError, match="temperature"):
        engine.submit([1, 2], SamplingParams(temperature=-1))
    with pytest.raises(ValueError, match="n must be between"):
        engine.submit([1, 2], SamplingParams(n=10_000))
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.submit([], SamplingParams())
    with pytest.raises(ValueError, match="at most"):
        engine.submit([1] * engine.max_model_len, SamplingParams())
    # the engine still serves afterwards
    assert engine.generate([question(engine, 1, 1)], SamplingParams(max_tokens=2))[0].completions


def test_concurrent_submissions_from_many_threads_all_complete(engine: Engine) -> None:
    prompts = [question(engine, i, i + 1) for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda p: engine.submit(p, SamplingParams(max_tokens=6)).result(60), prompts))
    assert [r.prompt_token_ids for r in results] == prompts
    assert all(1 <= len(r.completions[0].token_ids) <= 6 for r in results)


def test_a_tool_round_sampled_in_a_non_canonical_tokenization_continues_its_prompt_token_for_token(engine: Engine) -> None:
    """The next chat prompt reuses the ids the engine sampled for the earlier turn (`")]` as `"` + `)]`, say), where
    re-tokenizing the same text gives other ids; an edited history is tokenized afresh."""
    import concurrent.futures as cf

    from agentgrad.engine.rows import Request, Row
    from agentgrad.engine.tools import PYTHONIC, render_history

    calc = {"type": "function", "function": {"name": "calculate", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
    history = [{"role": "user", "content": "What is 123 + 456?"}]
    prompt = engine.chat_prompt_ids(history, [calc])
    text = '[calculate(expression="123 + 456")]'

    def tokenize(piece: str) -> list[int]:
        return list(engine.tokenizer(piece, add_special_tokens=False)["input_ids"])

    canonical = tokenize(text)
    # what a model may sample: the same text, its last token written one character at a time
    sampled = canonical[:-1] + [t for ch in engine.tokenizer.decode(canonical[-1:]) for t in tokenize(ch)]
    assert sampled != canonical and engine.tokenizer.decode(sampled) == text
    eos = engine.tokenizer.eos_token_id
    request = Request(prompt, SamplingParams(), cf.Future(), None)
    request.rows.append(Row(request, 0, None, token_ids=sampled + [eos], finish_reason="stop"))
    engine._resolve(request)

    call = {"id": "call_1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "123 + 456"}'}}
    after = history + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "579"}]
    following = engine.chat_prompt_ids(after, [calc])
    assert following[: len(prompt) + len(sampled) + 1] == prompt + sampled + [eos]
    rendered = engine.tokenizer.apply_chat_template(render_history(after, [calc], PYTHONIC), add_generation_prompt=True,
                                                    tokenize=False)
    assert engine.tokenizer.decode(following, skip_special_tokens=False) == rendered  # the same text, other ids
    edited = [dict(m) for m in after]
    edited[1]["tool_calls"] = [{**call, "function": {"name": "calculate", "arguments": '{"expression": "123+456"}'}}]
    fresh = engine.chat_prompt_ids(edited, [calc])
    assert fresh[: len(prompt)] == prompt and fresh[len(prompt) : len(prompt) + len(sampled)] != sampled


def test_memory_the_finished_requests_freed_is_given_back_every_few_requests(engine: Engine) -> None:
    """glibc keeps what decoding frees resident (issue 43: the SQL demo's validation, 6.0 -> 12.5 GB, 5.9 of it
    given back by a trim at the end): every `TRIM_EVERY_REQUESTS` finished requests the engine trims its heap."""
    from agentgrad.engine.engine import TRIM_EVERY_REQUESTS

    before = engine.stats["memory_trims"]
    engine.generate([question(engine, i, 1) for i in range(TRIM_EVERY_REQUESTS)], SamplingParams(max_tokens=2))
    assert engine.stats["memory_trims"] == before + 1
