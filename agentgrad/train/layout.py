"""What every strategy is given: the algorithm's run (given its context), the context, and the runners' layout."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from agentgrad.algorithms.base import RunContext
from agentgrad.rollout.workers import RunnerSpec

R = TypeVar("R")

Run = Callable[[RunContext], Awaitable[R]]
"""The algorithm's run over the data, given the context the strategy lays out (`algorithm.run(ctx, train, val)`)."""


@dataclass(frozen=True)
class Layout:
    """`n_runners` runners in all, wherever the strategy puts them (threads, processes, Ray nodes), each built from
    `runner` (the agent, hooks, concurrency, isolation, and the gateway its no-argument `OpenAI()` calls: None when
    no model is served for this run)."""

    n_runners: int
    runner: RunnerSpec
