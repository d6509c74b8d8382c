"""The policy served by vLLM: the trainer's HF model here, its rollouts sampled by vLLM servers.

A sibling of `LocalPolicy` behind the same `Policy` surface (base.py); its `sync()` after each update does the
work: generation is held (the gateway's `ReplicaPool` drains calls in flight and holds
new ones, and each server is paused with `/pause?mode=wait`), the weights travel by the chosen
transport (`agentgrad.policy.transports`), the prefix cache is reset, and generation resumes
on the new version. Every span the gateway records names the version that produced it.

With `adapters` (role -> agent-name pattern, `GRPOConfig(roles=...)`) the servers hold one LoRA adapter per role
(`--enable-lora --max-loras <roles>`), each loaded under its role's name and pushed at every sync; the gateway's
pool sends each call under its agent's adapter (`Adapters.resolve`, the built-in engine's rule: exact name, first
matching pattern, else the base model) and records which on the span (`agentgrad.adapter.name`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Unpack

import httpx
import torch

from agentgrad.engine import Engine
from agentgrad.engine.threads import in_own_thread
from agentgrad.gateway.replicas import ReplicaPool
from agentgrad.gateway.upstreams import TRAINED_ENGINE_TIMEOUT_SECONDS, Backend
from agentgrad.policy.base import Policy, PolicyOptions
from agentgrad.policy.transports import LORA_NAME, WeightTransport, make_transport
from agentgrad.policy.vllm_server import (
    VLLMServer,
    attach_servers,
    report_capabilities,
    start_servers,
    tool_parser_of,
)
from agentgrad.semconv import BASE_ADAPTER
from agentgrad.store import Store

log = logging.getLogger(__name__)


class VLLMPolicy(Policy):
    """`replicas` vLLM servers of `model` started on loopback, or the servers at `urls`.

    `transport` is `auto` (LoRA adapters with `lora_rank > 0`, NCCL on GPUs, files otherwise),
    `file`, `lora` or `nccl`. `vllm_args` are passed to every started server. `adapters` (role -> agent-name
    pattern, with `lora_rank > 0`): one adapter per role, each agent's calls served by its role's.
    """

    def __init__(
        self,
        store: Store,
        engine: Engine | None = None,
        model: str | None = None,
        *,
        replicas: int = 1,
        urls: Sequence[str] = (),
        transport: str = "auto",
        vllm_args: Sequence[str] = (),
        **options: Unpack[PolicyOptions],
    ) -> None:
        if replicas < 1 and not urls:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        # the trainer's copy samples nothing: fp32 only, no bf16 sampling copy
        super().__init__(store, engine or Engine(model, sampling_dtype=torch.float32), model, **options)
        if self.engine.name in self.adapters:
            raise ValueError(
                f"role {self.engine.name!r} has the name the vLLM servers serve the base model under: rename the role"
            )
        self.model_path = self.engine.source  # the trainer's model, also when only its engine was given
        self.replicas, self.urls, self.transport_kind, self.vllm_args = replicas, list(urls), transport, list(vllm_args)
        self.servers: list[VLLMServer] = []
        self.pool: ReplicaPool | None = None
        self.transport: WeightTransport | None = None
        self.capabilities = ""
        self.last_sync_seconds = 0.0
        self._client = httpx.Client(timeout=300.0)

    def start(self) -> None:
        from agentgrad.gateway import Gateway

        try:
            if self.urls:
                self.servers = attach_servers(self.urls)
            else:
                self.servers = start_servers(
                    self.model_path,
                    self.engine.name,
                    self.replicas,
                    lora_rank=self.lora_rank,
                    max_loras=max(len(self.adapters), 1),
                    extra_args=self.vllm_args,
                )
            urls = [s.url for s in self.servers]
            self.transport = make_transport(
                self.transport_kind, urls, lora=self.lora_rank > 0, adapters=list(self.adapters)
            )
            self.capabilities = report_capabilities(self.servers, self.transport.name)
            log.info(self.capabilities)
            missing = sorted({r for s in self.servers for r in s.missing(self.transport.name)})
            if missing:
                raise RuntimeError(
                    f"the vLLM servers lack {', '.join(missing)}, which weight transport "
                    f"{self.transport.name!r} needs; {self.capabilities}"
                )
            served = LORA_NAME if self.lora_rank > 0 and not self.adapters else None
            parser = tool_parser_of(str(self.model_path), () if self.urls else self.vllm_args)
            backends = [
                Backend(
                    url=s.api_url,
                    system="vllm",
                    model=served or self.engine.name,
                    tool_parser=parser,
                    first_byte_timeout_s=TRAINED_ENGINE_TIMEOUT_SECONDS,
                    timeout_s=TRAINED_ENGINE_TIMEOUT_SECONDS,
                )
                for s in self.servers
            ]
            self.pool = self._replica_pool(backends)
            self.sync()  # the servers start from the files on disk; serve the trainer's weights from the start
            self.serve_gateway(
                Gateway(self.store, routers={self.engine.name: self.pool}, default=self.pool, token=self.listen.token)
            )
        except BaseException:
            self.stop()
            raise

    def _replica_pool(self, backends: list[Backend]) -> ReplicaPool:
        """The gateway's pool of the servers: with adapters, each call under its agent's adapter (or the base)."""
        if not self.adapters:
            return ReplicaPool(self.engine.name, backends, version=self.engine.version)
        assert self.engine.adapters is not None  # LocalPolicy served them on the trainer's engine
        models = {role: role for role in self.adapters} | {BASE_ADAPTER: self.engine.name}
        return ReplicaPool(
            self.engine.name,
            backends,
            version=self.engine.version,
            adapters=models,
            resolve=self.engine.adapters.resolve,
        )

    def served_here(self) -> ReplicaPool | None:
        return None  # the servers sample from their own copy, which `sync` replaces

    def stop(self) -> None:
        super().stop()
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        for server in self.servers:
            server.stop()
        self.servers = []

    def sync(self) -> float:
        """Serve the trainer's current weights (`engine.version`) from the next call on; returns the seconds taken."""
        if self.pool is None or self.transport is None:
            raise RuntimeError("start the vLLM policy before syncing its weights")
        began = time.perf_counter()
        version = self.engine.version
        with self.attempts_ended(self.pool), self.pool.exclusive():
            for server in self.servers:
                self._post(server, "/pause", params={"mode": "wait"})
            try:
                in_own_thread(self.transport.push, self.model, version)  # no OpenMP pool left here (`threads.py`)
                if self.transport.name != "lora":  # an adapter has its own cache entries
                    for server in self.servers:
                        self._post(server, "/reset_prefix_cache")
            finally:
                for server in self.servers:
                    self._post(server, "/resume")
            self.pool.version = version
        self.last_sync_seconds = time.perf_counter() - began
        return self.last_sync_seconds

    def train_beside_serving(self) -> None:
        """Nothing to copy: the vLLM servers sample while the trainer's weights update; syncs wait for the
        attempts mid-flight (`attempts_ended`)."""
        self.between_attempts = True

    def _post(self, server: VLLMServer, route: str, **kwargs: Any) -> None:
        response = self._client.post(server.url + route, **kwargs)
        if response.status_code != 200:
            raise RuntimeError(
                f"vLLM at {server.url}: POST {route} answered {response.status_code}: {response.text[:300]}"
            )
