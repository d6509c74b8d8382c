"""The trainer: lays out the roles (algorithm, runners, store) and runs an algorithm over data.

Strategies:
- `threads`: the algorithm and N runners in this process, runners in threads (debugging, and
  the CPU demo, where the engine must share memory with the runners' gateway anyway).
- `processes`: the store served over HTTP from this process, N runner processes as clients.
- `ray`: the store and gateway on the driver, N runner actors per node of a Ray cluster, the
  training group (`train_processes > 1`) as Ray actors (`agentgrad.train.ray_cluster`).
Under torchrun, ranks past 0 only join rank 0's updates (`agentgrad.distributed`).
An algorithm that serves the model it trains (GRPO, SFT) does so through a gateway at
`trainer.gateway_url`, fixed when the trainer is built; while it runs, the runners' no-argument
`OpenAI()` calls it (`OPENAI_BASE_URL`, `OPENAI_API_KEY`): in threads each call names its
attempt in headers (`instrument_openai`), in runner processes the variables name the attempt's
route too (`GatewayEnvHook`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, overload

from agentgrad.algorithms.base import Algorithm, Evaluation
from agentgrad.algorithms.baseline import Baseline
from agentgrad.rollout.agent import FunctionAgent, LitAgent, as_agent
from agentgrad.rollout.runner import Hook, Runner
from agentgrad.serving import free_port
from agentgrad.store import Store, open_store
from agentgrad.store.transitions import check_tasks
from agentgrad.train.processes import run_with_processes
from agentgrad.types import LLM, NamedResources

R = TypeVar("R")
Strategy = Literal["threads", "processes", "ray"]

log = logging.getLogger(__name__)

STOP_SECONDS = 30.0
"""How long `fit` waits for runners to finish their rollouts in flight once the algorithm is done."""


def default_store_path() -> Path:
    return Path(".agentgrad") / f"run-{time.strftime('%Y%m%d-%H%M%S')}.db"


class Trainer(Generic[R]):
    """`Trainer(algorithm=..., n_runners=4).fit(agent, train_data, val_data)`.

    `fit` returns what the algorithm's `run` returns (`GRPOResult`, `SFTResult`, `APOResult`,
    or a Baseline's `{split: Evaluation}`): `Trainer` is generic over it.
    `store` is a `Store`, a SQLite path, `"memory"`, or None for a new SQLite file under
    `.agentgrad/`. `resources` are published before the algorithm starts (the LLM endpoint and
    prompt of an agent that is only evaluated, say). `gateway_port` is where the gateway of the
    model being trained listens on loopback (default: a port free when the trainer is built);
    `gateway_url` says it, before `fit` starts. `runner_isolation="process"` runs each attempt in a
    process of its own (`agentgrad.rollout.isolation`: for agents that may exit or crash the interpreter).
    """

    @overload
    def __init__(
        self: Trainer[dict[str, Evaluation]],
        algorithm: None = None,
        *,
        n_runners: int = 1,
        store: Store | str | Path | None = None,
        strategy: Strategy = "threads",
        hooks: Sequence[Hook] = (),
        resources: NamedResources | None = None,
        runner_concurrency: int = 1,
        gateway_port: int | None = None,
        runner_isolation: Literal["thread", "process"] = "thread",
    ) -> None: ...

    @overload
    def __init__(
        self: Trainer[R],
        algorithm: Algorithm[R],
        *,
        n_runners: int = 1,
        store: Store | str | Path | None = None,
        strategy: Strategy = "threads",
        hooks: Sequence[Hook] = (),
        resources: NamedResources | None = None,
        runner_concurrency: int = 1,
        gateway_port: int | None = None,
        runner_isolation: Literal["thread", "process"] = "thread",
    ) -> None: ...

    def __init__(
        self,
        algorithm: Algorithm[Any] | None = None,
        *,
        n_runners: int = 1,
        store: Store | str | Path | None = None,
        strategy: Strategy = "threads",
        hooks: Sequence[Hook] = (),
        resources: NamedResources | None = None,
        runner_concurrency: int = 1,
        gateway_port: int | None = None,
        runner_isolation: Literal["thread", "process"] = "thread",
    ) -> None:
        if n_runners < 1:
            raise ValueError(f"n_runners must be at least 1, got {n_runners}")
        if strategy not in ("threads", "processes", "ray"):
            raise ValueError(f"strategy is 'threads', 'processes' or 'ray', not {strategy!r}")
        if runner_isolation not in ("thread", "process"):
            raise ValueError(f"runner_isolation is 'thread' or 'process', not {runner_isolation!r}")
        self.algorithm: Algorithm[R] = algorithm or Baseline()  # type: ignore[assignment]
        self.n_runners = n_runners
        self.store = open_store(store if store is not None else default_store_path())
        self.strategy = strategy
        self.hooks = list(hooks)
        self.resources = resources
        self.runner_concurrency = runner_concurrency
        self.runner_isolation = runner_isolation
        self.gateway_port = free_port() if gateway_port is None else gateway_port
        self._local_llm = False

    def fit(
        self, agent: LitAgent | Callable[..., Any], train_data: Sequence[Any], val_data: Sequence[Any] | None = None
    ) -> R:
        """Run the algorithm to the end with runners executing `agent`; returns what the algorithm returns."""
        return asyncio.run(self.fit_async(agent, train_data, val_data))

    @property
    def gateway_url(self) -> str:
        """The base URL (`…/v1`) of the gateway serving the model being trained, from when `fit` starts it."""
        return f"http://127.0.0.1:{self.gateway_port}/v1"

    def dev(self, agent: LitAgent | Callable[..., Any], data: Sequence[Any]) -> dict[str, Evaluation]:
        """A quick smoke pass: run `data` once through the agent with a Baseline, no training.

        An agent that asks for an `ag.LLM` none of the resources provides gets the local model
        (the one GRPO would train), served at `gateway_url`.
        """
        algorithm, self.algorithm = self.algorithm, Baseline()  # type: ignore[assignment]
        self._local_llm = True
        try:
            return self.fit(agent, data, None)  # type: ignore[return-value]
        finally:
            self.algorithm, self._local_llm = algorithm, False

    async def fit_async(
        self, agent: LitAgent | Callable[..., Any], train_data: Sequence[Any], val_data: Sequence[Any] | None = None
    ) -> R:
        agent = as_agent(agent)
        check_tasks(train_data, "train_data")  # before a model loads: a bad task is a message, not a late TypeError
        check_tasks(val_data or (), "val_data")
        if int(os.environ.get("RANK", "0")) > 0:  # torchrun: this rank only joins rank 0's updates
            follow = getattr(self.algorithm, "follow", None)
            if follow is None:
                raise RuntimeError(f"launched as rank {os.environ['RANK']} (torchrun), but {type(self.algorithm).__name__} "
                                   "has no sharded update to join: run it without torchrun, or use GRPO")
            return await asyncio.to_thread(follow)
        self.algorithm.store = self.store
        self.algorithm.gateway_port = self.gateway_port
        if self.resources:
            await self.store.add_resources(self.resources)
        policy = await self._local_policy(agent) if self._local_llm else None
        gateway = self.gateway_url if self.algorithm.serves_gateway or policy is not None else None
        try:
            if gateway is None:
                return await self._run(agent, train_data, val_data, None)
            from agentgrad.rollout.gateway_env import openai_environment

            self.algorithm.console.print(f"gateway of the model being trained: {gateway} (the runners' OPENAI_BASE_URL)",
                                         highlight=False, markup=False)
            with openai_environment(gateway):
                return await self._run(agent, train_data, val_data, gateway)
        finally:
            if policy is not None:
                await asyncio.to_thread(policy.stop)

    async def _run(self, agent: LitAgent, train_data: Sequence[Any], val_data: Sequence[Any] | None,
                   gateway: str | None) -> R:
        if self.strategy == "processes":
            return await run_with_processes(self, agent, train_data, val_data, gateway=gateway)  # type: ignore[no-any-return]
        if self.strategy == "ray":
            from agentgrad.train.ray_cluster import run_with_ray  # Ray is an optional extra

            return await run_with_ray(self, agent, train_data, val_data)  # type: ignore[no-any-return]
        return await self._run_with_threads(agent, train_data, val_data)

    async def _local_policy(self, agent: LitAgent) -> Any:
        """For `dev`: the local model behind the trainer's gateway, published under the name of the agent's
        `ag.LLM` parameter, when it has one that no resource fills; None otherwise."""
        name = agent.llm_parameter if isinstance(agent, FunctionAgent) else None
        if name is None:
            return None
        latest = await self.store.get_latest_resources()
        given = {**(latest.resources if latest else {}), **(self.resources or {})}
        if any(isinstance(r, LLM) for r in given.values()):
            return None
        try:
            from agentgrad.policy.local import LocalPolicy
        except ImportError as exc:
            self.algorithm.console.print(
                f"agent {agent.name} asks for {name}: ag.LLM and no resource gives one ({exc}): pass "
                f"Trainer(resources={{{name!r}: ag.LLM(base_url=..., model=...)}}), or install 'agentgrad[train]' "
                "for the local model", highlight=False, markup=False)
            return None
        self.algorithm.console.print(f"agent {agent.name} asks for {name}: ag.LLM and no resource gives one: "
                                     "serving the local model", highlight=False, markup=False)
        policy = LocalPolicy(self.store, gateway_port=self.gateway_port)
        await asyncio.to_thread(policy.start)
        await self.store.add_resources({**given, name: policy.llm()})
        return policy

    async def _run_with_threads(
        self, agent: LitAgent, train_data: Sequence[Any], val_data: Sequence[Any] | None
    ) -> R:
        runners = [
            Runner(agent, self.store, worker_id=f"runner-{i}", hooks=self.hooks, concurrency=self.runner_concurrency,
                   isolation=self.runner_isolation)
            for i in range(self.n_runners)
        ]
        threads = [
            threading.Thread(target=_run_in_own_loop, args=(runner,), name=runner.worker_id, daemon=True)
            for runner in runners
        ]
        for thread in threads:
            thread.start()
        try:
            return await self.algorithm.run(train_data, val_data)
        finally:
            for runner in runners:
                runner.stop()
            deadline = time.monotonic() + STOP_SECONDS
            for thread in threads:
                await asyncio.to_thread(thread.join, max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    log.warning("%s did not stop within %.0f s; leaving it behind", thread.name, STOP_SECONDS)


def _run_in_own_loop(runner: Runner) -> None:
    try:
        asyncio.run(runner.run())
    except Exception:
        log.exception("%s stopped with an error", runner.worker_id)
