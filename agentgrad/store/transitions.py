"""The store's state machine, written once: plain functions over the data model that every backend calls.

A backend finds the records, calls one of these to change them, and persists what changed; it
decides nothing itself. Each function takes the time `at` from the backend's clock, so
timeouts, heartbeats and requeues follow an injected clock in tests. Every error a store
raises on bad input is made here, so the messages are the same whatever keeps the data.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from agentgrad.semconv import REWARD, REWARD_AGENT
from agentgrad.store.errors import InvalidTransitionError, NotFoundError, StoreError
from agentgrad.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    NamedResources,
    ResourcesSnapshot,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    Worker,
    WorkerStatus,
)

Clock = Callable[[], float]
"""Seconds since the epoch; `agentgrad.types.now` (the wall clock) unless a store is given another."""

HEALTH_CHECK_SECONDS = 0.5
"""Least time between two scans for timed-out or unresponsive attempts."""

WAITING = (RolloutStatus.QUEUING, RolloutStatus.REQUEUING)


# ----------------------------------------------------------------------------- errors


def no_rollout(rollout_id: str) -> NotFoundError:
    return NotFoundError(f"no rollout with id {rollout_id!r}")


def no_run(run_id: str) -> NotFoundError:
    return NotFoundError(f"no run with id {run_id!r}: `agentgrad runs ls --store ...` lists the runs of a store")


def no_attempt(rollout_id: str, attempt_id: str) -> NotFoundError:
    return NotFoundError(f"rollout {rollout_id!r} has no attempt {attempt_id!r}")


def no_resources(resources_id: str) -> NotFoundError:
    return NotFoundError(f"no resources with id {resources_id!r}")


def check_reward(reward: Any, where: str) -> float:
    """A reward as a float; NaN and infinities are refused (they would read back as no reward at all)."""
    value = float(reward)
    if not math.isfinite(value):
        raise StoreError(f"{where} is {value}, not a finite number; report a finite reward (or none)")
    return value


def json_problem(value: Any, where: str) -> str | None:
    """What keeps `value` (found at `where`) from being stored as JSON and read back the same, or None.

    JSON has no NaN or infinity (a server would hand them back as null) and no objects of other types."""
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} is {value}, not a finite number"
    if isinstance(value, (list, tuple)):
        return next((p for i, item in enumerate(value) if (p := json_problem(item, f"{where}[{i}]"))), None)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where} has the key {key!r} ({type(key).__name__}); JSON keys are strings"
            if problem := json_problem(item, f"{where}[{key!r}]"):
                return problem
        return None
    shown = repr(value)
    shown = shown[:100] + "..." if len(shown) > 100 else shown
    return f"{where} is {shown}, a {type(value).__name__}, which JSON cannot hold"


def check_json(value: Any, where: str) -> None:
    """Refuse a rollout's input or metadata that would not come back as it was sent (`json_problem`)."""
    if problem := json_problem(value, where):
        raise StoreError(f"{problem}; send JSON values: dicts, lists, strings, finite numbers, booleans, null")


def check_tasks(tasks: Sequence[Any], name: str) -> None:
    """Check a data set's tasks before any work starts (`Trainer.fit`): the first one that is not JSON is an
    error naming its index and the offending value, rather than a failure once the model has loaded."""
    for index, task in enumerate(tasks):
        if problem := json_problem(task, f"task {index} of {name}"):
            raise StoreError(
                f"{problem}; a task must be JSON (dicts, lists, strings, finite numbers, booleans, "
                "null): convert it before training"
            )


def check_request(request: RolloutRequest, where: str) -> RolloutRequest:
    check_json(request.input, f"{where} input")
    check_json(request.metadata, f"{where} metadata")
    return request


# ----------------------------------------------------------------------------- rollouts and attempts


def new_rollout_id() -> str:
    return "ro-" + uuid.uuid4().hex[:12]


def new_attempt_id() -> str:
    return "at-" + uuid.uuid4().hex[:10]


def as_requests(items: Iterable[RolloutRequest | dict[str, Any]]) -> list[RolloutRequest]:
    """The requests as models, each checked to be JSON (`check_json`)."""
    return [
        check_request(
            item if isinstance(item, RolloutRequest) else RolloutRequest.model_validate(item), f"request {index}'s"
        )
        for index, item in enumerate(items)
    ]


