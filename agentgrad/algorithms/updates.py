"""Where a training step's update runs: one object, chosen once when a run starts (`open_update`).

- `LocalUpdate`: in this process, one AdamW over the policy's trainable weights.
- `ShardedUpdate`: over a training group's FSDP2 ranks (`train_processes > 1`, torchrun, Ray actors).
- `RoleUpdate`: one LoRA adapter per agent role on one frozen base, each with its own AdamW and its part of the batch.

Each runs the algorithm's loss (`Train`: GRPO's clipped surrogate, SFT's NLL, on the step's batch), serves the new
weights (`publish`, then `sync` to vLLM), and saves, restores and rescales its optimizer for checkpoints and
rollbacks. The training loop (loop.py) sees only this surface, whatever runs underneath.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from agentgrad.algorithms.config import LoopConfig
from agentgrad.distributed.fsdp import ShardedPolicy
from agentgrad.distributed.group import TrainingGroup, open_group
from agentgrad.engine.adapters import adapter_parameters, save_adapter
from agentgrad.engine.training import checkpoint_activations
from agentgrad.policy.base import Policy
from agentgrad.policy.checkpoints import TRAINER_STATE, written_atomically


class Train(Protocol):
    """The algorithm's optimizer step(s) on one step's training data; returns its statistics (`loss`, ...)."""

    def __call__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        data: Any,
        *,
        pad_token_id: int,
        reference: torch.nn.Module | None,
    ) -> dict[str, float]: ...


ShardedTrain = Callable[[ShardedPolicy, Any, int], dict[str, float]]
"""The same on one rank of a training group: (this rank's `ShardedPolicy`, the whole step's data, pad id); each
rank takes its share and the ranks' statistics are reduced to the one-process figures."""


WarmStart = Callable[[torch.nn.Module, torch.optim.Optimizer, int], dict[str, float]]
"""Optimizer steps before the first step (`LocalUpdate.warm_start`): (the model, its own AdamW, pad id)."""


class Update(Protocol):
    """What the loop asks of an update: a step, checkpoints, and the learning rate a rollback lowers."""

    learning_rate: float

    def step(self, data: Any) -> dict[str, float]: ...

    def save(self, directory: Path, state: dict[str, Any]) -> None: ...

    def load(self, directory: Path) -> dict[str, Any]: ...

    def close(self) -> None: ...


class LocalUpdate:
    """The update in this process: AdamW over the policy's trainable weights (and a frozen reference for a KL
    term, `reference=True`); after each step the engine serves the new weights and the policy syncs them."""

    def __init__(self, policy: Policy, cfg: LoopConfig, train: Train, *, reference: bool = False) -> None:
        self.policy, self.cfg, self.train = policy, cfg, train
        if cfg.max_staleness is not None:
            policy.train_beside_serving()  # asynchronous: generation goes on from the published weights
        self.optimizer = torch.optim.AdamW(
            policy.trainable_parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
        )
        # under LoRA the base weights are the reference (the adapter disabled): no copy
        self.reference = _frozen_copy(policy.model) if reference and policy.lora_rank == 0 else None
        if cfg.gradient_checkpointing:  # less memory for ~1/3 more compute; training mode only, sampling unchanged
            checkpoint_activations(policy.model)

    def step(self, data: Any) -> dict[str, float]:
        """One step's update; its statistics, with `sync_seconds` (new weights into the engine and servers)."""
        with self.policy.training() as model:
            pad = self.policy.engine.tokenizer.pad_token_id
            stats = self.train(model, self.optimizer, data, pad_token_id=pad, reference=self.reference)
        return {**stats, "sync_seconds": _served(self.policy)}

    def warm_start(self, train: WarmStart, learning_rate: float) -> dict[str, float]:
        """`train` with an AdamW of its own (a warm start's SFT before the first step: its own learning rate, no
        moments carried into the RL steps), then the engine serves the new weights; its statistics."""
        optimizer = torch.optim.AdamW(self.policy.trainable_parameters(), lr=learning_rate, weight_decay=0.0)
        with self.policy.training() as model:
            stats = train(model, optimizer, self.policy.engine.tokenizer.pad_token_id)
        return {**stats, "sync_seconds": _served(self.policy)}

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = value

    def save(self, directory: Path, state: dict[str, Any]) -> None:
        self.policy.save(directory, self.optimizer, state)

    def load(self, directory: Path) -> dict[str, Any]:
        return self.policy.load(directory, self.optimizer)

    def close(self) -> None:
        pass


class ShardedUpdate:
    """The update sharded over a training group (FSDP2): every rank updates its shard, then rank 0's full
    weights go to the engine and the servers (`Policy.deliver`)."""

    def __init__(self, group: TrainingGroup, policy: Policy, cfg: LoopConfig, train: ShardedTrain) -> None:
        self.group, self.policy, self.train = group, policy, train
        self._learning_rate = cfg.learning_rate
        if cfg.max_staleness is not None:  # asynchronous: new weights land in a copy, published between attempts
            policy.train_beside_serving()

    def step(self, data: Any) -> dict[str, float]:
        stats = self.group.call("run", self.train, data, self.policy.engine.tokenizer.pad_token_id)
        began = time.perf_counter()
        self.policy.deliver(self.group.call("full_state_dict"))
        return {**stats, "sync_seconds": time.perf_counter() - began}

    @property
    def learning_rate(self) -> float:
        return self._learning_rate

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self.group.call("set_learning_rate", value)
        self._learning_rate = value

    def save(self, directory: Path, state: dict[str, Any]) -> None:
        """The ranks' shards (loadable at any world size, on a filesystem every rank sees), rank 0's full weights
        as a Hugging Face folder, the tokenizer, and the run's state."""
        with written_atomically(directory) as partial:
            self.group.call("save", partial)
            self.policy.engine.tokenizer.save_pretrained(partial)
            torch.save({"state": state, "sharded": True}, partial / TRAINER_STATE)
            self.policy.write_manifest(partial, {"world_size": self.group.world_size, **state})

    def load(self, directory: Path) -> dict[str, Any]:
        """Restore the shards (any world size) and serve their weights under the version they had when saved."""
        self.group.call("load", directory)
        self.policy.resume_version(directory)
        self.policy.deliver(self.group.call("full_state_dict"))
        state: dict[str, Any] = torch.load(directory / TRAINER_STATE, weights_only=False)["state"]
        self._learning_rate = float(self.group.call("learning_rate"))
        return state

    def close(self) -> None:
        self.group.close()


