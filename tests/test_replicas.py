"""The replica pool behind the gateway: sticky rollouts, load spreading, and exclusive weight swaps."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from agentgrad import semconv as sc
from agentgrad.engine.adapters import Adapters
from agentgrad.gateway import Gateway
from agentgrad.gateway.replicas import ReplicaPool
from agentgrad.gateway.upstreams import Backend
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from tests.conftest import UPSTREAM_KEY, Upstream


def pool(n: int = 2) -> ReplicaPool:
    return ReplicaPool("policy", [Backend(f"http://127.0.0.1:{9000 + i}/v1", system="vllm") for i in range(n)])


async def test_a_rollouts_calls_stick_to_one_replica_and_new_rollouts_go_to_the_least_loaded() -> None:
    replicas = pool(2)
    first = await replicas.acquire("r1")
    second = await replicas.acquire("r2")  # r1's replica is busy: r2 goes to the other
    assert {first.replica, second.replica} == {0, 1}
    replicas.release(first)
    again = await replicas.acquire("r1")
    assert again.replica == first.replica and again.upstream.backend.url.endswith(f"{9000 + first.replica}/v1")
    replicas.release(again)
    replicas.release(second)
    spread = [await replicas.acquire(None) for _ in range(4)]
    assert sorted(lease.replica for lease in spread) == [0, 0, 1, 1]


async def test_an_exclusive_swap_waits_for_calls_in_flight_and_holds_new_ones_until_it_sets_the_version() -> None:
    replicas = pool(1)
    in_flight = await replicas.acquire("r1")
    assert in_flight.version == 0
    entered, leave = threading.Event(), threading.Event()

    def swap() -> None:
        with replicas.exclusive():
            entered.set()
            leave.wait(10)
            replicas.version = 1

    swapper = threading.Thread(target=swap)
    swapper.start()
    await asyncio.sleep(0.05)
    assert not entered.is_set()  # a call is still running on version 0
    replicas.release(in_flight)
    assert await asyncio.to_thread(entered.wait, 10)
    held = asyncio.ensure_future(replicas.acquire("r2"))
    await asyncio.sleep(0.05)
    assert not held.done()  # new calls wait while the weights change
    leave.set()
    lease = await asyncio.wait_for(held, 10)
    assert lease.version == 1
    swapper.join(10)


def test_an_exclusive_swap_that_cannot_drain_gives_up_and_leaves_the_pool_open() -> None:
    replicas = pool(1)
    stuck = asyncio.run(replicas.acquire(None))
    with pytest.raises(TimeoutError, match="still in flight"), replicas.exclusive(timeout_s=0.05):
        pass
    replicas.release(stuck)
    assert asyncio.run(replicas.acquire(None)).version == 0


async def settle() -> None:
    """Let every task ready on this loop run until it waits again (a few turns of the loop)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_attempts_held_holds_new_rollouts_first_calls_and_lets_those_begun_on_these_weights_call_on() -> None:
    replicas = pool(1)
    replicas.release(await replicas.acquire("began"))  # a rollout's first call, on version 0
    with replicas.attempts_held() as started:
        assert started == ["began"]  # the attempts a publish must wait for
        later = await asyncio.wait_for(replicas.acquire("began"), 10)  # its next call is not held
        assert later.version == 0
        replicas.release(later)
        unnamed = await asyncio.wait_for(replicas.acquire(None), 10)  # a call of no rollout: no attempt to split
        replicas.release(unnamed)
        new = asyncio.ensure_future(replicas.acquire("new"))
        await settle()
        assert replicas.held_calls == 1 and not new.done()
        with replicas.exclusive():
            replicas.version = 1
        await settle()
        assert replicas.held_calls == 1 and not new.done()  # woken by the swap, still held: the publish goes on
    lease = await asyncio.wait_for(new, 10)
    assert lease.version == 1
    with replicas.attempts_held() as started:
        assert started == ["new"]  # the swap forgot who called on version 0


ROLES = {"solver": "^solver$", "verifier": "^verif"}


