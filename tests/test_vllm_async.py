"""Asynchronous training on a real vLLM server: a sync lands between attempts, and waits no longer than it may.

Under `max_staleness` the vLLM policy's `sync()` holds the first call of every new attempt, lets the attempts
already under way go on calling on the served weights, and swaps once they end (or once `attempt_wait_s` has
passed on the policy's clock, which these tests move instead of sleeping).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import pytest

from agentgrad import semconv as sc
from agentgrad.algorithms.async_rollouts import call_versions, fresh_groups
from agentgrad.policy.vllm import VLLMPolicy
from agentgrad.policy.vllm_server import VLLMServer
from agentgrad.store import MemoryStore
from agentgrad.types import AttemptedRollout, Span
from examples.calc_agent import build_messages
from tests.helpers import ManualClock, wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.model]

NAME = "smollm2-135m"
ATTEMPT_WAIT_S = 30.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def policy(smollm2_vllm: VLLMServer, clock: ManualClock) -> Iterator[VLLMPolicy]:
    """A vLLM policy training beside serving (what `max_staleness` sets), its attempt wait on `clock`."""
    with VLLMPolicy(MemoryStore(), urls=[smollm2_vllm.url], attempt_wait_s=ATTEMPT_WAIT_S, clock=clock) as policy:
        policy.train_beside_serving()
        yield policy


def call(policy: VLLMPolicy, attempt: AttemptedRollout) -> int:
    """One short model call of `attempt` through the gateway; the weights version that answered it."""
    route = sc.gateway_route(policy.llm().base_url, attempt.rollout_id, attempt.attempt.attempt_id)
    body = {"model": NAME, "messages": build_messages("What is 2 + 3?"), "max_tokens": 4, "temperature": 1.0}
    response = httpx.post(route + "/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return int(response.headers[sc.VERSION_HEADER])


def start(policy: VLLMPolicy) -> AttemptedRollout:
    return asyncio.run(policy.store.start_rollout({"q": "2 + 3"}, mode="train"))


def finish(policy: VLLMPolicy, attempt: AttemptedRollout) -> None:
    asyncio.run(
        policy.store.update_attempt(attempt.rollout_id, attempt.attempt.attempt_id, status="succeeded", reward=1.0)
    )


def attempt_spans(policy: VLLMPolicy, attempt: AttemptedRollout) -> list[Span]:
    return asyncio.run(policy.store.query_spans(attempt.rollout_id, attempt.attempt.attempt_id))


def recorded_versions(policy: VLLMPolicy, attempt: AttemptedRollout, calls: int) -> list[int]:
    """The versions on the attempt's model-call spans, once all `calls` are recorded."""
    return wait_until(
        lambda: len(v := call_versions(attempt_spans(policy, attempt))) == calls and v, "the call spans"
    )


def sync_in_background(policy: VLLMPolicy) -> threading.Thread:
    """Publish new trainer weights and start their sync; returns once the sync holds new attempts."""
    policy.engine.publish()
    syncing = threading.Thread(target=policy.sync)
    syncing.start()
    wait_until(lambda: policy.pool is not None and policy.pool._attempts_held, "the sync holding new attempts")
    return syncing


def test_a_sync_lets_an_attempt_under_way_finish_on_the_old_version_and_the_next_attempt_gets_the_new_one(
    policy: VLLMPolicy,
) -> None:
    assert policy.pool is not None
    old = policy.pool.version
    under_way = start(policy)
    assert call(policy, under_way) == old  # its first call, before the sync
    syncing = sync_in_background(policy)
    following = start(policy)
    answered: list[int] = []
    first_call = threading.Thread(target=lambda: answered.append(call(policy, following)))
    first_call.start()
    wait_until(lambda: policy.pool is not None and policy.pool.held_calls == 1, "the next attempt's first call held")
    assert call(policy, under_way) == old  # the attempt under way goes on calling on the weights it began with
    assert syncing.is_alive() and first_call.is_alive() and policy.pool.version == old  # waiting for it to end
    finish(policy, under_way)
    syncing.join(300)
    first_call.join(300)
    assert not syncing.is_alive() and policy.straddling == []
    assert answered == [old + 1] == [policy.pool.version]
    assert recorded_versions(policy, under_way, 2) == [old, old]
    assert recorded_versions(policy, following, 1) == [old + 1]


def test_a_sync_waits_for_an_attempt_no_longer_than_attempt_wait_s_then_the_attempt_straddles_and_is_not_trained(
    policy: VLLMPolicy, clock: ManualClock
) -> None:
    assert policy.pool is not None
    old = policy.pool.version
    stuck = start(policy)  # an agent stuck on a slow tool, between its two calls
    assert call(policy, stuck) == old
    syncing = sync_in_background(policy)
    reads = clock.reads
    wait_until(lambda: clock.reads > reads + 1, "the sync looking at the clock")
    clock.advance(ATTEMPT_WAIT_S - 1)
    reads = clock.reads
    wait_until(lambda: clock.reads > reads + 1, "the sync looking at the clock again")
    assert syncing.is_alive() and policy.pool.version == old  # a second short of the bound: still waiting
    clock.advance(2)
    syncing.join(300)
    assert not syncing.is_alive() and policy.straddling == [stuck.rollout_id]  # it gave up at the bound
    assert policy.pool.version == old + 1
    assert call(policy, stuck) == old + 1  # its later call gets the new weights: it straddles the swap
    finish(policy, stuck)
    assert recorded_versions(policy, stuck, 2) == [old, old + 1]
    rollouts = asyncio.run(policy.store.query_rollouts(rollout_ids=[stuck.rollout_id]))
    fresh = asyncio.run(fresh_groups(policy.store, rollouts, [0], current_version=old + 1, max_staleness=1))
    assert fresh.rollouts == [] and fresh.mixed == 1  # training leaves it out, counted
