"""Fixtures shared across the suite: tiny models of each built-in family (tests/tiny_models.py) and the engines
serving them, the real SmolLM2 engine, each loaded once per session and guarded (a test that changes a shared
engine's weights fails), and a fake upstream with a gateway in front of it, each a real server on loopback. The run
fails if it leaves a process it started running (tests/leftovers.py)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentgrad.engine.model import BUILTIN_FOLDERS, DEFAULT_MODEL, QWEN_MODEL
from agentgrad.gateway import Backend, Gateway
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from tests.fake_upstream import FakeUpstream
from tests.helpers import VLLM_LORA_RANK
from tests.leftovers import ProcessWatch, restore_weights, same_weights, weights_fingerprint
from tests.tiny_models import save_tiny_model, tiny_engine_of
from tests.xdist_groups import GroupsPlugin


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl+C as a terminal sends it: a suite started in the background of a non-interactive shell inherits SIGINT
    ignored, and so would every process its tests start, which the Ctrl+C tests then wait on in vain. And the run
    fails if it leaves a process running (`leftovers.ProcessWatch`)."""
    config.pluginmanager.register(ProcessWatch(), "agentgrad-process-watch")
    config.pluginmanager.register(GroupsPlugin(config), "agentgrad-xdist-groups")
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n 2`: a thread each, and for the processes tests start
        import torch  # (two workers computing on 2 threads each on 2 cores wait at every barrier: engine/threads.py)

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


SHARED_SERVERS: dict[str, Any] = {}
"""Session servers started so far, by fixture name: each is stopped after the last test that uses it."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests of each shared server one after another, so that it runs only while they do."""
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        for name in SHARED_SERVER_FIXTURES:
            if name in getattr(item, "fixturenames", ()):
                first.setdefault(name, index)

    def position(indexed: tuple[int, pytest.Item]) -> tuple[int, int]:
        index, item = indexed
        uses = [first[n] for n in SHARED_SERVER_FIXTURES if n in getattr(item, "fixturenames", ())]
        return (min(uses, default=index), index)

    items[:] = [item for _, item in sorted(enumerate(items), key=position)]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop a shared server once the next test does not use it (the tests that do were put together)."""
    for name, server in list(SHARED_SERVERS.items()):
        if nextitem is None or name not in getattr(nextitem, "fixturenames", ()):
            server.stop()
            del SHARED_SERVERS[name]


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
    """SmolLM2-135M-Instruct in fp32 (sampling and training on the same weights), CPU: for tests about what the
    model itself says; wiring tests take `tiny_engine`. A test may not change its weights (`shared_engines_kept`)."""
    from agentgrad.engine import Engine

    engine = Engine(sampling_dtype="float32", device="cpu")
    yield engine
    engine.close()


SHARED_SERVER_FIXTURES = ("smollm2_vllm",)


@pytest.fixture(scope="session")
def smollm2_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One SmolLM2 vLLM server for all the session's tests of it (start-up takes ~100 s on a CPU), with LoRA (rank 8,
    two adapters at once: one per role in tests/test_vllm_roles.py) and a 1 GiB KV cache (a few short calls at a
    time). A module whose tests push trained weights into it serves the weights on disk again as it ends
    (`helpers.serve_weights_from_disk`). `AGENTGRAD_TEST_VLLM_URL` uses a running server started with those flags."""
    from agentgrad.engine.model import resolve_model
    from agentgrad.policy.vllm_server import attach_servers, start_servers

    if os.environ.get("AGENTGRAD_TEST_VLLM_URL"):
        yield attach_servers([os.environ["AGENTGRAD_TEST_VLLM_URL"]])[0]
        return
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        (server,) = start_servers(
            resolve_model(None),
            DEFAULT_MODEL,
            lora_rank=VLLM_LORA_RANK,
            max_loras=2,
            log_dir=tmp_path_factory.mktemp("vllm"),
        )
    SHARED_SERVERS["smollm2_vllm"] = server
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model cache (`$AGENTGRAD_CACHE`) in which the built-in names are the tiny models (`tiny_default_models`)."""
    return tmp_path_factory.mktemp("tiny-cache")


@pytest.fixture(scope="session")
def tiny_smollm2_dir(tiny_cache: Path) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer, chat template (pythonic tool calls) and config."""
    return save_tiny_model(DEFAULT_MODEL, tiny_cache / "models" / BUILTIN_FOLDERS[DEFAULT_MODEL])


@pytest.fixture(scope="session")
def tiny_qwen_dir(tiny_cache: Path) -> Path:
    """A 2-layer random Qwen2 with Qwen2.5-Coder's tokenizer, chat template (`<tool_call>` tokens) and config."""
    return save_tiny_model(QWEN_MODEL, tiny_cache / "models" / BUILTIN_FOLDERS[QWEN_MODEL])


@pytest.fixture
def tiny_default_models(
    tiny_cache: Path, tiny_smollm2_dir: Path, tiny_qwen_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """For the test (and the processes it starts), `smollm2-135m` and `qwen2.5-coder-0.5b` name the tiny models: for
    wiring that loads the default model itself (`Trainer.dev`, the CLI)."""
    monkeypatch.setenv("AGENTGRAD_CACHE", str(tiny_cache))
    return tiny_cache


@pytest.fixture(scope="session")
def tiny_engine(tiny_smollm2_dir: Path) -> Iterator[Any]:
    """The tiny SmolLM2-family model served and trained by one engine, shared by the session (guarded as `engine`)."""
    engine = tiny_engine_of(tiny_smollm2_dir, "tiny-smollm2")
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tiny_qwen_engine(tiny_qwen_dir: Path) -> Iterator[Any]:
    """The tiny Qwen2-family model's engine, shared by the session (guarded as `engine`)."""
    engine = tiny_engine_of(tiny_qwen_dir, "tiny-qwen")
    yield engine
    engine.close()


@pytest.fixture
def fresh_tiny_engine(tiny_smollm2_dir: Path) -> Iterator[Any]:
    """A tiny SmolLM2-family engine of the test's own, for a test that trains or publishes other weights."""
    engine = tiny_engine_of(tiny_smollm2_dir, "tiny-smollm2")
    yield engine
    engine.close()


SHARED_ENGINES = ("engine", "tiny_engine", "tiny_qwen_engine", "two_versions")
TRAIN_THE_SESSION_ENGINE = {
    "tests/test_training_guards.py::test_an_agent_pinning_temperature_zero_trains_on_varied_groups_and_validates_greedily",
    "tests/test_training_guards.py::test_groups_sampled_identically_for_several_steps_are_reported_once_with_the_likely_cause",
}
"""Tests that train the shared `engine` (issue 39 rewrites them): their engine's weights are loaded back afterwards."""


@pytest.fixture(autouse=True)
def shared_engines_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a shared engine with other weights (trained, published, wrapped in adapters) than it
    found: every later test would run on them. The weights are loaded back from the engine's folder either way."""
    shared = {name: request.getfixturevalue(name) for name in SHARED_ENGINES if name in request.fixturenames}
    before = {name: weights_fingerprint(engine) for name, engine in shared.items()}
    yield
    for name, engine in shared.items():
        if same_weights(before[name], weights_fingerprint(engine)):
            continue
        problem = (
            f"{request.node.nodeid} changed the weights of the session's `{name}`, which later tests share: "
            "give it an engine of its own (`fresh_tiny_engine`, or `Engine(...)` closed at the end)"
        )
        try:
            restore_weights(engine)
        except Exception as exc:  # wrapped in adapters, say: later tests will see it
            pytest.fail(f"{problem}; its weights could not be loaded back ({exc!r})")
        if request.node.nodeid not in TRAIN_THE_SESSION_ENGINE:
            pytest.fail(problem)


@pytest.fixture(scope="module")
def engine_gateway(engine: Any) -> Iterator[tuple[str, MemoryStore, Gateway]]:
    """The engine served on loopback behind a gateway (model "policy"): (gateway root URL, store, gateway)."""
    from agentgrad.engine.server import create_engine_app

    store = MemoryStore()
    with ServerThread(create_engine_app(engine)) as server:
        gateway = Gateway(store, {"policy": Backend(server.url + "/v1", model=engine.name, system="agentgrad")})
        with ServerThread(gateway) as front:
            yield front.url, store, gateway


def save_lora_adapter(base: Path, folder: Path, seed: int, as_checkpoint: bool) -> Path:
    """A LoRA adapter over the model in `base` at random non-zero weights (`seed`), saved as a PEFT folder or, with
    `as_checkpoint`, as GRPO's LoRA `step-N` checkpoint (the adapter, the tokenizer and the trainer's files)."""
    import json

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgrad.policy.checkpoints import TRAINER_STATE

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(folder)
    if as_checkpoint:
        AutoTokenizer.from_pretrained(base).save_pretrained(folder)
        torch.save({"optimizer": {}, "state": {"step": 3}}, folder / TRAINER_STATE)
        (folder / "agentgrad.json").write_text(json.dumps({"step": 3}))
    return folder


@pytest.fixture(scope="session")
def saved_adapters(tiny_smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two saved adapters of the tiny SmolLM2-family model that answer differently: `step-1` a PEFT folder, `step-3`
    a step-N checkpoint."""
    root = tmp_path_factory.mktemp("adapters")
    return {
        "step-1": save_lora_adapter(tiny_smollm2_dir, root / "step-1", seed=1, as_checkpoint=False),
        "step-3": save_lora_adapter(tiny_smollm2_dir, root / "step-3", seed=3, as_checkpoint=True),
    }


@pytest.fixture(scope="session")
def two_versions(tiny_smollm2_dir: Path, saved_adapters: dict[str, Path]) -> Iterator[Any]:
    """The tiny SmolLM2-family model (fp32, CPU) serving the two saved adapters by name (`load_adapters`) beside
    its base."""
    from agentgrad.engine.adapters import load_adapters

    engine = tiny_engine_of(tiny_smollm2_dir)
    load_adapters(engine, saved_adapters)
    yield engine
    engine.close()