def adapter_pool(url: str, api_key: str | None = None, default: str | None = None) -> ReplicaPool:
    """One replica serving two role adapters and the base (named "base-model" upstream), as `VLLMPolicy` builds it;
    `default`: the role whose adapter serves the agents no role matches (`GRPOConfig(default_role=...)`)."""
    models = {"solver": "solver", "verifier": "verifier", sc.BASE_ADAPTER: "base-model"}
    backend = Backend(url, api_key=api_key, system="vllm")
    return ReplicaPool("policy", [backend], adapters=models, resolve=Adapters(ROLES, default).resolve)


async def test_a_pool_of_adapters_leases_each_agents_calls_under_its_adapters_model_name() -> None:
    replicas = adapter_pool("http://127.0.0.1:9000/v1")
    leases = {agent: await replicas.acquire("r1", agent) for agent in ("solver", "verifier-2", "planner", None)}
    assert {agent: (lease.adapter, lease.upstream.backend.model) for agent, lease in leases.items()} == {
        "solver": ("solver", "solver"),
        "verifier-2": ("verifier", "verifier"),  # the first matching pattern, as the built-in engine resolves it
        "planner": (sc.BASE_ADAPTER, "base-model"),  # no adapter matches: the base model
        None: (sc.BASE_ADAPTER, "base-model"),
    }
    assert {lease.replica for lease in leases.values()} == {0}  # the adapter does not move a rollout's replica
    plain = await pool(1).acquire("r1", "solver")
    assert plain.adapter is None and plain.upstream.backend.model is None  # a pool without adapters: as before
    with pytest.raises(ValueError, match="give both adapters"):
        ReplicaPool("policy", [Backend("http://127.0.0.1:9000/v1")], adapters={"a": "a"})


async def test_through_the_gateway_each_agents_call_reaches_vllm_under_its_adapter_and_its_span_names_it(
    upstream: Upstream,
) -> None:
    """vLLM sends no adapter header: the gateway records the adapter its pool chose, and names the adapter (not
    the agent, which vLLM does not read) as the model upstream."""
    store = MemoryStore()
    gateway = Gateway(store, routers={"policy": adapter_pool(upstream.url, UPSTREAM_KEY)}, retry_backoff_s=0.001)
    rollout = await store.start_rollout("task")
    route = f"/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}"
    with ServerThread(gateway) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            for agent in ("solver", "verifier", "planner"):
                body = {"model": "policy", "messages": [{"role": "user", "content": agent}]}
                answer = await client.post(f"{route}/agents/{agent}/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
        await gateway.flush()
    assert [r["model"] for r in upstream.fake.requests] == ["solver", "verifier", "base-model"]
    assert all(sc.AGENT_HEADER not in h for h in upstream.fake.headers)
    spans = sorted(
        (s for s in await store.query_spans(rollout.rollout_id) if sc.is_llm_call(s)), key=lambda s: s.sequence_id
    )
    assert [(s.attributes[sc.AGENT_NAME], s.attributes[sc.ADAPTER_NAME]) for s in spans] == [
        ("solver", "solver"),
        ("verifier", "verifier"),
        ("planner", sc.BASE_ADAPTER),
    ]


async def test_with_a_default_role_an_agent_no_role_matches_reaches_vllm_under_that_roles_adapter_and_says_so(
    upstream: Upstream,
) -> None:
    store = MemoryStore()
    pool = adapter_pool(upstream.url, UPSTREAM_KEY, default="solver")
    gateway = Gateway(store, routers={"policy": pool}, retry_backoff_s=0.001)
    rollout = await store.start_rollout("task")
    route = f"/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}"
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    with ServerThread(gateway) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            for path in ("/agents/planner/v1", "/agents/verifier/v1", "/v1"):  # the last call names no agent
                answer = await client.post(f"{route}{path}/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
        await gateway.flush()
    assert [r["model"] for r in upstream.fake.requests] == ["solver", "verifier", "solver"]
    spans = sorted(
        (s for s in await store.query_spans(rollout.rollout_id) if sc.is_llm_call(s)), key=lambda s: s.sequence_id
    )
    assert [(s.attributes.get(sc.AGENT_NAME), s.attributes[sc.ADAPTER_NAME]) for s in spans] == [
        ("planner", "solver"),
        ("verifier", "verifier"),
        (None, "solver"),
    ]
