"""The rest of the chat API, honestly: parameters honoured or refused by name; bad requests fail alone."""

from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any

import httpx
import openai
import pytest
import torch

from agentgrad.engine import Engine
from agentgrad.engine.server import create_engine_app
from agentgrad.serving import ServerThread
from agentgrad.serving.guard import Guard


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine

ASK = [{"role": "user", "content": "Name three fruits."}]


@pytest.mark.parametrize("name, value", [("reasoning_effort", "low"), ("functions", [{"name": "f"}]), ("frobnicate", 1),
                                         ("store", True), ("modalities", ["audio"])])
def test_a_parameter_the_engine_cannot_honour_gets_a_400_naming_it(engine: Engine, api: openai.OpenAI, name: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model=engine.name, messages=ASK, max_tokens=2, extra_body={name: value})
    assert name in caught.value.message and (caught.value.body or {}).get("param", "").startswith(name)  # type: ignore[union-attr]


def test_harmless_bookkeeping_parameters_are_accepted(engine: Engine, api: openai.OpenAI) -> None:
    reply = api.chat.completions.create(model=engine.name, messages=ASK, max_tokens=2, user="u1", metadata={"k": "v"}, store=False,
                                        parallel_tool_calls=True, tools=[], extra_body={"prompt_cache_key": "x"})
    assert reply.choices[0].message.content is not None


def test_top_logprobs_lists_alternatives_from_the_sampled_distribution(engine: Engine, api: openai.OpenAI) -> None:
    reply = api.chat.completions.create(model=engine.name, messages=ASK, max_tokens=6, temperature=0, logprobs=True, top_logprobs=5)
    for token in reply.choices[0].logprobs.content or []:  # type: ignore[union-attr]
        assert len(token.top_logprobs) == 5
        assert token.top_logprobs[0].token == token.token and token.top_logprobs[0].logprob == token.logprob  # greedy: the top one
        assert [t.logprob for t in token.top_logprobs] == sorted((t.logprob for t in token.top_logprobs), reverse=True)


def test_penalties_and_logit_bias_change_what_is_sampled(engine: Engine, api: openai.OpenAI) -> None:
    """Two words biased far above the rest: the greedy answer repeats them. With a frequency penalty (per earlier use)
    and a presence penalty (once used), each step takes the word whose penalized logit is higher, and reports its
    logprob under the penalized distribution (both recomputed here from the model's own logits)."""
    count = [{"role": "user", "content": "Write the word 'yes' ten times."}]
    yes, no = engine.tokenizer.encode(" yes")[0], engine.tokenizer.encode(" no")[0]
    asked: dict[str, Any] = dict(model=engine.name, messages=count, max_tokens=20, temperature=0, logprobs=True,
                                 logit_bias={str(yes): 100, str(no): 100}, extra_body={"return_token_ids": True})
    prompt = engine.chat_prompt_ids(count)
    answers: list[list[int]] = []
    for frequency, presence in ((0.0, 0.0), (2.0, 0.0), (2.0, 2.0)):
        reply = api.chat.completions.create(**asked, frequency_penalty=frequency, presence_penalty=presence)
        sampled = (reply.choices[0].model_extra or {})["token_ids"]
        reported = [t.logprob for t in reply.choices[0].logprobs.content or []]  # type: ignore[union-attr]
        assert set(sampled) <= {yes, no} and len(set(sampled)) < len(sampled)  # it repeats itself
        with torch.no_grad():
            logits = engine.model(torch.tensor([prompt + sampled])).logits[0, len(prompt) - 1 : -1]
        for step, token in enumerate(sampled):
            uses = {t: sampled[:step].count(t) for t in (yes, no)}
            score = {t: logits[step, t].item() - frequency * uses[t] - presence * (uses[t] > 0) for t in (yes, no)}
            assert token == max(score, key=score.__getitem__), (step, score)
            expected = score[token] - torch.tensor(list(score.values())).logsumexp(0).item()  # the rest: e^-100
            assert abs(reported[step] - expected) < 1e-4, (step, reported[step], expected)
        answers.append(sampled)
    assert answers[1] != answers[0]  # the frequency penalty changed the answer
    forced = engine.tokenizer.encode(" banana")[0]
    biased = api.chat.completions.create(model=engine.name, messages=ASK, max_tokens=1, temperature=0, logit_bias={str(forced): 100},
                                         extra_body={"return_token_ids": True})
    assert (biased.choices[0].model_extra or {})["token_ids"] == [forced]


