"""A tiny random model with the real tokenizer, shared by the distributed tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from agentgrad.engine.model import resolve_model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 1-layer Llama with SmolLM2's tokenizer and chat template: a real engine, in seconds."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model())
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
