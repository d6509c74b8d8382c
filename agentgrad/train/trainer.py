"""The trainer: lays out the roles (algorithm, runners, store) and runs an algorithm over data.

Strategies (`STRATEGIES`, each a function with one signature: the algorithm's run, its `RunContext`, the `Layout`
→ what the algorithm returns); every one builds its N runners from the layout's `RunnerSpec` and gives a
dead runner's attempts up at once (`rollout.workers`):
- `threads` (`threads.py`): the algorithm and N runners in this process, runners in threads
  (debugging, and the CPU demo, where the engine must share memory with the runners' gateway).
- `processes` (`processes.py`): the store served over HTTP from this process, N runner processes.
- `ray` (`ray_cluster.py`): the store and gateway on the driver, N runner actors spread over the nodes of a Ray
  cluster, the training group (`train_processes > 1`) as Ray actors (the context's launcher).
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
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, Literal, TypedDict, TypeVar, Unpack, overload

from rich.console import Console

from agentgrad.algorithms.base import DEFAULT_CONSOLE, Algorithm, RunContext
from agentgrad.algorithms.baseline import Baseline, BaselineResult
from agentgrad.rollout.agent import FunctionAgent, LitAgent, as_agent
from agentgrad.rollout.runner import Hook
from agentgrad.rollout.workers import RunnerSpec
from agentgrad.semconv import RUN_ID
from agentgrad.serving import Listen, free_port
from agentgrad.store import Store, open_store
from agentgrad.store.transitions import check_tasks
from agentgrad.tracking import Tracker, open_trackers
from agentgrad.tracking.session import default_run_name, finish_run, report_to_of, result_checkpoint, start_run
from agentgrad.train.layout import Layout
from agentgrad.train.processes import run_processes
from agentgrad.train.ray_cluster import run_ray
from agentgrad.train.runs import end_record, start_record
from agentgrad.train.threads import run_threads
from agentgrad.types import LLM, NamedResources, RunStatus

R = TypeVar("R")
Strategy = Literal["threads", "processes", "ray"]

STRATEGIES: dict[str, Callable[..., Any]] = {"threads": run_threads, "processes": run_processes, "ray": run_ray}
"""How the roles are laid out: each `(run, ctx, layout) -> what run returns`, `run` being the algorithm's over the data."""

log = logging.getLogger(__name__)


def bypassing_base_url(gateway_url: str) -> str | None:
    """`OPENAI_BASE_URL` of this process when it names another endpoint than the trainer's gateway, else None."""
    value = os.environ.get("OPENAI_BASE_URL")
    return value if value and value.rstrip("/") != gateway_url.rstrip("/") else None


def default_store_path() -> Path:
    return Path(".agentgrad") / f"run-{time.strftime('%Y%m%d-%H%M%S')}.db"


class TrainerOptions(TypedDict, total=False):
    """`Trainer`'s keyword settings (its docstring says what each does), for the type checker."""

    n_runners: int
    store: Store | str | Path | None
    strategy: Strategy
    hooks: Sequence[Hook]
    resources: NamedResources | None
    runner_concurrency: int
    gateway_port: int | None
    runner_isolation: Literal["thread", "process"]
    console: Console | None
    report_to: Iterable[str | Tracker]
    run_name: str | None
    tags: Mapping[str, str] | None
    host: str
    advertise: str | None
    token: str | None