def test_a_bad_request_among_8_concurrent_valid_ones_fails_alone(engine: Engine, engine_url: str) -> None:
    chat = {"model": engine.name, "max_tokens": 8, "temperature": 0}
    bad = [
        ("completions", {"model": engine.name, "prompt": [1, 2, engine.vocab_size + 5], "max_tokens": 4}),
        ("completions", {"model": engine.name, "prompt": [1, -3], "max_tokens": 4}),
        ("chat/completions", {**chat, "messages": ASK, "seed": 2**64}),
        ("chat/completions", {**chat, "messages": [{"content": "no role"}]}),
        ("chat/completions", {**chat, "messages": [{"role": "user", "content": 5}]}),
        ("chat/completions", {**chat, "messages": ASK, "metadata": "DEEP"}),  # nested 1,000 levels, below
    ]
    good = [("chat/completions", {**chat, "messages": [{"role": "user", "content": f"What is {i} + {i}?"}]}) for i in range(8)]
    with httpx.Client(base_url=engine_url + "/v1", timeout=300) as http, concurrent.futures.ThreadPoolExecutor(14) as pool:
        futures = [pool.submit(http.post, path, content=json.dumps(body).replace('"DEEP"', "[" * 1_000 + "]" * 1_000))
                   for path, body in good[:4] + bad + good[4:]]
        answers = [f.result() for f in futures]
    valid, invalid = answers[:4] + answers[-4:], answers[4:-4]
    assert [a.status_code for a in valid] == [200] * 8 and all(a.json()["choices"][0]["message"]["content"] for a in valid)
    for answer, (_, body) in zip(invalid, bad):
        assert 400 <= answer.status_code < 500, (body, answer.text[:200])
        assert answer.json()["error"]["message"]


def test_generation_stops_when_the_client_disconnects(engine: Engine, engine_url: str) -> None:
    long_string = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "minLength": 2000}}}
    body = {"model": engine.name, "messages": ASK, "max_tokens": 2000, "stream": True, "response_format": long_string}
    before_cancelled, before_tokens = engine.stats["cancelled"], engine.stats["generated_tokens"]
    with httpx.Client(timeout=60) as http, http.stream("POST", engine_url + "/v1/chat/completions", json=body) as response:
        for _, _line in zip(range(6), response.iter_lines()):  # the role chunk and the first tokens
            pass
        assert engine.stats["generated_tokens"] > before_tokens
    deadline = time.monotonic() + 30
    while engine.stats["cancelled"] == before_cancelled and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats["cancelled"] == before_cancelled + 1
    generated = engine.stats["generated_tokens"]
    reply = httpx.post(engine_url + "/v1/chat/completions", json={"model": engine.name, "messages": ASK, "max_tokens": 1}, timeout=60)
    assert reply.status_code == 200 and engine.stats["generated_tokens"] - generated < 50  # nothing else kept going


def test_health_needs_the_token_where_one_is_set_and_reports_nothing_sensitive(engine: Engine) -> None:
    with ServerThread(Guard(create_engine_app(engine), token="s3cret")) as server:
        assert httpx.get(server.url + "/health").status_code == 401
        answer = httpx.get(server.url + "/health", headers={"authorization": "Bearer s3cret"})
    assert answer.status_code == 200 and set(answer.json()) == {"status", "version"}


def test_a_request_without_max_tokens_may_generate_up_to_the_context_left(engine: Engine, api: openai.OpenAI) -> None:
    """OpenAI's convention: no default cut (it was 512 tokens); the limit is the model's context left over."""
    from agentgrad.engine.api import ChatRequest

    request = ChatRequest.model_validate({"model": engine.name, "messages": [{"role": "user", "content": "Hi"}]})
    assert request.params().max_tokens is None
    messages = [{"role": "user", "content": "Count from one to a thousand."}]
    prompt = engine.chat_prompt_ids(messages)
    context = engine.max_model_len
    engine.max_model_len = len(prompt) + 24  # a small context, so the test stays fast
    try:
        reply = api.chat.completions.create(model=engine.name, messages=messages, temperature=0,  # type: ignore[arg-type]
                                            logit_bias={str(t): -100 for t in engine.eos_token_ids})
    finally:
        engine.max_model_len = context
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.prompt_tokens + reply.usage.completion_tokens == len(prompt) + 24