ROLE_OPTIMIZER = "optimizer.pt"
"""Each role's optimizer state in its subfolder of a checkpoint."""


class RoleUpdate:
    """Each role's adapter updated on its own part of the step (`data`: role -> that role's data) with its own
    AdamW; the base stays frozen. Checkpoints hold a subfolder per role (a PEFT adapter folder and the role's
    optimizer state)."""

    def __init__(self, policy: Policy, cfg: LoopConfig, train: Train) -> None:
        self.policy, self.train = policy, train
        self.roles = list(policy.adapters)
        if cfg.max_staleness is not None:
            policy.train_beside_serving()  # asynchronous: the adapters train in a copy, published between attempts
        self.optimizers = {
            role: torch.optim.AdamW(
                adapter_parameters(policy.model, role), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
            )
            for role in self.roles
        }
        if cfg.gradient_checkpointing:
            checkpoint_activations(policy.model)

    def step(self, data: Mapping[str, Any]) -> dict[str, float]:
        """Update each role's adapter on its data; statistics as `<role>/<name>`, a token-weighted `loss`,
        and `sync_seconds`."""
        stats: dict[str, float] = {}
        losses: list[tuple[float, int]] = []
        with self.policy.training() as model:
            pad = self.policy.engine.tokenizer.pad_token_id
            for role in self.roles:
                part = data.get(role) or []
                if not part:
                    continue
                model.set_adapter(role)  # type: ignore[operator]  # its weights alone take gradients
                role_stats = self.train(model, self.optimizers[role], part, pad_token_id=pad, reference=None)
                stats |= {f"{role}/{name}": value for name, value in role_stats.items()}
                losses.append((role_stats["loss"], sum(t.response_length for t, _ in part)))
        if losses:
            stats["loss"] = sum(loss * tokens for loss, tokens in losses) / max(sum(t for _, t in losses), 1)
        return {**stats, "sync_seconds": _served(self.policy)}

    @property
    def learning_rate(self) -> float:
        return float(next(iter(self.optimizers.values())).param_groups[0]["lr"])

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        for optimizer in self.optimizers.values():
            for group in optimizer.param_groups:
                group["lr"] = value

    def save(self, directory: Path, state: dict[str, Any]) -> None:
        """`directory/<role>/` for each role (loadable with `PeftModel.from_pretrained`), the tokenizer, and `state`."""
        with written_atomically(directory) as partial:
            for role in self.roles:
                save_adapter(self.policy.model, role, partial / role)
                torch.save({"optimizer": self.optimizers[role].state_dict()}, partial / role / ROLE_OPTIMIZER)
            self.policy.engine.tokenizer.save_pretrained(partial)
            torch.save({"state": state, "roles": self.roles}, partial / TRAINER_STATE)
            self.policy.write_manifest(partial, {"roles": self.roles, **state})

    def load(self, directory: Path) -> dict[str, Any]:
        """Restore every role's adapter and optimizer from `save`'s folder; they serve from the next call."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        saved = torch.load(directory / TRAINER_STATE, weights_only=False)
        if sorted(saved.get("roles", [])) != sorted(self.roles):
            raise ValueError(
                f"checkpoint {directory} holds the roles {saved.get('roles')}, this run trains {self.roles}: "
                "resume with the same roles, or start in another checkpoint_dir"
            )
        with self.policy.training() as model:
            for role in self.roles:
                weights = load_file(directory / role / "adapter_model.safetensors")
                set_peft_model_state_dict(model, weights, adapter_name=role)
                self.optimizers[role].load_state_dict(torch.load(directory / role / ROLE_OPTIMIZER)["optimizer"])
        self.policy.resume_version(directory)
        _served(self.policy)
        return dict(saved["state"])

    def close(self) -> None:
        pass


def open_update(
    policy: Policy,
    cfg: LoopConfig,
    launcher: Callable[..., TrainingGroup] | None,
    train: Train,
    sharded_train: ShardedTrain,
    *,
    reference: bool = False,
) -> LocalUpdate | ShardedUpdate | RoleUpdate:
    """One adapter per role when the policy serves several (`roles`); the sharded update when a training group is
    asked for (`train_processes > 1`, or torchrun); else the local one."""
    if policy.adapters:
        return RoleUpdate(policy, cfg, train)
    group = open_group(
        cfg.train_processes,
        policy.model,
        launcher,
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        kl_reference=reference,
    )
    if group is None:
        return LocalUpdate(policy, cfg, train, reference=reference)
    return ShardedUpdate(group, policy, cfg, sharded_train)


def _served(policy: Policy) -> float:
    """Serve the trained weights (publish, then sync to the servers); the seconds it took."""
    began = time.perf_counter()
    policy.publish()  # between calls: those in flight finish on the version they began with
    policy.sync()  # vLLM: the new weights reach the servers before the next rollout
    return time.perf_counter() - began


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    reference = copy.deepcopy(model)
    reference.requires_grad_(False)
    reference.eval()
    return reference
