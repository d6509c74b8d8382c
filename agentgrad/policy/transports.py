"""Getting the trainer's weights into running vLLM servers: one interface, three transports.

- `FileTransport`: the weights as a safetensors folder with HF names (on `/dev/shm`, or any
  filesystem the servers share), reloaded with `/collective_rpc reload_weights`. Works on a
  CPU and across machines; run here (0.3 s on the server for SmolLM2-135M).
- `LoRATransport`: only the adapters (the policy's one, or one per agent role, each under its name),
  saved by peft and loaded in place with `/v1/load_lora_adapter`. Run here.
- `NCCLTransport`: vLLM's native weight transfer (`/init_weight_transfer_engine`, then per
  update `/start_weight_update`, `/update_weights` while rank 0 broadcasts each tensor,
  `/finish_weight_update`), for trainer and servers on GPUs. Written against vLLM 0.32's
  routes; it needs CUDA and has not been run here.

The caller (`VLLMPolicy.sync`) pauses generation around `push`, so no response mixes versions.
"""

from __future__ import annotations

import base64
import logging
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import httpx
import torch

log = logging.getLogger(__name__)

SHM = Path("/dev/shm")
RPC_TIMEOUT_SECONDS = 300.0
LORA_NAME = "agentgrad-policy"
"""The name the policy's adapter is served under; requests name it as their model."""
PEFT_DEFAULT = "default"
"""peft's name for a model's one adapter (`get_peft_model` without `adapter_name`)."""


class WeightTransport(Protocol):
    """Moves the current weights of `model` into every server, as weights version `version`."""

    name: str

    def push(self, model: torch.nn.Module, version: int) -> None: ...

    def close(self) -> None: ...


def _post(client: httpx.Client, url: str, **kwargs: Any) -> httpx.Response:
    response = client.post(url, timeout=RPC_TIMEOUT_SECONDS, **kwargs)
    if response.status_code != 200:
        raise RuntimeError(f"POST {url} answered {response.status_code}: {response.text[:500]}")
    return response


def hf_state_dict(model: torch.nn.Module, *, tied: bool = False) -> dict[str, torch.Tensor]:
    """The model's weights under their Hugging Face names, contiguous, detached.

    A tensor tied to another (lm_head to the embeddings) is kept once, unless `tied`: then it is
    also written under its own name (a copy, as safetensors stores no shared memory).
    """
    seen: set[int] = set()
    weights = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            if tied:
                weights[name] = tensor.detach().clone()
            continue
        seen.add(tensor.data_ptr())
        weights[name] = tensor.detach().contiguous()
    return weights


