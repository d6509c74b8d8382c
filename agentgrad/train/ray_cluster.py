"""The `ray` strategy: the system laid out on a Ray cluster; Ray schedules, restarts and places.

- Store server, gateway and the algorithm (with the engine serving rollouts) on the driver (the head). They bind
  and are reached at the trainer's `host` / `advertise` when it names them (`RunContext.listen`), else at loopback
  on a one-node cluster and at this node's Ray address otherwise.
- Runners: `n_runners` Ray actors in all, spread over the alive nodes in turn, each built from the layout's
  `RunnerSpec` (hooks, isolation, and the gateway its agents' no-argument `OpenAI()` calls), restarted by Ray
  when they die. A restarted runner first gives up the attempts its dead predecessor left running (same worker
  id), so their rollouts are requeued at once; a runner whose node vanished stops heartbeating and its
  attempts are given up after `RolloutConfig.unresponsive_seconds` and run again.
- Training group (`train_processes > 1`): that many Ray actors running the FSDP2 update
  (`RayGroup`), one GPU each where the cluster has GPUs, else one CPU.

`ray.init()` joins the cluster at `RAY_ADDRESS`, or starts a local one bound to loopback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import threading
from typing import Any, TypeVar

from agentgrad.algorithms.base import RunContext
from agentgrad.rollout.workers import RunnerSpec, release_attempts
from agentgrad.serving.guard import TOKEN_ENV
from agentgrad.train.layout import Layout, Run

R = TypeVar("R")

log = logging.getLogger(__name__)


def connect() -> bool:
    """Join `RAY_ADDRESS`'s cluster, or start a local one on loopback; True when the cluster is this machine only."""
    import ray

    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        else:
            ray.init(_node_ip_address="127.0.0.1", include_dashboard=False)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    return all(n["NodeManagerAddress"] in ("127.0.0.1", "localhost") for n in nodes) or len(nodes) == 1


class RunnerActor:
    """A runner in a Ray actor, on its own event loop thread; `ping` answers while it works."""

    def __init__(self, url: str, token: str, spec: RunnerSpec, worker_id: str) -> None:
        self.worker_id = worker_id
        os.environ.setdefault(TOKEN_ENV, token)  # a proxied LLM's key: the gateway's token, when it has one
        self._loop = asyncio.new_event_loop()
        self._runner: Any = None
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._main(url, token, spec),), daemon=True
        )
        self._thread.start()

    async def _main(self, url: str, token: str, spec: RunnerSpec) -> None:
        from agentgrad.store.client import StoreClient

        store = StoreClient(url, token)
        try:
            # this process is new: an attempt still running under this worker id was its dead predecessor's
            released = await release_attempts(store, {self.worker_id}, "runner actor died and was restarted")
            if released:
                log.warning(
                    "%s restarted: %d attempt(s) of its predecessor go back to the queue", self.worker_id, released
                )
            self._runner = spec.build(store, self.worker_id)
            await self._runner.run()
        finally:
            await store.close()

    def ping(self) -> str:
        return self.worker_id

    def pid(self) -> int:
        return os.getpid()

    def stop(self) -> None:
        if self._runner is not None:
            self._loop.call_soon_threadsafe(self._runner.stop)
        self._thread.join(10)


def start_runners(url: str, token: str, spec: RunnerSpec, n_runners: int) -> list[Any]:
    """`n_runners` runner actors spread over the alive nodes in turn, named by their worker id, restarted whenever
    they die."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote = ray.remote(RunnerActor)
    nodes = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: n["NodeID"])
    actors: list[Any] = []  # Ray's actor handles: their methods' `.remote` is not typed
    for i in range(n_runners):
        worker_id = f"runner-{i}"
        actors.append(
            remote.options(
                name=worker_id,
                max_restarts=-1,
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[i % len(nodes)]["NodeID"], soft=True),
            ).remote(url, token, spec, worker_id)
        )
    ray.get([a.ping.remote() for a in actors])  # all constructed
    return actors


# ----------------------------------------------------------------------------- the training group


class TrainingRank:
    """One rank of the training group in a Ray actor: a `ShardedPolicy` driven by `call`."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.sharded: Any = None

    def address(self) -> tuple[str, int]:
        import ray

        from agentgrad.distributed.group import free_port

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, master: tuple[str, int], make_model: Any, options: dict[str, Any]) -> None:
        from agentgrad.distributed.fsdp import ShardedPolicy
        from agentgrad.distributed.group import init_from_env

        os.environ.update(
            MASTER_ADDR=master[0],
            MASTER_PORT=str(master[1]),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
        )  # Ray gives each actor its own GPU
        init_from_env()
        self.sharded = ShardedPolicy(make_model(), **options)

    def call(self, method: str, args: tuple[Any, ...]) -> Any:
        result = getattr(self.sharded, method)(*args)
        return result if self.rank == 0 else None


class RayGroup:
    """`world_size` `TrainingRank` actors spread over the cluster; a `TrainingGroup`."""

    def __init__(self, world_size: int, config: Any, state: dict[str, Any], **policy_options: Any) -> None:
        import ray

        from agentgrad.distributed.group import FromConfig

        gpus = ray.cluster_resources().get("GPU", 0) >= world_size
        remote = ray.remote(num_gpus=1, num_cpus=0)(TrainingRank) if gpus else ray.remote(num_cpus=1)(TrainingRank)
        self.world_size = world_size
        self.actors: list[Any] = [
            remote.options(scheduling_strategy="SPREAD").remote(r, world_size) for r in range(world_size)
        ]
        master = ray.get(self.actors[0].address.remote())
        ray.get(
            [
                a.setup.remote(master, FromConfig(config, state if r == 0 else None), policy_options)
                for r, a in enumerate(self.actors)
            ]
        )

    def call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get([a.call.remote(method, args) for a in self.actors])[0]

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


# ----------------------------------------------------------------------------- the strategy


async def run_ray(run: Run[R], ctx: RunContext, layout: Layout) -> R:
    """Serve `ctx.store` from the driver, start the runner actors, run the algorithm with its training
    ranks launched as Ray actors (`RayGroup` as the context's launcher), stop them."""
    import ray

    from agentgrad.store.server import store_server

    local = await asyncio.to_thread(connect)
    listen = ctx.listen
    token = listen.token or secrets.token_urlsafe(16)
    if listen.host != "127.0.0.1":  # the trainer was told where to listen and how it is reached: runners get that
        served = store_server(ctx.store, host=listen.host, token=token, advertise=listen.advertise)
        server = await asyncio.to_thread(served.start)
        url = server.url
    else:
        server = await asyncio.to_thread(
            store_server(ctx.store, host="127.0.0.1" if local else "0.0.0.0", token=token).start
        )
        url = server.url if local else f"http://{ray.util.get_node_ip_address()}:{server.port}"
    actors: list[Any] = []
    try:
        actors = await asyncio.to_thread(start_runners, url, token, layout.runner, layout.n_runners)
        log.info("store served at %s to %d runner actors", url, len(actors))
        return await run(dataclasses.replace(ctx, launcher=RayGroup))
    finally:
        await asyncio.to_thread(_stop_runners, actors)
        await asyncio.to_thread(server.stop)


def _stop_runners(actors: list[Any]) -> None:
    import ray

    stops = [a.stop.remote() for a in actors]
    ray.wait(stops, num_returns=len(stops), timeout=15)
    for actor in actors:
        ray.kill(actor, no_restart=True)
