"""The training group: N ranks each holding a `ShardedPolicy`, driven from the algorithm's process.

The algorithm calls a method (`run` with its sharded step, `full_state_dict`, `save`, `load`) on the
group; every rank runs it (each call is a set of collectives, so all ranks must), and rank 0's
answer comes back. Three ways to have the ranks, one interface:

- `TorchrunGroup`: this process is rank 0 of a group `torchrun` started (single or multi node,
  its own rendezvous); the other ranks run `follow`, receiving each call by broadcast.
- `spawn_group(n, ...)`: N local processes (torch.multiprocessing), for `train_processes=N`
  on one machine.
- `agentgrad.train.ray_cluster.RayGroup`: N Ray actors.

The new weights reach the serving side through the policy (`Policy.deliver`): this package knows no policy.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from agentgrad.distributed.fsdp import ShardedPolicy, backend_for, rank_device
from agentgrad.serving import free_port

log = logging.getLogger(__name__)


class TrainingGroup(Protocol):
    world_size: int

    def call(self, method: str, *args: Any) -> Any:
        """Run `ShardedPolicy.method(*args)` on every rank; rank 0's result."""
        ...

    def close(self) -> None: ...


ModelFactory = Callable[[], torch.nn.Module]
"""Builds the model on a rank (rank 0's weights are broadcast over whatever it builds)."""


@dataclass
class FromConfig:
    """A picklable `ModelFactory`: the architecture from a transformers config, with `state` when given (rank 0)."""

    config: Any
    state: dict[str, torch.Tensor] | None = None

    def __call__(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(self.config)
        if self.state is not None:
            model.load_state_dict(self.state, strict=False)
            if getattr(self.config, "tie_word_embeddings", False):
                model.tie_weights()
        return model


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
    )


def init_from_env() -> None:
    """Join the process group described by the environment (torchrun's, or one we set): NCCL or gloo."""
    if not dist.is_initialized():
        dist.init_process_group(backend_for(rank_device()))


# ----------------------------------------------------------------------------- torchrun


_CONTROL: Any = None


def _control_group() -> Any:
    """A gloo group for the calls themselves (objects on CPU), whatever backend the update uses."""
    global _CONTROL
    if _CONTROL is None:
        _CONTROL = dist.new_group(backend="gloo")
    return _CONTROL


class TorchrunGroup:
    """Rank 0 under torchrun: each call is broadcast to the followers, then run here too."""

    def __init__(self, make_model: ModelFactory, **policy_options: Any) -> None:
        init_from_env()
        if dist.get_rank() != 0:
            raise RuntimeError(f"TorchrunGroup is rank 0's side; rank {dist.get_rank()} runs follow()")
        self.world_size = dist.get_world_size()
        self._broadcast(["__init__", policy_options])
        self.sharded = ShardedPolicy(make_model(), **policy_options)

    def _broadcast(self, message: list[Any]) -> None:
        dist.broadcast_object_list(message, src=0, group=_control_group())

    def call(self, method: str, *args: Any) -> Any:
        self._broadcast([method, args])
        return getattr(self.sharded, method)(*args)

    def close(self) -> None:
        self._broadcast(["close", ()])


def follow(make_model: ModelFactory) -> None:
    """A rank other than 0 under torchrun: build the shard, then run each call rank 0 broadcasts until it closes."""
    init_from_env()
    sharded: ShardedPolicy | None = None
    while True:
        message: list[Any] = [None, None]
        dist.broadcast_object_list(message, src=0, group=_control_group())
        method, args = message
        if method == "close":
            return
        if method == "__init__":
            sharded = ShardedPolicy(make_model(), **args)
            continue
        if sharded is None:
            raise RuntimeError(f"rank 0 called {method} before building the training group")
        getattr(sharded, method)(*args)


# ----------------------------------------------------------------------------- spawned processes


def _rank_main(
    rank: int, world_size: int, port: int, make_model: ModelFactory, options: dict[str, Any], calls: Any, results: Any
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    try:
        init_from_env()
        sharded = ShardedPolicy(make_model(), **options)
        results.put(("ready", None))
        while (call := calls.get()) is not None:
            method, args = call
            result = getattr(sharded, method)(*args)
            results.put(("ok", result if rank == 0 else None))
    except BaseException as exc:  # reported to the algorithm's process, which raises it
        import traceback

        results.put(("error", f"rank {rank}: {exc!r}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class SpawnedGroup:
    """N training processes on this machine (torch.multiprocessing, spawn); tensors come back in shared memory."""

    def __init__(self, world_size: int, config: Any, state: dict[str, torch.Tensor], **policy_options: Any) -> None:
        """`config` (a transformers config) on every rank, `state` (the starting weights) sent to rank 0 only."""
        import torch.multiprocessing as mp

        if world_size < 1:
            raise ValueError(f"a training group needs at least 1 process, got {world_size}")
        context = mp.get_context("spawn")
        self.world_size = world_size
        port = free_port()
        self._calls = [context.Queue() for _ in range(world_size)]
        self._results = [context.Queue() for _ in range(world_size)]
        self._processes = [
            context.Process(
                target=_rank_main,
                args=(
                    r,
                    world_size,
                    port,
                    FromConfig(config, state if r == 0 else None),
                    policy_options,
                    self._calls[r],
                    self._results[r],
                ),
                name=f"trainer-{r}",
                daemon=True,
            )
            for r in range(world_size)
        ]
        for process in self._processes:
            process.start()
        self._collect()

    def _collect(self) -> Any:
        answers = []
        for rank, queue in enumerate(self._results):
            while True:
                try:
                    answers.append(queue.get(timeout=1.0))
                    break
                except Exception:  # queue.Empty: is the rank still alive?
                    if not self._processes[rank].is_alive():
                        self.close()
                        raise RuntimeError(
                            f"training process {rank} died (exit code {self._processes[rank].exitcode})"
                        ) from None
        errors = [payload for status, payload in answers if status == "error"]
        if errors:
            self.close()
            raise RuntimeError("a training process failed:\n" + "\n".join(errors))
        return answers[0][1]

    def call(self, method: str, *args: Any) -> Any:
        for queue in self._calls:
            queue.put((method, args))
        return self._collect()

    def close(self) -> None:
        for queue, process in zip(self._calls, self._processes):
            if process.is_alive():
                queue.put(None)
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()


# ----------------------------------------------------------------------------- what an algorithm calls


def open_group(
    processes: int,
    model: torch.nn.Module,
    launcher: Callable[..., TrainingGroup] | None = None,
    **policy_options: Any,
) -> TrainingGroup | None:
    """The training group an algorithm updates through, or None to update in this process as before.

    Under torchrun (WORLD_SIZE > 1) it is every launched rank, whatever `processes` says;
    otherwise `processes > 1` local processes, or Ray actors when the Ray strategy passed its `launcher`.
    """
    import copy

    if launched_by_torchrun() and int(os.environ["WORLD_SIZE"]) > 1:
        return TorchrunGroup(lambda: copy.deepcopy(model).float(), **policy_options)
    if processes <= 1:
        return None
    if hasattr(model, "peft_config"):
        raise ValueError(
            "train_processes > 1 shards full weights; LoRA (lora_rank > 0) trains in one process: "
            "set train_processes=1 or lora_rank=0"
        )
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return (launcher or SpawnedGroup)(processes, model.config, state, **policy_options)
