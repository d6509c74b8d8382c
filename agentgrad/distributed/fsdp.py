"""One rank of a sharded policy update: the model under PyTorch FSDP2, its share of each step.

Every rank receives the whole step's batch, splits it by tokens with the same deterministic
rule (`split_by_tokens`), and runs the GRPO update of `agentgrad.algorithms` on its share
with the loss divided by the whole step's response-token count. FSDP's reduce-scatter is set to
sum rather than average the ranks' gradients, so the gradient, its global norm (clipping over
the sharded DTensors) and the AdamW step are those of one process over the whole batch. Every
rank makes the same number of forward/backward passes (an idle pass where its share ran out),
because each pass is a collective.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from agentgrad.adapters import Trajectory

SHARDED_STATE = "dcp"
"""Folder of a checkpoint holding the sharded model and optimizer (torch.distributed.checkpoint)."""


def backend_for(device: str) -> str:
    """NCCL between GPUs, gloo between CPUs."""
    return "nccl" if device.startswith("cuda") else "gloo"


def rank_device() -> str:
    """This rank's GPU (by LOCAL_RANK) when there are GPUs, else the CPU."""
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return f"cuda:{local}"
    return "cpu"


def split_by_tokens(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Indices of each rank's share: longest first to the rank with the fewest tokens (ties: lowest rank).

    Each share keeps the batch's order, so sequences sharing a prompt stay neighbours.
    """
    shares: list[list[int]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shares[rank].append(index)
        loads[rank] += lengths[index]
    return [sorted(share) for share in shares]


def idle_trajectory(pad_token_id: int) -> Trajectory:
    """Two padding tokens scored with zero weight: a rank with nothing left still joins the collectives."""
    return Trajectory(token_ids=[pad_token_id, pad_token_id], loss_mask=[0, 0], logprobs=[0.0, 0.0], prompt_length=1)


def clip_grad_norm(parameters: Sequence[torch.nn.Parameter], max_norm: float) -> float:
    """Clip to a global norm; with FSDP2's DTensor gradients the norm is reduced over the ranks first."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads)
    if hasattr(norm, "full_tensor"):  # a DTensor holding each rank's partial norm
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    value = float(norm)
    return value if math.isfinite(value) else float("nan")


def shard(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """`fully_shard` each decoder layer, then the root (embeddings, norm, head); gradients summed over ranks."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model.to(device)
    layers = getattr(getattr(model, "model", None), "layers", None)
    for layer in layers if layers is not None else []:
        fully_shard(layer)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # the loss is already normalized by the global token count
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no pre-multiplied sum)
    return model


class ShardedPolicy:
    """This rank's shard of the policy (and of a frozen reference for the KL term), with its AdamW.

    Build it on every rank of an initialized process group; rank 0's `model` weights are
    broadcast to the others, so they need only the architecture.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        learning_rate: float,
        weight_decay: float = 0.0,
        kl_reference: bool = False,
        device: str | None = None,
    ) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if not dist.is_initialized():
            raise RuntimeError(
                "ShardedPolicy needs torch.distributed initialized (torchrun, a Ray actor, or "
                "agentgrad.distributed.group.spawn_group)"
            )
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = device or rank_device()
        full = {k: v.detach().cpu() for k, v in model.state_dict().items()} if self.rank == 0 else {}
        self.reference = None
        if kl_reference:
            import copy

            self.reference = shard(copy.deepcopy(model), self.device).requires_grad_(False).eval()
        self.model = shard(model, self.device)
        set_model_state_dict(
            self.model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        )
        if self.reference is not None:  # the starting weights, shard by shard (no collective)
            with torch.no_grad():
                for frozen, trained in zip(self.reference.parameters(), self.model.parameters()):
                    frozen.copy_(trained)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=learning_rate, weight_decay=weight_decay
        )

    def share(self, lengths: Sequence[int]) -> tuple[list[int], int]:
        """This rank's indices of a step's sequences (balanced by tokens), and the most any rank got."""
        shares = split_by_tokens(lengths, self.world_size)
        return shares[self.rank], max(len(s) for s in shares)

    def run(self, step: Callable[..., Any], *args: Any) -> Any:
        """`step(self, *args)` on this rank: an algorithm's sharded update, written beside its loss
        (`grpo.sharded_grpo_step`), so this module imports no algorithm."""
        self.model.train()
        return step(self, *args)

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def set_learning_rate(self, value: float) -> None:
        """Every parameter group's learning rate (a rollback lowers it)."""
        for group in self.optimizer.param_groups:
            group["lr"] = value

    # ------------------------------------------------------------------ weights out, checkpoints

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The full weights on rank 0's CPU (None elsewhere): what the serving side loads. A collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return cast("dict[str, torch.Tensor]", full) if self.rank == 0 else None  # a model's entries are tensors

    def save(self, directory: str | Path, tokenizer: Any = None) -> None:
        """Sharded model + optimizer under `directory/dcp` (loadable at any world size), and on rank 0
        a Hugging Face folder of the full weights (with `tokenizer`); the caller adds its own files."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        directory = Path(directory)
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(directory / SHARDED_STATE))
        full = self.full_state_dict()
        if self.rank == 0 and full is not None:
            export_hf(self.model, full, directory, tokenizer)
        dist.barrier()

    def load(self, directory: str | Path) -> None:
        """Restore what `save` wrote, whatever world size wrote it."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        sharded = Path(directory) / SHARDED_STATE
        if not sharded.exists():
            raise FileNotFoundError(
                f"{directory} has no {SHARDED_STATE}/ folder: it was not saved by a sharded update; "
                "resume it with train_processes=1, or start a new checkpoint_dir"
            )
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        loaded: dict[str, Any] = {"model": model_state, "optim": optim_state}
        dcp.load(loaded, checkpoint_id=str(sharded))
        set_state_dict(self.model, self.optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])


def export_hf(model: torch.nn.Module, full: dict[str, torch.Tensor], directory: Path, tokenizer: Any = None) -> None:
    """Write `full` as a Hugging Face folder (config + safetensors) that `Engine(directory)` serves."""
    from transformers import AutoModelForCausalLM

    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"cannot export a {type(model).__name__} as a Hugging Face folder: it has no `config`")
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    skeleton.load_state_dict(full, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        skeleton.tie_weights()
    directory.mkdir(parents=True, exist_ok=True)
    skeleton.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
