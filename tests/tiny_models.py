"""Tiny models for tests whose point is wiring, not what the model says: a random-weight network of each built-in
model's family (Llama for SmolLM2, Qwen2 for Qwen2.5-Coder) with 2 layers, and, saved as a model folder, the real
tokenizer, chat template and generation config beside it, so that `Engine(folder)` serves and trains it as it does
the real model (the same token ids, tool-call format and special tokens) in about a second.

`tiny_network` is the bare module (the numerics tests); `save_tiny_model` the folder (tests/conftest.py builds one
per built-in model per session: the `tiny_smollm2_dir` and `tiny_qwen_dir` fixtures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

TINY_SHAPE: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, initializer_range=0.3,
)
"""Two layers, grouped-query attention as both real models have it (heads share keys and values in pairs). Weights
drawn 15x wider than the real configs' 0.02: at 0.02 the tied Llama mostly repeats the prompt's last token, so every
prompt gets the same greedy answer and a test could not tell rows apart; at 0.3 each prompt gets its own 20 distinct
tokens, and greedy steps' top two logits stay 1e-3 apart or more (fp32 batching moves them by ~1e-6)."""


def tiny_network(family: str = "llama", **overrides: Any) -> torch.nn.Module:
    """A random fp32 network of `family` ("llama" or "qwen2": biased query, key and value projections, given random
    biases so that they count), seeded; `overrides` change the config (`vocab_size` defaults to 300)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    shape = {**TINY_SHAPE, "vocab_size": 300, "max_position_embeddings": 128, **overrides}
    if family == "qwen2":
        model: torch.nn.Module = Qwen2ForCausalLM(Qwen2Config(**shape))
        with torch.no_grad():
            for layer in model.model.layers:
                for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    linear.bias.normal_()
    elif family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        raise ValueError(f"unknown family {family!r}: tiny networks are 'llama' (SmolLM2) or 'qwen2' (Qwen2.5)")
    return model.float().eval()


def save_tiny_model(builtin: str, folder: Path) -> Path:
    """`builtin`'s (`smollm2-135m`, `qwen2.5-coder-0.5b`) tokenizer, chat template, generation config and config,
    the network shrunk to `TINY_SHAPE` with random weights, saved to `folder` (an `Engine` or vLLM loads it)."""
    from transformers import AutoTokenizer, GenerationConfig

    from agentgrad.engine.model import resolve_model

    source = resolve_model(builtin)  # the converted real model: its tokenizer and config are what we keep
    config: dict[str, Any] = json.loads((Path(source) / "config.json").read_text())
    config.pop("layer_types", None)  # one entry per real layer: rebuilt for the two tiny ones
    config.pop("_model_name_or_path", None)
    network = tiny_network(config.pop("model_type"), **{k: v for k, v in config.items() if k not in TINY_SHAPE})
    network.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    GenerationConfig.from_pretrained(source).save_pretrained(folder)
    return folder


def tiny_engine_of(folder: Path, name: str = "tiny-smollm2", **options: Any) -> Any:
    """An fp32 CPU engine over a tiny model folder, on one thread (a tiny model's steps are too short to share)."""
    from agentgrad.engine import Engine

    return Engine(folder, **{"sampling_dtype": "float32", "device": "cpu", "threads": 1, "name": name, **options})