def new_rollout(request: RolloutRequest, at: float) -> Rollout:
    """A queued rollout for `request`."""
    return Rollout(
        rollout_id=new_rollout_id(), **request.model_dump(exclude={"config"}), config=request.config, enqueue_time=at
    )


def start_request(
    input: Any,
    mode: str | None,
    resources_id: str | None,
    config: RolloutConfig | None,
    metadata: dict[str, Any] | None,
) -> RolloutRequest:
    return check_request(
        RolloutRequest(
            input=input, mode=mode, resources_id=resources_id, config=config or RolloutConfig(), metadata=metadata or {}
        ),
        "the rollout's",
    )


def open_attempt(rollout: Rollout, worker_id: str | None, at: float) -> AttemptedRollout:
    """Claim `rollout` with a new running attempt; the rollout becomes `running`."""
    attempt = Attempt(
        rollout_id=rollout.rollout_id,
        attempt_id=new_attempt_id(),
        sequence=rollout.num_attempts + 1,
        worker_id=worker_id,
        start_time=at,
        last_heartbeat_time=at,
    )
    rollout.status = RolloutStatus.RUNNING
    rollout.num_attempts = attempt.sequence
    rollout.latest_attempt_id = attempt.attempt_id
    rollout.start_time = rollout.start_time or at
    return AttemptedRollout(**rollout.__dict__, attempt=attempt)


def attempt_budget(config: RolloutConfig, status: AttemptStatus) -> int:
    """Attempts a rollout may have in all when one ends with `status`."""
    if status is AttemptStatus.UNRESPONSIVE:
        return max(config.max_attempts, config.max_attempts_if_lost)
    return config.max_attempts


def attempt_outcome(rollout: Rollout, status: AttemptStatus) -> RolloutStatus:
    """The rollout status that follows when its running attempt ends with `status`."""
    if status is AttemptStatus.SUCCEEDED:
        return RolloutStatus.SUCCEEDED
    if status in rollout.config.retry_on and rollout.num_attempts < attempt_budget(rollout.config, status):
        return RolloutStatus.REQUEUING
    return RolloutStatus.FAILED


def end_attempt(rollout: Rollout, attempt: Attempt, status: AttemptStatus, at: float) -> None:
    """Close the attempt and move its rollout on: it succeeds (with the attempt's reward), requeues or fails.

    A rollout cancelled meanwhile, or already on a later attempt, keeps its status.
    """
    attempt.status = status
    attempt.end_time = at
    if rollout.status is not RolloutStatus.RUNNING or rollout.latest_attempt_id != attempt.attempt_id:
        return
    rollout.status = attempt_outcome(rollout, status)
    if rollout.status is RolloutStatus.REQUEUING:
        return
    rollout.end_time = at
    rollout.reward = attempt.reward if status is AttemptStatus.SUCCEEDED else None


def update_attempt(
    rollout: Rollout,
    attempt: Attempt,
    *,
    status: AttemptStatus | str | None,
    reward: float | None,
    error: str | None,
    at: float,
) -> None:
    """Record an attempt's reward or error and, with `status`, end it. Checks everything before changing anything."""
    status = None if status is None else AttemptStatus(status)
    if status is not None:
        if attempt.status is not AttemptStatus.RUNNING:
            raise InvalidTransitionError(
                f"attempt {attempt.attempt_id} of rollout {rollout.rollout_id} is already {attempt.status.value}; "
                f"it cannot become {status.value}"
            )
        if status is AttemptStatus.RUNNING:
            raise InvalidTransitionError(f"attempt {attempt.attempt_id} is already running")
    if reward is not None:
        reward = check_reward(reward, f"the reward of attempt {attempt.attempt_id}")
        attempt.reward = reward
    if error is not None:
        attempt.error = error
    if status is not None:
        end_attempt(rollout, attempt, status, at)


def update_rollout(
    rollout: Rollout, *, status: RolloutStatus | str | None, metadata: dict[str, Any] | None, at: float
) -> None:
    """Merge metadata and/or cancel. Only cancellation is set directly; every other status follows its attempts."""
    status = None if status is None else RolloutStatus(status)
    if status is not None:
        if status is not RolloutStatus.CANCELLED:
            raise InvalidTransitionError(
                f"a rollout's status follows its attempts; only 'cancelled' can be set directly, not {status.value!r}"
            )
        if rollout.status.finished:
            raise InvalidTransitionError(f"rollout {rollout.rollout_id} is already {rollout.status.value}")
    if metadata:
        check_json(metadata, f"the metadata of rollout {rollout.rollout_id}")
        rollout.metadata = {**rollout.metadata, **metadata}
    if status is not None:
        rollout.status = status
        rollout.end_time = at


