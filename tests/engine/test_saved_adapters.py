"""Saved adapters served by name (`load_adapters`, `agentgrad engine serve --adapter NAME=PATH`): a request whose
`model` names an adapter gets what that adapter merged into its base gives alone; `/v1/models` lists each adapter
with its parent, as vLLM lists LoRA modules; what is not an adapter of the served base is refused saying why."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from agentgrad.cli.main import main
from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.adapters import load_adapters
from agentgrad.engine.server import create_engine_app
from agentgrad.policy.export import export
from agentgrad.semconv import ADAPTER_HEADER
from agentgrad.serving import ServerThread

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
QUESTION = [{"role": "user", "content": "Name a colour of the sky."}]


def test_a_saved_adapter_served_by_name_gives_the_tokens_and_logprobs_of_it_merged_and_served_alone(
    two_versions: Engine, saved_adapters: dict[str, Path], tmp_path: Path
) -> None:
    engine = two_versions
    ids = engine.chat_prompt_ids(QUESTION)
    with engine._cv:  # all three are queued before the loop takes any: one batch mixing both adapters and the base
        futures = {name: engine.submit(ids, GREEDY, adapter=name) for name in ("step-1", "step-3", "base")}
    served = {name: future.result(timeout=600) for name, future in futures.items()}
    assert len({tuple(g.completions[0].token_ids) for g in served.values()}) == 3  # each version answers its own way

    merged = Engine(export(saved_adapters["step-3"], tmp_path / "merged", merge_lora=True), sampling_dtype="float32")
    try:
        alone = merged.generate([merged.chat_prompt_ids(QUESTION)], GREEDY)[0].completions[0]
    finally:
        merged.close()
    by_adapter = served["step-3"].completions[0]
    assert served["step-3"].adapter == "step-3"
    assert by_adapter.token_ids == alone.token_ids
    assert by_adapter.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_the_request_model_selects_the_adapter_and_models_lists_each_with_its_parent(two_versions: Engine) -> None:
    engine = two_versions
    expected = engine.submit(engine.chat_prompt_ids(QUESTION), GREEDY, adapter="step-1").result(timeout=600)
    with ServerThread(create_engine_app(engine)) as server:
        listed = httpx.get(server.url + "/v1/models").json()["data"]
        assert [(m["id"], m.get("parent")) for m in listed] == [
            (engine.name, None),
            ("step-1", engine.name),
            ("step-3", engine.name),
        ]

        def ask(model: str) -> httpx.Response:
            body = {"model": model, "messages": QUESTION, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
            return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=600)

        by_name = ask("step-1")
        assert by_name.status_code == 200, by_name.text
        assert by_name.headers[ADAPTER_HEADER] == "step-1"
        assert by_name.json()["choices"][0]["token_ids"] == expected.completions[0].token_ids
        assert ask(engine.name).headers[ADAPTER_HEADER] == "base"  # the base's own name: the base
        unknown = ask("step-2")
        assert unknown.status_code == 404 and "step-1" in unknown.json()["error"]["message"]


def test_full_weights_another_base_or_a_taken_name_are_refused_saying_what_to_do(
    two_versions: Engine, saved_adapters: dict[str, Path], tmp_path: Path
) -> None:
    full = tmp_path / "step-9"
    full.mkdir()
    (full / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds full weights, not a LoRA adapter.*--checkpoint"):
        load_adapters(two_versions, {"full": full})

    other = tmp_path / "qwen-adapter"
    other.mkdir()
    config = json.loads((saved_adapters["step-1"] / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "Qwen/Qwen2.5-0.5B"}))
    with pytest.raises(ValueError, match=r"trained over 'Qwen/Qwen2\.5-0\.5B'.*--model Qwen/Qwen2\.5-0\.5B"):
        load_adapters(two_versions, {"other": other})

    with pytest.raises(ValueError, match=r"already serves adapters named \['step-1'\]"):
        load_adapters(two_versions, {"step-1": saved_adapters["step-3"]})
    assert list(two_versions.adapters.patterns) == ["step-1", "step-3"]  # nothing was added by the refusals


def test_engine_serve_refuses_a_malformed_adapter_option_before_loading_the_model() -> None:
    assert main(["engine", "serve", "--adapter", "step-1"]) == 2
    assert main(["engine", "serve", "--adapter", "a=/x", "--adapter", "a=/y"]) == 2
