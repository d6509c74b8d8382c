"""Checkpoints of a training run: `step-N` folders, each written atomically, the newest few kept, and the one that
validated best kept too.

A checkpoint holds the weights (an HF folder, the adapters, or FSDP shards), the tokenizer and
`trainer_state.pt` (optimizer and progress); `latest_checkpoint` is where a run resumes; `BestCheckpoint` says
which one to serve.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agentgrad.distributed.group import TrainingGroup

TRAINER_STATE = "trainer_state.pt"
"""A checkpoint's trainer state: optimizer and the run's progress (torch.save)."""
MANIFEST = "agentgrad.json"
"""A checkpoint's manifest: the run's progress and the served weights version, as JSON anyone can read."""
TRAINER_FILES = (TRAINER_STATE, MANIFEST)
"""What a checkpoint holds for the trainer only: left out of an export."""


@contextmanager
def written_atomically(directory: Path) -> Iterator[Path]:
    """A fresh `<directory>.partial` to write into, renamed to `directory` once the block succeeds."""
    partial = directory.with_name(directory.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    yield partial
    if directory.exists():
        shutil.rmtree(directory)
    partial.rename(directory)


def complete_checkpoints(directory: Path | None) -> list[Path]:
    """The complete `step-N` folders under `directory`, oldest first (a `.partial` one is still being written)."""
    if directory is None or not directory.exists():
        return []
    steps = [
        p
        for p in directory.glob("step-*")
        if p.is_dir() and not p.name.endswith(".partial") and (p / TRAINER_STATE).exists()
    ]
    return sorted(steps, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(directory: Path | None) -> Path | None:
    """The newest complete `step-N` folder under `directory`, if any."""
    steps = complete_checkpoints(directory)
    return steps[-1] if steps else None


def prune_checkpoints(directory: Path, keep: int, spare: str | Path | None = None) -> list[Path]:
    """Delete all but the `keep` newest complete checkpoints (`keep` 0: delete none), never `spare` (the best one);
    returns the deleted ones.

    A checkpoint of a 135M model with its AdamW state is about 1.6 GB, so a run saving every step
    would otherwise fill a laptop's disk.
    """
    if keep < 0:
        raise ValueError(f"keep_checkpoints must be >= 0 (0 keeps all), got {keep}")
    spared = Path(spare).resolve() if spare is not None else None
    old = [p for p in (complete_checkpoints(directory)[:-keep] if keep else []) if p.resolve() != spared]
    for path in old:
        shutil.rmtree(path)
    return old


@dataclass
class BestCheckpoint:
    """The saved checkpoint that validated best: each checkpoint saved at a validated step is scored by that
    validation's figure (`metric`, higher is better; a tie goes to the earlier step). A checkpoint of a step
    without a validation is no candidate. Kept in `trainer_state.pt` (`state`) so a resumed run knows it."""

    metric: str = "val/accuracy"
    path: str | None = None
    step: int | None = None
    value: float | None = None

    def consider(self, path: str | Path, step: int, value: float | None) -> bool:
        """Take the checkpoint at `path` (saved at `step`, validated at `value`) if it beats the best; returns
        whether it did."""
        if value is None or (
            self.value is not None and (value < self.value or (value == self.value and step >= (self.step or 0)))
        ):
            return False
        self.path, self.step, self.value = str(path), step, float(value)
        return True

    def state(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def restored(cls, state: Mapping[str, object] | None, metric: str = "val/accuracy") -> BestCheckpoint:
        """The best of a checkpoint's `state()` when its folder still exists, else none yet."""
        if not state or not state.get("path") or not Path(str(state["path"])).is_dir():
            return cls(metric)
        return cls(**{**state, "metric": metric})  # type: ignore[arg-type]

    def figures(self) -> dict[str, float]:
        """What a run record says of it: `{metric: value, "step": step}` (empty when there is none)."""
        if self.path is None or self.value is None or self.step is None:
            return {}
        return {self.metric: self.value, "step": float(self.step)}


def save_sharded_checkpoint(group: TrainingGroup, policy: Any, directory: Path, state: dict[str, Any]) -> Path:
    """A sharded checkpoint (see `ShardedPolicy.save`) with the tokenizer, written under `.partial` then renamed.

    With several machines `directory` must be on a filesystem every rank sees.
    """
    with written_atomically(directory) as partial:
        group.call("save", partial)
        policy.engine.tokenizer.save_pretrained(partial)
        torch.save({"state": state, "sharded": True}, partial / TRAINER_STATE)
        policy.write_manifest(partial, {"world_size": group.world_size, **state})
    return directory


def load_sharded_checkpoint(group: TrainingGroup, policy: Any, directory: Path) -> dict[str, Any]:
    """Restore a sharded checkpoint into the group (any world size) and serve its weights under the version they
    had when saved (`LocalPolicy.resume_version`: the spans of rollouts sampled before it keep a true staleness);
    returns its state."""
    group.call("load", directory)
    policy.resume_version(directory)
    policy.deliver(group.call("full_state_dict"))
    return torch.load(directory / TRAINER_STATE, weights_only=False)["state"]
