"""What every strategy is given besides the algorithm and the run's context: how many runners, and what each is."""

from __future__ import annotations

from dataclasses import dataclass

from agentgrad.rollout.workers import RunnerSpec


@dataclass(frozen=True)
class Layout:
    """`n_runners` runners in all, wherever the strategy puts them (threads, processes, Ray nodes), each built from
    `runner` (the agent, hooks, concurrency, isolation, and the gateway its no-argument `OpenAI()` calls: None when
    no model is served for this run)."""

    n_runners: int
    runner: RunnerSpec
