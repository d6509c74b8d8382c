"""The engine server's `/metrics`: requests by route, and its batch, tokens, KV cache and prefix cache moving as it
generates (a tiny Qwen2 with the real tokenizer: the model's output is not the point)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from agentgrad.engine import Engine
from agentgrad.engine.server import create_engine_app
from agentgrad.serving import ServerThread
from agentgrad.serving.guard import Guard
from tests.prometheus import scrape, value


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from agentgrad.engine.model import resolve_model

    folder: Path = tmp_path_factory.mktemp("tiny-qwen2")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model())
    torch.manual_seed(0)
    shape = dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), max_position_embeddings=512, **shape)).save_pretrained(
        folder
    )
    tokenizer.save_pretrained(folder)
    engine = Engine(folder, sampling_dtype="float32", device="cpu", name="tiny")
    yield engine
    engine.close()


def test_the_engine_exports_requests_tokens_batch_and_cache_figures_as_it_generates(tiny_engine: Engine) -> None:
    with ServerThread(create_engine_app(tiny_engine)) as server:
        before = scrape(server.url)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0)
        system = {"role": "system", "content": "You answer in one short sentence, and you check your arithmetic. " * 3}
        for question in ("What is 2+3?", "What is 4+4?"):  # the second starts with the first's system prompt
            client.chat.completions.create(
                model="tiny", messages=[system, {"role": "user", "content": question}], max_tokens=8, n=4
            )
        after = scrape(server.url)
    generated = value(after, "agentgrad_engine_generated_tokens_total") - value(
        before, "agentgrad_engine_generated_tokens_total"
    )
    assert generated == tiny_engine.stats["generated_tokens"] > 0
    assert value(after, "agentgrad_engine_requests_total") == 2
    steps, rows = (
        value(after, "agentgrad_engine_decode_steps_total"),
        value(after, "agentgrad_engine_decode_rows_total"),
    )
    assert 0 < steps < rows <= 4 * steps  # four rows per request, finishing at different steps
    assert value(after, "agentgrad_engine_prefix_cache_tokens_total") > 0  # the second prompt reused the first's
    assert (
        value(after, "agentgrad_engine_prefix_cache_bytes") > 0
        and value(after, "agentgrad_engine_prefix_cache_entries") > 0
    )
    assert (
        value(after, "agentgrad_engine_batch_rows") == 0 and value(after, "agentgrad_engine_kv_cache_bytes") == 0
    )  # idle
    assert value(after, "agentgrad_engine_max_batch_rows") == tiny_engine.max_batch_size
    assert value(after, "process_resident_memory_bytes") > 0
    labels = {"server": "engine", "route": "/v1/chat/completions", "method": "POST", "status": "200"}
    assert value(after, "agentgrad_http_requests_total", **labels) == 2


def test_a_running_batch_shows_its_rows_and_kv_bytes(tiny_engine: Engine) -> None:
    """Read on the engine's own thread, between two decode steps: what a scrape during generation sees."""
    from agentgrad.engine.params import SamplingParams

    seen: list[tuple[int, int]] = []
    decode = tiny_engine._decode

    def watching(batch):  # type: ignore[no-untyped-def]
        seen.append((tiny_engine.running_rows, tiny_engine.kv_bytes))
        return decode(batch)

    tiny_engine._decode = watching  # type: ignore[method-assign]
    try:
        tiny_engine.generate([[1, 2, 3, 4]] * 3, SamplingParams(max_tokens=6, temperature=0.0))
    finally:
        del tiny_engine._decode
    rows, kv = seen[-1]
    assert rows == 3 and kv > 0


def test_the_engines_metrics_need_the_token_where_one_is_set(tiny_engine: Engine) -> None:
    with ServerThread(Guard(create_engine_app(tiny_engine), token="e")) as server:
        assert httpx.get(server.url + "/metrics").status_code == 401
        assert value(scrape(server.url, "e"), "agentgrad_engine_max_batch_rows") == tiny_engine.max_batch_size
