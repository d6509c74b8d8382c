"""Fixtures shared across the suite: the SmolLM2 engine (loaded once per session), and a fake
upstream with a gateway in front of it, each a real server on loopback."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentgrad.gateway import Backend, Gateway
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from tests.fake_upstream import FakeUpstream


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl+C as a terminal sends it: a suite started in the background of a non-interactive shell inherits SIGINT
    ignored, and so would every process its tests start, which the Ctrl+C tests then wait on in vain."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


UPSTREAM_KEY = "sk-upstream-secret-1234"


@dataclass
class Upstream:
    fake: FakeUpstream
    url: str  # base URL, ending in /v1


@dataclass
class Served:
    gateway: Gateway
    url: str  # server root, no /v1
    store: MemoryStore


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    fake = FakeUpstream(api_key=UPSTREAM_KEY)
    with ServerThread(fake.app) as server:
        yield Upstream(fake, server.url + "/v1")


@pytest.fixture
def served(upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    store = MemoryStore()
    gateway = Gateway(
        store, {"policy": Backend(upstream.url, api_key_env="FAKE_UPSTREAM_KEY", system="vllm")}, retry_backoff_s=0.001
    )
    with ServerThread(gateway) as server:
        yield Served(gateway, server.url, store)


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    """SmolLM2-135M-Instruct in fp32 (sampling and training on the same weights), CPU."""
    from agentgrad.engine import Engine

    engine = Engine(sampling_dtype="float32", device="cpu")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def engine_gateway(engine: Any) -> Iterator[tuple[str, MemoryStore, Gateway]]:
    """The engine served on loopback behind a gateway (model "policy"): (gateway root URL, store, gateway)."""
    from agentgrad.engine.server import create_engine_app

    store = MemoryStore()
    with ServerThread(create_engine_app(engine)) as server:
        gateway = Gateway(store, {"policy": Backend(server.url + "/v1", model=engine.name, system="agentgrad")})
        with ServerThread(gateway) as front:
            yield front.url, store, gateway


def save_lora_adapter(folder: Path, seed: int, as_checkpoint: bool) -> Path:
    """A LoRA adapter over SmolLM2 at random non-zero weights (`seed`), saved as a PEFT folder or, with
    `as_checkpoint`, as GRPO's LoRA `step-N` checkpoint (the adapter, the tokenizer and the trainer's files)."""
    import json

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgrad.engine.model import resolve_model
    from agentgrad.policy.checkpoints import TRAINER_STATE

    base = AutoModelForCausalLM.from_pretrained(resolve_model(), dtype=torch.float32)
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(folder)
    if as_checkpoint:
        AutoTokenizer.from_pretrained(resolve_model()).save_pretrained(folder)
        torch.save({"optimizer": {}, "state": {"step": 3}}, folder / TRAINER_STATE)
        (folder / "agentgrad.json").write_text(json.dumps({"step": 3}))
    return folder


@pytest.fixture(scope="session")
def saved_adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two saved adapters of SmolLM2 that answer differently: `step-1` a PEFT folder, `step-3` a step-N checkpoint."""
    root = tmp_path_factory.mktemp("adapters")
    return {
        "step-1": save_lora_adapter(root / "step-1", seed=1, as_checkpoint=False),
        "step-3": save_lora_adapter(root / "step-3", seed=3, as_checkpoint=True),
    }


@pytest.fixture(scope="session")
def two_versions(saved_adapters: dict[str, Path]) -> Iterator[Any]:
    """SmolLM2 (fp32, CPU) serving the two saved adapters by name (`load_adapters`) beside its base."""
    from agentgrad.engine import Engine
    from agentgrad.engine.adapters import load_adapters

    engine = Engine(sampling_dtype="float32", device="cpu")
    load_adapters(engine, saved_adapters)
    yield engine
    engine.close()