class Trainer(Generic[R]):
    """`Trainer(algorithm=..., n_runners=4).fit(agent, train_data, val_data)`.

    `fit` returns what the algorithm's `run` returns (the `Result` every run returns: initial, final and best
    validation, checkpoints, every step's figures; a Baseline's is also a mapping `{split: Evaluation}`):
    `Trainer` is generic over it.
    `store` is a `Store`, a SQLite path, `"memory"`, or None for a new SQLite file under
    `.agentgrad/`; it is opened when first needed (`fit`, `dev`, or reading `trainer.store`). `resources` are published before the algorithm starts (the LLM endpoint and
    prompt of an agent that is only evaluated, say). `gateway_port` is where the gateway of the
    model being trained listens on loopback (default: a port free when the trainer is built);
    `gateway_url` says it, before `fit` starts. `runner_isolation="process"` runs each attempt in a
    process of its own (`agentgrad.rollout.isolation`: for agents that may exit or crash the interpreter).
    `console` is where the algorithm reports (default: stdout). `report_to` names trackers that `fit` sends the
    run's metrics, configuration, `tags` and final figures to ("mlflow", "tensorboard", "wandb", or `Tracker`
    objects; `agentgrad.tracking`), besides those the algorithm's own `report_to` names; the run is called
    `run_name` there (default: the algorithm and the time). `n_runners=0` starts no runner here: runners on other
    hosts (`agentgrad runner`) do every rollout. `host` is the address the run's servers bind (the
    gateway, and the store server of the processes and ray strategies; loopback by default), `advertise` the
    address runners on other hosts reach them by (default: `host`, or this machine's outward address when `host`
    is 0.0.0.0): `gateway_url` and the resources published name it. Off loopback a `token` is required: the
    runners the strategy starts are given it, runners joining from elsewhere send it (`AGENTGRAD_TOKEN`).
    """

    @overload
    def __init__(self: Trainer[BaselineResult], algorithm: None = None, **options: Unpack[TrainerOptions]) -> None: ...

    @overload
    def __init__(self: Trainer[R], algorithm: Algorithm[R], **options: Unpack[TrainerOptions]) -> None: ...

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
        console: Console | None = None,
        report_to: Iterable[str | Tracker] = (),
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        advertise: str | None = None,
        token: str | None = None,
    ) -> None:
        if n_runners < 0:
            raise ValueError(f"n_runners must be 0 or more (0: every runner joins from elsewhere), got {n_runners}")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy is one of {', '.join(map(repr, STRATEGIES))}, not {strategy!r}")
        if runner_isolation not in ("thread", "process"):
            raise ValueError(f"runner_isolation is 'thread' or 'process', not {runner_isolation!r}")
        self.algorithm: Algorithm[R] = algorithm or Baseline()  # type: ignore[assignment]
        self.n_runners = n_runners
        self._store_spec = store
        self._store: Store | None = store if isinstance(store, Store) else None
        self.strategy = strategy
        self.hooks = list(hooks)
        self.resources = resources
        self.runner_concurrency = runner_concurrency
        self.runner_isolation = runner_isolation
        self.listen = Listen(host, advertise, token)
        self.gateway_port = free_port(host) if gateway_port is None else gateway_port
        self.console = console or DEFAULT_CONSOLE
        self.report_to = list(report_to)
        open_trackers(self.report_to)  # an unknown name fails here, before anything starts
        self.run_name = run_name
        self.tags = dict(tags or {})

    @property
    def store(self) -> Store:
        """The store of this trainer's runs, opened on first use (a new SQLite file under `.agentgrad/` by default)."""
        if self._store is None:
            spec = self._store_spec
            self._store = open_store(spec if spec is not None else default_store_path())
        return self._store

    def fit(
        self, agent: LitAgent | Callable[..., Any], train_data: Sequence[Any], val_data: Sequence[Any] | None = None
    ) -> R:
        """Run the algorithm to the end with runners executing `agent`; returns what the algorithm returns."""
        return asyncio.run(self.fit_async(agent, train_data, val_data))

    @property
    def gateway_url(self) -> str:
        """The base URL (`…/v1`) of the gateway serving the model being trained, from when `fit` starts it."""
        return self.listen.url(self.gateway_port) + "/v1"

    def dev(self, agent: LitAgent | Callable[..., Any], data: Sequence[Any]) -> BaselineResult:
        """A quick smoke pass: run `data` once through the agent with a Baseline, no training.

        An agent that asks for an `ag.LLM` none of the resources provides gets the local model
        (the one GRPO would train), served at `gateway_url`.
        """
        return asyncio.run(self._fit(Baseline(), as_agent(agent), data, None, local_llm=True))

    async def fit_async(
        self, agent: LitAgent | Callable[..., Any], train_data: Sequence[Any], val_data: Sequence[Any] | None = None
    ) -> R:
        return await self._fit(self.algorithm, as_agent(agent), train_data, val_data, track=True)

    async def _fit(
        self,
        algorithm: Algorithm[Any],
        agent: LitAgent,
        train_data: Sequence[Any],
        val_data: Sequence[Any] | None,
        *,
        local_llm: bool = False,
        track: bool = False,
    ) -> Any:
        check_tasks(train_data, "train_data")  # before a model loads: a bad task is a message, not a late TypeError
        check_tasks(val_data or (), "val_data")
        if int(os.environ.get("RANK", "0")) > 0:  # torchrun: this rank only joins rank 0's updates
            follow = getattr(algorithm, "follow", None)
            if follow is None:
                raise RuntimeError(
                    f"launched as rank {os.environ['RANK']} (torchrun), but {type(algorithm).__name__} "
                    "has no sharded update to join: run it without torchrun, or use GRPO"
                )
            return await asyncio.to_thread(follow)
        store = self.store
        if not track:
            ctx = RunContext(store=store, gateway_port=self.gateway_port, listen=self.listen, console=self.console)
            return await self._run(algorithm, agent, ctx, train_data, val_data, local_llm)
        trackers = open_trackers([*report_to_of(algorithm), *self.report_to])
        name = self.run_name or default_run_name(algorithm)
        layout = {"n_runners": self.n_runners, "strategy": self.strategy, "runner_concurrency": self.runner_concurrency}
        layout |= {"train_size": len(train_data), "val_size": len(val_data or ())}
        record = await asyncio.to_thread(start_record, algorithm, name, self.tags, layout)
        await store.put_run(record)
        ctx = RunContext(
            store=store,
            gateway_port=self.gateway_port,
            listen=self.listen,
            console=self.console,
            trackers=trackers or None,
            run_id=record.run_id,
        )
        if trackers:
            tags = {**self.tags, RUN_ID: record.run_id}
            await asyncio.to_thread(start_run, trackers, algorithm, name, tags, layout)
        status, result, error = RunStatus.FAILED, None, None
        try:
            result = await self._run(algorithm, agent, ctx, train_data, val_data, local_llm)
            status = RunStatus.SUCCEEDED
            return result
        except (KeyboardInterrupt, asyncio.CancelledError):
            status = RunStatus.CANCELLED
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            metrics = await store.query_metrics(run_id=record.run_id)
            noted = await store.get_run(record.run_id)  # with the best checkpoint the algorithm noted on the way
            ended = end_record(noted, status, metrics, result, error)
            await store.put_run(ended)
            if trackers:
                here = getattr(store, "path", None)
                artifacts = Path(here).parent if here else Path(".agentgrad")
                checkpoint = result_checkpoint(result)
                await asyncio.to_thread(
                    finish_run, trackers, name, artifacts, status.value, checkpoint, ended.best_checkpoint
                )

    async def _run(
        self,
        algorithm: Algorithm[Any],
        agent: LitAgent,
        ctx: RunContext,
        train_data: Sequence[Any],
        val_data: Sequence[Any] | None,
        local_llm: bool,
    ) -> Any:
        """Lay out the roles with the trainer's strategy and run the algorithm (behind the gateway, when it serves one)."""
        store = ctx.store
        if self.resources:
            await store.add_resources(self.resources)
        policy = await self._local_policy(agent, ctx) if local_llm else None
        gateway = self.gateway_url if algorithm.serves_gateway or policy is not None else None
        key = self.listen.token or "agentgrad"  # what agents send the gateway: its token, off loopback
        runner = RunnerSpec(agent, tuple(self.hooks), self.runner_concurrency, self.runner_isolation, gateway, key)
        layout = Layout(self.n_runners, runner)
        strategy = STRATEGIES[self.strategy]

        def run(laid_out: RunContext) -> Awaitable[Any]:
            return algorithm.run(laid_out, train_data, val_data)

        try:
            if gateway is None:
                return await strategy(run, ctx, layout)
            from agentgrad.rollout.gateway_env import openai_environment

            ctx.console.print(
                f"gateway of the model being trained: {gateway} (the runners' OPENAI_BASE_URL)",
                highlight=False,
                markup=False,
            )
            if (elsewhere := bypassing_base_url(gateway)) is not None:
                ctx.console.print(
                    f"warning: OPENAI_BASE_URL was {elsewhere} when the trainer started: an OpenAI() client built "
                    "before the run (at import time) keeps calling it, so its calls never reach the model being "
                    "trained; build the client inside the agent (from its `llm` resource, or with no arguments)",
                    highlight=False,
                    markup=False,
                )
            with openai_environment(gateway, api_key=self.listen.token or "agentgrad"):
                return await strategy(run, ctx, layout)
        finally:
            if policy is not None:
                await asyncio.to_thread(policy.stop)

    async def _local_policy(self, agent: LitAgent, ctx: RunContext) -> Any:
        """For `dev`: the local model behind the trainer's gateway, published under the name of the agent's
        `ag.LLM` parameter, when it has one that no resource fills; None otherwise."""
        name = agent.llm_parameter if isinstance(agent, FunctionAgent) else None
        if name is None:
            return None
        latest = await ctx.store.get_latest_resources()
        given = {**(latest.resources if latest else {}), **(self.resources or {})}
        # an LLM this trainer was given, or a stored endpoint of its own, serves this run; a stored gateway route
        # (proxied) is an earlier run's policy, whose gateway stopped with that run
        if any(isinstance(r, LLM) and (not r.proxied or name in (self.resources or {})) for name, r in given.items()):
            return None
        try:
            from agentgrad.policy.local import LocalPolicy
        except ImportError as exc:
            ctx.console.print(
                f"agent {agent.name} asks for {name}: ag.LLM and no resource gives one ({exc}): pass "
                f"Trainer(resources={{{name!r}: ag.LLM(base_url=..., model=...)}}), or install 'agentgrad[train]' "
                "for the local model",
                highlight=False,
                markup=False,
            )
            return None
        ctx.console.print(
            f"agent {agent.name} asks for {name}: ag.LLM and no resource gives one: serving the local model",
            highlight=False,
            markup=False,
        )
        policy = LocalPolicy(ctx.store, gateway_port=ctx.gateway_port, listen=ctx.listen)
        await asyncio.to_thread(policy.start)
        await ctx.store.add_resources({**given, name: policy.llm()})
        return policy