class FileTransport:
    """safetensors on a shared filesystem, then `reload_weights` on each server (an internal vLLM method)."""

    name = "file"

    def __init__(self, urls: Sequence[str], directory: Path | None = None, dtype: torch.dtype | None = None) -> None:
        self.urls = list(urls)
        self.root = Path(
            tempfile.mkdtemp(prefix="agentgrad-weights-", dir=directory or (SHM if SHM.is_dir() else None))
        )
        self.dtype = dtype
        self._client = httpx.Client()

    def write(self, model: torch.nn.Module, version: int) -> Path:
        """The weights as `model.safetensors` in a fresh folder; older versions' folders are removed."""
        from safetensors.torch import save_file

        folder = self.root / f"v{version}"
        folder.mkdir(parents=True, exist_ok=True)
        # the tied lm_head under its own name too: vLLM's CPU build packs the lm_head's matmul weights
        # at load, and a reload that brings no `lm_head.weight` keeps the old packed copy (greedy
        # output then ignores the update; seen with fp32 serving on an AVX2 CPU)
        weights = hf_state_dict(model, tied=True)
        if self.dtype is not None:
            weights = {k: v.to(self.dtype) for k, v in weights.items()}
        save_file(weights, str(folder / "model.safetensors"))
        for old in self.root.iterdir():
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
        return folder

    def push(self, model: torch.nn.Module, version: int) -> None:
        folder = self.write(model, version)
        for url in self.urls:
            _post(
                self._client,
                url + "/collective_rpc",
                json={"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
            )

    def close(self) -> None:
        self._client.close()
        shutil.rmtree(self.root, ignore_errors=True)


class LoRATransport:
    """peft adapters saved to a fresh folder per version, loaded in place on each server under the name requests
    give as their model: the policy's one adapter under `LORA_NAME`, or each of `adapters` (one per agent role,
    `agentgrad.engine.adapters`) under its own name.

    A new folder per version matters: vLLM keys its prefix cache by the adapter's name and path, so a reload from a
    new path never reuses blocks computed with the old weights.
    """

    name = "lora"

    def __init__(self, urls: Sequence[str], directory: Path | None = None, adapters: Sequence[str] = ()) -> None:
        self.urls = list(urls)
        self.root = Path(tempfile.mkdtemp(prefix="agentgrad-lora-", dir=directory or (SHM if SHM.is_dir() else None)))
        self.served = {name: name for name in adapters} or {LORA_NAME: PEFT_DEFAULT}
        """Name served under -> the peft adapter it is saved from."""
        self._client = httpx.Client()

    def push(self, model: torch.nn.Module, version: int) -> None:
        from agentgrad.engine.adapters import save_adapter

        folder = self.root / f"v{version}"
        for served, adapter in self.served.items():
            save_adapter(model, adapter, folder / served)
            for url in self.urls:  # in place: a server attached to may hold the name from an earlier run
                _post(
                    self._client,
                    url + "/v1/load_lora_adapter",
                    json={"lora_name": served, "lora_path": str(folder / served), "load_inplace": True},
                )
        for old in self.root.iterdir():
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        self._client.close()
        shutil.rmtree(self.root, ignore_errors=True)


# ----------------------------------------------------------------------------- NCCL (GPUs only)


def nccl_update_info(weights: dict[str, torch.Tensor]) -> dict[str, list[Any]]:
    """`/update_weights`' payload: names, dtypes and shapes, in the order rank 0 broadcasts them."""
    return {
        "names": list(weights),
        "dtype_names": [str(t.dtype).removeprefix("torch.") for t in weights.values()],
        "shapes": [list(t.shape) for t in weights.values()],
    }


def nccl_init_info(unique_id: bytes, world_size: int) -> dict[str, Any]:
    """`/init_weight_transfer_engine`'s payload for a trainer that mints the NCCL unique id itself:
    the trainer is rank 0, the servers' workers ranks 1.. (`rank_offset` 1), tensors sent one by one."""
    return {
        "nccl_unique_id_b64": base64.b64encode(unique_id).decode(),
        "rank_offset": 1,
        "world_size": world_size,
        "packed": False,
    }


class NCCLTransport:
    """vLLM's native NCCL weight transfer from this process (rank 0, on a GPU) to one server's workers.

    Start the server with `--weight-transfer-config '{"backend": "nccl"}'`. `workers` is the
    server's tensor × pipeline parallel size (its `/get_world_size`).
    """

    name = "nccl"

    def __init__(self, urls: Sequence[str], device: str = "cuda") -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "the nccl weight transport needs CUDA on the trainer and the servers; on a CPU use transport='file'"
            )
        if len(urls) != 1:
            raise ValueError(
                f"the nccl transport serves one vLLM server per trainer group, got {len(urls)}: "
                "use transport='file' for several replicas"
            )
        self.url = urls[0]
        self.device = torch.device(device)
        self._client = httpx.Client()
        workers = int(self._client.get(self.url + "/get_world_size", params={"include_dp": False}).json()["world_size"])
        unique_id = torch.cuda.nccl.unique_id()
        world = 1 + workers
        with ThreadPoolExecutor(1) as pool:  # the workers block in their rendezvous until rank 0 joins
            done = pool.submit(
                _post,
                self._client,
                self.url + "/init_weight_transfer_engine",
                json={"init_info": nccl_init_info(unique_id, world)},
            )
            self._comm = torch.cuda.nccl.init_rank(world, unique_id, 0)
            warm = torch.zeros(1, device=self.device)
            torch.cuda.nccl.all_reduce([warm], comms=[self._comm])  # the workers' warm-up handshake
            done.result()

    def push(self, model: torch.nn.Module, version: int) -> None:
        weights = {k: v.to(self.device) for k, v in hf_state_dict(model).items()}
        _post(self._client, self.url + "/start_weight_update")
        with ThreadPoolExecutor(1) as pool:  # the server receives while rank 0 sends
            received = pool.submit(
                _post, self._client, self.url + "/update_weights", json={"update_info": nccl_update_info(weights)}
            )
            for tensor in weights.values():
                torch.cuda.nccl.broadcast([tensor], root=0, comms=[self._comm])
            torch.cuda.synchronize(self.device)
            received.result()
        _post(self._client, self.url + "/finish_weight_update", json={"weight_version": str(version)})

    def close(self) -> None:
        try:
            self._client.post(self.url + "/shutdown_weight_transfer_engine", timeout=30)
        except httpx.HTTPError:
            pass
        self._client.close()


def make_transport(kind: str, urls: Sequence[str], lora: bool, adapters: Sequence[str] = ()) -> WeightTransport:
    """`auto`: LoRA adapters when training LoRA, else NCCL on GPUs, else files. `adapters`: the adapters the
    LoRA transport pushes, each under its own name (one per agent role); none: the policy's one adapter."""
    if kind == "auto":
        kind = "lora" if lora else ("nccl" if torch.cuda.is_available() else "file")
    if kind == "lora" and not lora:
        raise ValueError("transport='lora' needs lora_rank > 0 (only adapters travel)")
    if lora and kind != "lora":
        raise ValueError(f"with lora_rank > 0 the servers serve an adapter: use transport='lora', not {kind!r}")
    if kind == "file":
        return FileTransport(urls)
    if kind == "lora":
        return LoRATransport(urls, adapters=adapters)
    if kind == "nccl":
        return NCCLTransport(urls)
    raise ValueError(f"unknown weight transport {kind!r}: use auto, file, lora or nccl")
