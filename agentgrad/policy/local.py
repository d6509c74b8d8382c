"""The policy being trained: a local engine, served to the agent through the gateway.

GRPO and SFT both need the same things around the model: serve it over HTTP behind a gateway
that records every call into the store, hand the agent an `LLM` resource pointing there, and
save and restore checkpoints (weights, optimizer, progress) that resume a run.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentgrad.engine import Engine
from agentgrad.engine.threads import in_own_thread
from agentgrad.gateway.replicas import ATTEMPT_WAIT_SECONDS
from agentgrad.policy.checkpoints import TRAINER_STATE, written_atomically
from agentgrad.serving import ServerThread
from agentgrad.store import Store
from agentgrad.store.base import WAIT_POLL_SECONDS
from agentgrad.types import LLM, RolloutStatus

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from agentgrad.gateway import SamplingPlan
    from agentgrad.gateway.replicas import ReplicaPool

log = logging.getLogger(__name__)


class LocalPolicy:
    """`engine` (or a new one loading `model`), with an engine server and a gateway on loopback.

    The gateway listens on `gateway_port` (the trainer's, known before `fit` starts, so agents that
    build `OpenAI()` with no arguments can be pointed at it; 0: any free port) and serves the policy
    under every model name, so an agent needs no change of model name either. With
    `lora_rank > 0` only low-rank adapters are trained (peft); the engine then samples from the
    adapted model directly. `publish()` holds new calls and lets those in flight finish before the
    engine serves new weights, so no call mixes versions; `train_beside_serving()` (asynchronous
    training) has the update train a copy while the engine keeps sampling from the published weights.
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
        adapters: Mapping[str, str] | None = None,
        default_adapter: str | None = None,
        attempt_wait_s: float = ATTEMPT_WAIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`adapters` (role name -> agent-name pattern, with `lora_rank > 0`): one LoRA adapter per role on the
        one base, each agent's calls served by its role's (`agentgrad.engine.adapters`); an agent no pattern matches
        by `default_adapter`'s (one of them), else by the base model. `clock` is what
        `attempt_wait_s` is measured on (a test moves its own instead of sleeping)."""
        if not attempt_wait_s >= 0:
            raise ValueError(f"attempt_wait_s must be >= 0 seconds (0: swap between calls only), got {attempt_wait_s}")
        self.store = store
        self.attempt_wait_s = attempt_wait_s
        self.clock = clock
        self.between_attempts = False  # publish waits for attempts mid-flight (asynchronous training)
        self.straddling: list[str] = []  # rollouts still mid-flight when the last publish stopped waiting
        self.gateway_port = gateway_port
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
            self.engine.replace_model(adapted)
        self._servers: list[ServerThread] = []
        self.gateway_url: str | None = None
        self.gateway: Any = None
        self.sampling: SamplingPlan | None = None
        self.calls: ReplicaPool | None = None  # the engine's one replica behind the gateway: held during a publish
        self._trainer: torch.nn.Module | None = None  # the copy the update trains, when it trains beside serving

    @property
    def model(self) -> PreTrainedModel:
        """The weights the update trains (and checkpoints save): the engine's, or the copy beside them."""
        return self._trainer if self._trainer is not None else self.engine.model

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
        if self.calls is None:
            return self._publish()
        with self.attempts_ended(self.calls), self.calls.exclusive():
            version = self._publish()
            self.calls.version = version
        return version

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

    def start(self) -> None:
        from agentgrad.engine.server import create_engine_app
        from agentgrad.gateway import Backend, Gateway
        from agentgrad.gateway.replicas import ReplicaPool
        from agentgrad.gateway.upstreams import TRAINED_ENGINE_TIMEOUT_SECONDS as LIMIT

        engine_server = ServerThread(create_engine_app(self.engine)).start()
        self._servers.append(engine_server)
        backend = Backend(
            url=engine_server.url + "/v1",
            model=self.engine.name,
            system="agentgrad",
            first_byte_timeout_s=LIMIT,
            timeout_s=LIMIT,
        )
        self.calls = ReplicaPool(self.engine.name, [backend], version=self.engine.version)
        self.serve_gateway(Gateway(self.store, routers={self.engine.name: self.calls}, default=self.calls))

    def serve_gateway(self, gateway: Any) -> None:
        """Serve `gateway` on loopback at `gateway_port`: what agents call."""
        try:
            server = ServerThread(gateway, port=self.gateway_port).start()
        except RuntimeError as exc:
            raise RuntimeError(
                f"the policy's gateway cannot listen on 127.0.0.1:{self.gateway_port} ({exc}); "
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

    def stop(self) -> None:
        for server in reversed(self._servers):
            server.stop()
        self._servers.clear()

    def __enter__(self) -> LocalPolicy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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

    def sync(self) -> float:
        """Nothing to move: the engine serves what `engine.publish()` made current (a vLLM policy copies)."""
        return 0.0

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    # ------------------------------------------------------------------ checkpoints

    def save(self, directory: Path, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> Path:
        """Weights (an HF folder, or the adapters), tokenizer, optimizer and `state`, written atomically."""
        with written_atomically(directory) as partial:
            self.model.save_pretrained(partial)
            self.engine.tokenizer.save_pretrained(partial)
            torch.save({"optimizer": optimizer.state_dict(), "state": state}, partial / TRAINER_STATE)
            (partial / "agentgrad.json").write_text(
                json.dumps({"engine_version": self.engine.version, **state}, default=str)
            )
        return directory

    def load(self, directory: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Restore what `save` wrote; the engine serves the restored weights from the next request."""
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
        return saved["state"]

    def resume_version(self, directory: Path) -> None:
        """Have the next publish name the restored weights by the version they had when `directory` was saved,
        so the spans of the rollouts sampled before the restart (queued groups a resumed run trains) keep a
        true staleness. Only a fresh engine (a new process) is renumbered: an engine that already served
        those numbers for other weights keeps counting up (its prefix cache is keyed by version)."""
        manifest = directory / "agentgrad.json"
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
