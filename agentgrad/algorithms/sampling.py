"""Which training tasks each step (GRPO) or round (SFT) runs, and the seed each of its rollouts samples with."""

from __future__ import annotations

import hashlib
import random

SEED_BITS = 48
"""Rollout seeds stay below 2**48: exact as JSON numbers anywhere (JavaScript too), with room for a call offset."""


def rollout_seed(seed: int, step: int, index: int) -> int:
    """The sampling seed of the `index`-th rollout queued for `step` of a run seeded `seed`: a hash of the three, so
    the members of a group sample differently and a rerun with the same seed samples the same tokens."""
    digest = hashlib.sha256(f"{seed}/{step}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


class TaskSampler:
    """Tasks in a fresh random order each epoch, reproducible from the seed; `skip` resumes a run (`drawn` counts the
    tasks taken, skipped ones included: what a checkpoint records)."""

    def __init__(self, n: int, seed: int, skip: int = 0) -> None:
        self.n = n
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.drawn = 0
        self.take(skip)

    def take(self, count: int) -> list[int]:
        taken = []
        for _ in range(count):
            if not self.order:
                self.order = list(range(self.n))
                self.rng.shuffle(self.order)
            taken.append(self.order.pop())
        self.drawn += count
        return taken
