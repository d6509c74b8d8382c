"""Any checkpoint served and exported: a step-N folder (full weights or a LoRA adapter) as a Hugging Face
folder transformers loads with the same logits, and `agentgrad engine serve --checkpoint` answering with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from agentgrad.cli.main import main
from agentgrad.policy.checkpoints import TRAINER_STATE
from agentgrad.policy.export import export
from tests.helpers import free_port, wait_until

PROMPT = "The capital of France is"


@pytest.fixture
def base(tiny_smollm2_dir: Path) -> Path:
    """The model checkpoints are made from: the tiny SmolLM2-family one (exporting is wiring)."""
    return tiny_smollm2_dir


def base_model(base: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()


def tokenizer(base: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base)


def logits(model: Any, base: Path) -> torch.Tensor:
    ids = tokenizer(base)(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits


def greedy(model: Any, base: Path, tokens: int = 8) -> str:
    tok = tokenizer(base)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False)
    return str(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def trained_checkpoint(base: Path, path: Path) -> Any:
    """A full-weights step-N folder as GRPO writes it, with weights changed as a training step would."""
    model = base_model(base)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "q_proj" in name or "o_proj" in name:
                weight.add_(0.05 * torch.randn_like(weight))
    model.save_pretrained(path)
    tokenizer(base).save_pretrained(path)
    torch.save({"optimizer": {}, "state": {"step": 3}}, path / TRAINER_STATE)
    (path / "agentgrad.json").write_text(json.dumps({"step": 3}))
    return model


def test_an_exported_full_checkpoint_loads_with_transformers_and_gives_the_same_logits(base: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    trained = trained_checkpoint(base, tmp_path / "step-3")
    assert main(["export", str(tmp_path / "step-3"), "--to", str(tmp_path / "hf")]) == 0
    assert not (tmp_path / "hf" / TRAINER_STATE).exists() and not (tmp_path / "hf" / "agentgrad.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    assert torch.equal(logits(loaded, base), logits(trained, base))
    assert main(["export", str(tmp_path / "step-3"), "--to", str(tmp_path / "hf")]) != 0  # not empty: refused


def test_a_lora_checkpoint_exports_as_an_adapter_or_merged_with_the_same_logits(base: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    lora = get_peft_model(
        base_model(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    ).eval()
    lora.save_pretrained(tmp_path / "step-2")
    expected = logits(lora, base)
    assert not torch.allclose(expected, logits(base_model(base), base), atol=1e-3)  # the adapter changes the model

    export(tmp_path / "step-2", tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    export(tmp_path / "step-2", tmp_path / "merged", merge_lora=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    assert torch.allclose(logits(merged, base), expected, atol=1e-4)
    assert not (tmp_path / "merged" / "adapter_config.json").exists()


def test_a_folder_that_is_not_a_checkpoint_is_refused_naming_what_was_looked_for(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="config.json .full weights. or adapter_config.json"):
        export(tmp_path, tmp_path / "out")


@pytest.mark.slow
def test_engine_serve_checkpoint_answers_with_the_trained_weights(base: Path, tmp_path: Path) -> None:
    trained = trained_checkpoint(base, tmp_path / "step-3")
    expected, before = greedy(trained, base), greedy(base_model(base), base)
    assert expected != before, "the changed weights must change the greedy answer"
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "agentgrad.cli", "engine", "serve", "--checkpoint", str(tmp_path / "step-3"),
         "--port", str(port), "--device", "cpu", "--dtype", "float32"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, "the engine serving the checkpoint", timeout=180)
        answer = httpx.post(url + "/v1/completions", timeout=120, json={
            "model": "step-3", "prompt": PROMPT, "max_tokens": 8, "temperature": 0})
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] == expected
    finally:
        server.terminate()
        server.wait(timeout=30)
