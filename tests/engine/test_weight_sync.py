"""Weight transports and the vLLM start-up checks, in the parts that need neither vLLM nor CUDA."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentgrad.algorithms.grpo_update import tis_weights
from agentgrad.policy.config import PolicyConfig
from agentgrad.policy.transports import (
    LORA_NAME,
    FileTransport,
    LoRATransport,
    NCCLTransport,
    hf_state_dict,
    make_transport,
    nccl_init_info,
    nccl_update_info,
)
from agentgrad.policy.vllm_server import ROUTES, VLLMServer, report_capabilities, serve_command


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(4, 3)
        self.head = torch.nn.Linear(3, 4, bias=False)
        self.head.weight = self.embed.weight


def test_the_file_transport_writes_hf_names_tied_tensors_under_each_name_and_keeps_only_the_newest_version(
    tmp_path: Path,
) -> None:
    transport = FileTransport([], directory=tmp_path)
    model = Tied()
    transport.write(model, 1)
    folder = transport.write(model, 2)
    assert [p.name for p in transport.root.iterdir()] == ["v2"]
    weights = load_file(folder / "model.safetensors")
    # the tied head too: vLLM's CPU build keeps a stale packed lm_head when a reload does not name it
    assert list(weights) == ["embed.weight", "head.weight"]
    assert torch.equal(weights["embed.weight"], model.embed.weight) and torch.equal(
        weights["head.weight"], model.embed.weight
    )
    assert list(hf_state_dict(model)) == ["embed.weight"]  # other transports send a tied tensor once
    transport.close()
    assert not transport.root.exists()


def test_nccl_payloads_follow_vllms_init_and_update_schemas() -> None:
    weights = hf_state_dict(torch.nn.Linear(3, 2).to(torch.bfloat16))
    assert nccl_update_info(weights) == {
        "names": ["weight", "bias"],
        "dtype_names": ["bfloat16", "bfloat16"],
        "shapes": [[2, 3], [2]],
    }
    init = nccl_init_info(b"\x01" * 128, world_size=3)
    assert base64.b64decode(init["nccl_unique_id_b64"]) == b"\x01" * 128
    assert init | {"nccl_unique_id_b64": None} == {
        "nccl_unique_id_b64": None,
        "rank_offset": 1,
        "world_size": 3,
        "packed": False,
    }


def test_the_nccl_transport_without_cuda_says_to_use_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU machine, wherever this runs
    with pytest.raises(RuntimeError, match="transport='file'"):
        NCCLTransport(["http://127.0.0.1:1"])


def test_transport_choice_follows_lora_and_rejects_mismatches() -> None:
    chosen = make_transport("auto", [], lora=False)
    chosen.close()  # a file transport's folder on /dev/shm goes with it
    assert chosen.name == ("nccl" if torch.cuda.is_available() else "file")
    with pytest.raises(ValueError, match="needs lora_rank"):
        make_transport("lora", [], lora=False)
    with pytest.raises(ValueError, match="use transport='lora'"):
        make_transport("file", [], lora=True)
    with pytest.raises(ValueError, match="unknown weight transport"):
        make_transport("carrier-pigeon", [], lora=False)


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(4, 8)
        self.down = torch.nn.Linear(8, 4)


def test_the_lora_transport_writes_each_roles_adapter_under_its_own_name_and_servers_hold_that_many(
    tmp_path: Path,
) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model

    config = LoraConfig(r=2, target_modules=["up", "down"], init_lora_weights=False)
    model = get_peft_model(TwoLayers(), config, adapter_name="solver")
    model.add_adapter("verifier", LoraConfig(r=2, target_modules=["up", "down"], init_lora_weights=False))
    for adapters, served in (
        (["solver", "verifier"], {"solver": "solver", "verifier": "verifier"}),
        ([], {LORA_NAME: "default"}),
    ):  # one per role, else the policy's one adapter
        chosen = make_transport("auto", [], lora=True, adapters=adapters)
        chosen.close()
        assert isinstance(chosen, LoRATransport) and chosen.served == served
    transport = LoRATransport([], directory=tmp_path, adapters=["solver", "verifier"])  # no server: check its folders
    transport.push(model, 1)
    transport.push(model, 2)
    assert sorted(p.name for p in transport.root.iterdir()) == ["v2"]  # a new path per version: new vLLM cache keys
    for role in ("solver", "verifier"):  # each folder holds that role's adapter, loadable as a PEFT adapter
        loaded = PeftModel.from_pretrained(TwoLayers(), transport.root / "v2" / role)
        lora = [(name, weight) for name, weight in loaded.named_parameters() if "lora_" in name]
        assert len(lora) == 4
        for name, weight in lora:
            assert torch.equal(weight, model.get_parameter(name.replace(".default.", f".{role}."))), name
    transport.close()
    command = serve_command(Path("py"), "/m", "policy", 8123, lora_rank=8, max_loras=2)
    assert command[command.index("--max-loras") + 1] == "2"
    with pytest.raises(ValueError, match="max_loras"):
        serve_command(Path("py"), "/m", "policy", 8123, lora_rank=8, max_loras=0)


def test_the_capability_line_names_each_missing_route() -> None:
    full = VLLMServer("http://127.0.0.1:1", routes=frozenset(r for routes in ROUTES.values() for r in routes))
    assert report_capabilities([full], "file") == "vLLM weight transports (file chosen): file: ok; lora: ok; nccl: ok"
    plain = VLLMServer(
        "http://127.0.0.1:1",
        routes=frozenset({"/v1/chat/completions", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"}),
    )
    line = report_capabilities([plain], "lora")
    assert "file: missing /collective_rpc, /pause, /reset_prefix_cache, /resume" in line and "lora: ok" in line
    assert line.endswith("(start vLLM with VLLM_SERVER_DEV_MODE=1)")


def test_servers_listen_on_loopback_with_the_sampled_distributions_logprobs() -> None:
    command = serve_command(Path("py"), "/m", "policy", 8123, lora_rank=12)
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert command[command.index("--max-lora-rank") + 1] == "16"
    assert command[command.index("--dtype") + 1] == "auto"  # start_servers passes default_dtype(): fp32 without bf16
    blocks = serve_command(Path("py"), "/m", "policy", 8123, block_size=32)  # start_servers' on a CPU: prefix hits
    assert blocks[blocks.index("--block-size") + 1] == "32" and "--block-size" not in command


def test_truncated_importance_weights_cap_the_ratio_and_are_off_by_default() -> None:
    trainer, sampler = torch.log(torch.tensor([0.5, 0.9, 0.1])), torch.log(torch.tensor([0.5, 0.3, 0.2]))
    weights, truncated = tis_weights(trainer, sampler, cap=2.0)
    assert torch.allclose(weights, torch.tensor([1.0, 2.0, 0.5])) and truncated.tolist() == [0.0, 1.0, 0.0]
    weights, truncated = tis_weights(trainer, sampler, cap=None)
    assert weights.tolist() == [1.0, 1.0, 1.0] and truncated.tolist() == [0.0, 0.0, 0.0]


def test_engine_settings_are_checked() -> None:
    for bad, message in (
        (dict(engine="sglang"), "engine must be"),
        (dict(tis_cap=0.5), "tis_cap must be at least 1"),
        (dict(engine="vllm", vllm_replicas=0), "vllm_replicas"),
        (dict(vllm_transport="x"), "vllm_transport"),
    ):
        with pytest.raises(ValueError, match=message):
            PolicyConfig(**bad)  # type: ignore[arg-type]


def test_stopping_a_started_server_also_kills_the_processes_it_spawned(tmp_path: Path) -> None:
    # like vLLM's API server, a parent that exits on SIGTERM while its worker (here: ignoring SIGTERM) lives on
    pid_file = tmp_path / "worker.pid"
    script = (
        "import signal, subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(worker.pid))\n"
        "time.sleep(300)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    while not pid_file.exists() or not pid_file.read_text():
        assert process.poll() is None, "the test's server process died before spawning its worker"
        time.sleep(0.05)
    worker = int(pid_file.read_text())
    VLLMServer("http://127.0.0.1:1", process).stop()
    assert process.poll() is not None
    with pytest.raises(ProcessLookupError):  # killed and reaped by init (it was orphaned), or a zombie being reaped
        for _ in range(200):
            os.kill(worker, 0)
            time.sleep(0.05)
