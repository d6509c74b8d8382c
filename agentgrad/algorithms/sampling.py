"""Which training tasks each step (GRPO) or round (SFT) runs."""

from __future__ import annotations

import random


class TaskSampler:
    """Tasks in a fresh random order each epoch, reproducible from the seed; `skip` resumes a run."""

    def __init__(self, n: int, seed: int, skip: int = 0) -> None:
        self.n = n
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.take(skip)

    def take(self, count: int) -> list[int]:
        taken = []
        for _ in range(count):
            if not self.order:
                self.order = list(range(self.n))
                self.rng.shuffle(self.order)
            taken.append(self.order.pop())
        return taken
