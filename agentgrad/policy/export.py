"""A training checkpoint as a Hugging Face folder anything can load (transformers, vLLM, the engine).

A `step-N` folder holds either full weights (`config.json` and safetensors) or a LoRA adapter
(`adapter_config.json`) over its base, beside the trainer's own files (optimizer state, progress). `export`
writes the model alone: full weights as they are, an adapter as an adapter folder (vLLM's `--lora-modules`
loads it) or, with `merge_lora`, merged into its base as full weights.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from agentgrad.engine.model import checkpoint_kind
from agentgrad.policy.checkpoints import TRAINER_FILES


def adapter_base(path: Path, base: str | None = None) -> str:
    """The base model of the adapter at `path`: `base` when given, else the one its adapter_config.json names."""
    named = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if base or named:
        return str(base or named)
    raise ValueError(f"the adapter at {path} names no base model: pass it (--base PATH_OR_ID)")


def export(checkpoint: str | Path, to: str | Path, *, merge_lora: bool = False, base: str | None = None) -> Path:
    """Write the model of `checkpoint` to `to` (a new or empty folder) as a Hugging Face folder; returns `to`."""
    source, target = Path(checkpoint), Path(to)
    kind = checkpoint_kind(source)
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target} is not empty: export into a new folder")
    target.mkdir(parents=True, exist_ok=True)
    if kind == "full" or not merge_lora:
        for item in source.iterdir():
            if item.name in TRAINER_FILES:
                continue
            copy = shutil.copytree if item.is_dir() else shutil.copy2
            copy(item, target / item.name)
        return target
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_model = AutoModelForCausalLM.from_pretrained(adapter_base(source, base), dtype="float32")
    merged = PeftModel.from_pretrained(base_model, str(source)).merge_and_unload()
    merged.save_pretrained(target)
    AutoTokenizer.from_pretrained(
        source if (source / "tokenizer_config.json").exists() else adapter_base(source, base)
    ).save_pretrained(target)
    return target


def servable(checkpoint: str | Path, base: str | None = None) -> str:
    """A folder the engine loads for `checkpoint`: itself for full weights, the adapter merged into a temporary
    folder for a LoRA checkpoint."""
    source = Path(checkpoint)
    if checkpoint_kind(source) == "full":
        return str(source)
    return str(export(source, Path(tempfile.mkdtemp(prefix="agentgrad-merged-")), merge_lora=True, base=base))