def health_check_due(last_check: float, at: float, force: bool) -> bool:
    """Whether `check_attempts` should scan now (at most every `HEALTH_CHECK_SECONDS` unless forced)."""
    return force or at - last_check >= HEALTH_CHECK_SECONDS or at < last_check


def expiry(config: RolloutConfig, attempt: Attempt, at: float) -> AttemptStatus | None:
    """`timeout` past `timeout_seconds` since it started, `unresponsive` past `unresponsive_seconds` of
    silence (no span, no heartbeat), else None."""
    if attempt.status is not AttemptStatus.RUNNING:
        return None
    if config.timeout_seconds is not None and at - attempt.start_time > config.timeout_seconds:
        return AttemptStatus.TIMEOUT
    if config.unresponsive_seconds is not None and at - attempt.last_heartbeat_time > config.unresponsive_seconds:
        return AttemptStatus.UNRESPONSIVE
    return None


# ----------------------------------------------------------------------------- spans and heartbeats


def check_spans(spans: Sequence[Span]) -> None:
    """Refuse a batch with a span that names a rollout but no attempt, or carries a reward that is no number."""
    for span in spans:
        if span.rollout_id is not None and span.attempt_id is None:
            raise StoreError(f"span {span.name!r} names rollout {span.rollout_id!r} but no attempt_id")
        span_reward(span)


def span_reward(span: Span) -> float | None:
    """The reward a span carries (its `agentgrad.reward` attribute, when a number), checked finite."""
    value = span.attributes.get(REWARD)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return check_reward(value, f"the {REWARD} of span {span.name!r}")


def by_rollout(spans: Sequence[Span]) -> dict[str | None, list[int]]:
    """Indices of the spans of each rollout, in the order given."""
    groups: dict[str | None, list[int]] = {}
    for index, span in enumerate(spans):
        groups.setdefault(span.rollout_id, []).append(index)
    return groups


def sequence_spans(spans: Sequence[Span], next_id: int, known: dict[str, int]) -> tuple[list[Span], list[Span]]:
    """Give one rollout's new spans the next sequence ids; a span whose id is in `known` (rollout's span ids →
    sequence ids, updated here) is a retried write and gets its first sequence id back. Returns (all, new)."""
    stored, fresh = [], []
    for span in spans:
        if span.span_id and span.span_id in known:
            stored.append(span.model_copy(update={"sequence_id": known[span.span_id]}))
            continue
        span = span.model_copy(update={"sequence_id": next_id})
        next_id += 1
        if span.span_id:
            known[span.span_id] = span.sequence_id
        stored.append(span)
        fresh.append(span)
    return stored, fresh


def record_span(attempt: Attempt, span: Span, at: float) -> None:
    """A stored span is a heartbeat of its attempt, and the last reward it carries is the attempt's reward
    (a role's own reward, `emit_reward(agent=...)`, is not)."""
    attempt.last_heartbeat_time = at
    reward = span_reward(span)
    if reward is not None and attempt.status is AttemptStatus.RUNNING and REWARD_AGENT not in span.attributes:
        attempt.reward = reward


def heartbeat(
    worker: Worker | None,
    worker_id: str,
    *,
    status: WorkerStatus | str | None,
    active_attempts: Sequence[tuple[str, str]] | None,
    info: dict[str, Any] | None,
    at: float,
) -> Worker:
    """The worker after a heartbeat (its active attempts' heartbeat times are the backend's to touch)."""
    worker = worker or Worker(worker_id=worker_id, last_heartbeat_time=at)
    worker.last_heartbeat_time = at
    if status is not None:
        worker.status = WorkerStatus(status)
    if active_attempts is not None:
        worker.active_attempts = [attempt_id for _, attempt_id in active_attempts]
    if info:
        worker.info = {**worker.info, **info}
    return worker


# ----------------------------------------------------------------------------- resources


def new_snapshot(
    version: int, resources: NamedResources, metadata: dict[str, Any] | None, at: float
) -> ResourcesSnapshot:
    """Version `version` of the resources (`res-<version>`), the newest once stored."""
    return ResourcesSnapshot(
        resources_id=f"res-{version}", version=version, resources=resources, metadata=metadata or {}, create_time=at
    )
