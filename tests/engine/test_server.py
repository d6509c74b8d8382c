"""The engine behind its OpenAI-compatible HTTP API, called with the real openai client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from agentgrad.engine import Engine
from agentgrad.engine.server import create_engine_app
from agentgrad.serving import ServerThread


@pytest.fixture(scope="module")
def engine(tiny_engine: Engine) -> Engine:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[openai.OpenAI]:
    with ServerThread(create_engine_app(engine)) as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


MESSAGES = [{"role": "user", "content": "What is 17 + 25?"}]


def test_chat_returns_token_ids_and_logprobs_that_decode_to_the_reply(engine: Engine, client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=engine.name, messages=MESSAGES, max_tokens=16, temperature=0, logprobs=True,
        extra_body={"return_token_ids": True},
    )
    extra: dict[str, Any] = reply.model_extra or {}
    choice = reply.choices[0]
    choice_extra: dict[str, Any] = choice.model_extra or {}
    assert extra["prompt_token_ids"] == engine.chat_prompt_ids(MESSAGES)
    token_ids = choice_extra["token_ids"]
    assert engine.tokenizer.decode(token_ids, skip_special_tokens=True) == choice.message.content
    assert choice.logprobs is not None and len(choice.logprobs.content or []) == len(token_ids)
    assert reply.system_fingerprint == f"agentgrad-weights-v{engine.version}"
    assert reply.usage is not None and reply.usage.completion_tokens == len(token_ids)


def test_streaming_delivers_the_same_text_chunk_by_chunk(engine: Engine, client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model=engine.name, messages=MESSAGES, max_tokens=20, temperature=0)
    stream = client.chat.completions.create(
        model=engine.name, messages=MESSAGES, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"return_token_ids": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    token_ids = [t for c in chunks if c.choices for t in (c.choices[0].model_extra or {}).get("token_ids", [])]
    assert text == plain.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # really streamed
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(token_ids)


def test_completions_endpoint_and_models(engine: Engine, client: openai.OpenAI) -> None:
    reply = client.completions.create(model=engine.name, prompt="1, 2, 3,", max_tokens=6, temperature=0, logprobs=0,
                                      extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    assert choice.logprobs is not None and len(choice.logprobs.token_logprobs or []) == len((choice.model_extra or {})["token_ids"])
    assert (choice.model_extra or {})["prompt_token_ids"] == engine.tokenizer.encode("1, 2, 3,")
    assert [m.id for m in client.models.list()] == [engine.name]


def test_bad_requests_get_openai_shaped_errors(engine: Engine, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="is not served here"):
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=engine.name, messages=MESSAGES, temperature=-0.5)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=engine.name, messages=[])
    raw = httpx.post(str(client.base_url) + "chat/completions", content=b"{not json")
    assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
