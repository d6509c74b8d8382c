"""What every strategy is given besides the algorithm, the agent and the run's context: the runners' layout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agentgrad.rollout.runner import Hook


@dataclass(frozen=True)
class Layout:
    """How many runners, how many rollouts each runs at once, their hooks, the gateway their
    no-argument `OpenAI()` calls (`…/v1`; None when no model is served for this run), and whether
    each attempt runs in the runner's threads or in a process of its own (`agentgrad.rollout.isolation`)."""

    n_runners: int = 1
    runner_concurrency: int = 1
    hooks: Sequence[Hook] = ()
    gateway: str | None = None
    runner_isolation: Literal["thread", "process"] = "thread"
