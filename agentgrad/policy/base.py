"""What every policy is: the weights being trained, the engine copy they live in, and the gateway agents call.

`Policy` holds what the built-in engine and vLLM share: the trainer's copy of the weights (LoRA, one adapter per
role, a copy beside serving for asynchronous training), checkpoints of them, and the gateway that records every
call. Its two kinds are siblings: `LocalPolicy` (local.py) serves the engine itself; `VLLMPolicy` (vllm.py) serves
vLLM servers and pushes the weights to them at `sync()`. Algorithms, updates and checkpoints use this surface only.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from agentgrad.engine import Engine
from agentgrad.engine.threads import in_own_thread
from agentgrad.gateway.replicas import ATTEMPT_WAIT_SECONDS
from agentgrad.policy.checkpoints import MANIFEST, TRAINER_STATE, written_atomically
from agentgrad.serving import Listen, ServerThread
from agentgrad.store import Store
from agentgrad.store.base import WAIT_POLL_SECONDS
from agentgrad.types import LLM, RolloutStatus

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from agentgrad.gateway import SamplingPlan
    from agentgrad.gateway.replicas import ReplicaPool

log = logging.getLogger(__name__)


class PolicyOptions(TypedDict, total=False):
    """What every policy takes besides its store, engine and model (`Policy`'s docstring says what each does)."""

    lora_rank: int
    lora_alpha: int
    lora_targets: list[str] | str
    gateway_port: int
    listen: Listen | None
    adapters: Mapping[str, str] | None
    default_adapter: str | None
    attempt_wait_s: float
    clock: Callable[[], float]


class Policy(ABC):
    """The weights an algorithm trains, served to the agent through a gateway on `gateway_port`.

    `engine` (or a new one loading `model`) holds the trainer's copy. The gateway binds `listen.host` (loopback by
    default) and its URL (`llm()`) names `listen`'s advertised address. With `lora_rank > 0` only low-rank adapters
    train (peft); with `adapters` (role name -> agent-name pattern) one adapter per role on the one base, each
    agent's calls served by its role's (`agentgrad.engine.adapters`), an agent no pattern matches by
    `default_adapter`'s, else by the base. `publish()` holds new calls and lets those in flight finish before new
    weights serve, so no call mixes versions; `train_beside_serving()` (asynchronous training) has the update
    train a copy while sampling goes on. `clock` is what `attempt_wait_s` is measured on (a test moves its own).
    """

    def __init__(
        self,
        store: Store,
        engine: Engine | None = None,
        model: str | None = None,
        *,
        lora_rank: int = 0,
        lora_alpha: int = 16,
        lora_targets: list[str] | str = "all-linear",
        gateway_port: int = 0,
        listen: Listen | None = None,
        adapters: Mapping[str, str] | None = None,
        default_adapter: str | None = None,
        attempt_wait_s: float = ATTEMPT_WAIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not attempt_wait_s >= 0:
            raise ValueError(f"attempt_wait_s must be >= 0 seconds (0: swap between calls only), got {attempt_wait_s}")
        self.store = store
        self.attempt_wait_s = attempt_wait_s
        self.clock = clock
        self.between_attempts = False  # publish waits for attempts mid-flight (asynchronous training)
        self.straddling: list[str] = []  # rollouts still mid-flight when the last publish stopped waiting
        self.gateway_port = gateway_port
        self.listen = listen or Listen()
        self.engine = engine or Engine(model, frozen_base=lora_rank > 0)  # LoRA: the base once, in the serving dtype
        self.lora_rank = lora_rank
        self.adapters = dict(adapters or {})
        if self.adapters:
            from agentgrad.engine.adapters import serve_adapters

            if lora_rank < 1:
                raise ValueError("one adapter per role needs LoRA: set lora_rank to 1 or more (8, say)")
            in_own_thread(  # no OpenMP pool left in this thread (`engine.threads.in_own_thread`)
                serve_adapters,
                self.engine,
                self.adapters,
                rank=lora_rank,
                alpha=lora_alpha,
                targets=lora_targets,
                default=default_adapter,
            )
        elif default_adapter is not None:
            raise ValueError(f"default adapter {default_adapter!r} names one of the adapters: give adapters= too")
        elif lora_rank > 0:
            from peft import LoraConfig, get_peft_model

            self.engine.freeze_base()  # a given engine's weights too: on a GPU, no fp32 copy beside the served one
            adapted = in_own_thread(
                get_peft_model,
                self.engine.model,
                LoraConfig(r=lora_rank, lora_alpha=lora_alpha, target_modules=lora_targets, lora_dropout=0.0),
            )
            self.engine.replace_model(adapted, merge=True)  # a CPU samples from a packed twin, the adapter merged
        self._servers: list[ServerThread] = []
        self.gateway_url: str | None = None
        self.gateway: Any = None
        self.sampling: SamplingPlan | None = None
        self._trainer: torch.nn.Module | None = None  # the copy the update trains, when it trains beside serving

    # ------------------------------------------------------------------ serving: what each kind does its own way

    @abstractmethod
    def start(self) -> None:
        """Start serving the weights and the gateway in front of them."""

    @abstractmethod
    def sync(self) -> float:
        """Have every server sample from the trainer's current weights; returns the seconds it took."""

    @abstractmethod
    def served_here(self) -> ReplicaPool | None:
        """The gateway's pool of the engine that samples from these very weights (a publish holds it); None when
        servers elsewhere sample (their weights change at `sync`)."""

    def stop(self) -> None:
        for server in reversed(self._servers):
            server.stop()
        self._servers.clear()

    def __enter__(self) -> Policy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_gateway(self, gateway: Any) -> None:
        """Serve `gateway` at `listen.host`, `gateway_port`: what agents call, at the advertised address."""
        host = self.listen.host
        try:
            server = ServerThread(gateway, host=host, port=self.gateway_port, advertise=self.listen.advertise).start()
        except RuntimeError as exc:
            raise RuntimeError(
                f"the policy's gateway cannot listen on {host}:{self.gateway_port} ({exc}); "
                "give the Trainer another gateway_port (0: any free port)"
            ) from None
        self._servers.append(server)
        self.gateway_url = server.url
        self.gateway = gateway
        gateway.set_sampling(self.sampling)

    def set_sampling(self, plan: SamplingPlan | None) -> None:
        """Have the gateway apply the trainer's sampling (per rollout mode) to every call of a rollout."""
        self.sampling = plan
        if self.gateway is not None:
            self.gateway.set_sampling(plan)

    def llm(self, **sampling_parameters: Any) -> LLM:
        """The resource an agent calls: the gateway, routed per attempt by the runner."""
        if self.gateway_url is None:
            raise RuntimeError("start the policy before asking for its LLM resource")
        return LLM(
            base_url=self.gateway_url + "/v1",
            model=self.engine.name,
            proxied=True,
            sampling_parameters=sampling_parameters,
        )

    @property
    def version(self) -> int:
        """The version of the weights served now (every span names the version that sampled it)."""
        return self.engine.version

    # ------------------------------------------------------------------ the trainer's copy

    @property
    def model(self) -> PreTrainedModel:
        """The weights the update trains (and checkpoints save): the engine's, or the copy beside them."""
        return self._trainer if self._trainer is not None else self.engine.model

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def train_beside_serving(self) -> None:
        """Train a copy of the weights from now on, so generation never waits for an update (asynchronous
        training); `publish()` copies it into the engine between calls. Costs one more copy of the weights."""
        self.between_attempts = True
        if self._trainer is None:
            with self.engine.training() as model:
                self._trainer = in_own_thread(copy.deepcopy, model)
            self._trainer.eval()

    @contextmanager
    def training(self) -> Iterator[torch.nn.Module]:
        """The model to update: the copy beside serving (generation goes on), else the engine's (generation waits)."""
        if self._trainer is None:
            with self.engine.training() as model:
                yield model
            return
        self._trainer.train()
        try:
            yield self._trainer
        finally:
            self._trainer.eval()

    def publish(self) -> int:
        """Serve the trained weights from the next call on; calls in flight finish on the version they began with
        (training beside serving: attempts mid-flight finish on it too, within `attempt_wait_s`)."""
        pool = self.served_here()
        if pool is None:
            return self._publish()
        with self.attempts_ended(pool), pool.exclusive():
            version = self._publish()
            pool.version = version
        return version

    def deliver(self, full_state: Mapping[str, torch.Tensor]) -> None:
        """New full weights (a sharded update's, gathered on rank 0) into the trainer's copy, then served."""
        with self.training() as model:
            missing, unexpected = model.load_state_dict(dict(full_state), strict=False)
            real_missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to the embeddings
            if real_missing or unexpected:
                raise ValueError(
                    f"the trained weights do not fit the served model: missing {real_missing[:3]}, "
                    f"unexpected {unexpected[:3]}"
                )
        self.publish()  # between calls: those in flight finish on the version they began with
        self.sync()

    @contextmanager
    def attempts_ended(self, pool: ReplicaPool) -> Iterator[None]:
        """Under `between_attempts`: hold new attempts' first calls and wait, up to `attempt_wait_s`, for the
        attempts that called on the served weights to end, so the swap inside lands between attempts.

        Those still running when the wait gives up are left in `straddling`: their later calls get the new
        weights, and training drops them (`fresh_groups` counts them). Called from a thread with an event
        loop running (a resume inside the algorithm's loop), it cannot block on the store and swaps between
        calls only.
        """
        if not self.between_attempts or _loop_running():
            if self.between_attempts:
                log.debug("publish from a thread running an event loop: the weights swap between calls only")
            yield
            return
        with pool.attempts_held() as started:
            self.straddling = []
            if started:
                self.straddling = asyncio.run(still_running(self.store, started, self.attempt_wait_s, self.clock))
            if self.straddling:
                log.warning(
                    "%d attempt(s) still running after %g s will straddle the weights swap; training drops them",
                    len(self.straddling),
                    self.attempt_wait_s,
                )
            yield

    def _publish(self) -> int:
        if self._trainer is not None:
            with self.engine.training() as served, torch.no_grad():
                for serving, trained in zip(served.parameters(), self._trainer.parameters()):
                    serving.copy_(trained)
        return self.engine.publish()

    # ------------------------------------------------------------------ checkpoints

    def save(self, directory: Path, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> Path:
        """Weights (an HF folder, or the adapters), tokenizer, optimizer and `state`, written atomically."""
        with written_atomically(directory) as partial:
            self.model.save_pretrained(partial)
            self.engine.tokenizer.save_pretrained(partial)
            torch.save({"optimizer": optimizer.state_dict(), "state": state}, partial / TRAINER_STATE)
            self.write_manifest(partial, state)
        return directory

    def write_manifest(self, folder: Path, state: Mapping[str, Any]) -> None:
        """`MANIFEST` of a checkpoint: the served version its weights had, and the run's `state` (JSON, to read)."""
        (folder / MANIFEST).write_text(json.dumps({"engine_version": self.engine.version, **state}, default=str))

    def load(self, directory: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Restore what `save` wrote; the weights serve from the next request (and reach the servers)."""
        from safetensors.torch import load_file

        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"checkpoint {directory} has no .safetensors weights")
        weights: dict[str, torch.Tensor] = {}
        for file in files:
            weights.update(load_file(file))
        with self.training() as model:
            if self.lora_rank > 0:
                from peft import set_peft_model_state_dict

                set_peft_model_state_dict(model, weights)
            else:
                missing, unexpected = model.load_state_dict(weights, strict=False)
                real_missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to the embeddings
                if real_missing or unexpected:
                    raise ValueError(
                        f"checkpoint {directory} does not fit the model: missing {real_missing[:3]}, "
                        f"unexpected {unexpected[:3]}"
                    )
        saved = torch.load(directory / TRAINER_STATE, weights_only=False)
        optimizer.load_state_dict(saved["optimizer"])
        self.resume_version(directory)
        self.publish()
        self.sync()
        return dict(saved["state"])

    def resume_version(self, directory: Path) -> None:
        """Have the next publish name the restored weights by the version they had when `directory` was saved,
        so the spans of the rollouts sampled before the restart (queued groups a resumed run trains) keep a
        true staleness. Only a fresh engine (a new process) is renumbered: an engine that already served
        those numbers for other weights keeps counting up (its prefix cache is keyed by version)."""
        manifest = directory / MANIFEST
        saved = json.loads(manifest.read_text()).get("engine_version") if manifest.exists() else None
        if isinstance(saved, int) and self.engine.version < saved:
            self.engine.version = saved - 1


async def still_running(
    store: Store, rollout_ids: Sequence[str], timeout_s: float, clock: Callable[[], float] = time.monotonic
) -> list[str]:
    """Wait up to `timeout_s` (on `clock`) for the given rollouts' current attempts to end (the rollout no longer
    `running`: finished, or requeuing for another attempt); the ones still running then."""
    deadline = clock() + timeout_s
    while True:
        rollouts = await store.query_rollouts(rollout_ids=rollout_ids)
        running = [r.rollout_id for r in rollouts if r.status is RolloutStatus.RUNNING]
        left = deadline - clock()
        if not running or left <= 0:
            return running
        try:  # wakes as soon as one finishes in this process; looks again after WAIT_POLL_SECONDS otherwise
            await asyncio.wait_for(store.wait_for_rollouts(running), min(WAIT_POLL_SECONDS, left))
        except TimeoutError:
            pass


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
