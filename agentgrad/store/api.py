"""The store's HTTP API as data: one `Operation` per `Store` method, with its route and body.

The server builds its routes and its OpenAPI schema from `OPERATIONS`; the client sends the
same body models, so the two cannot drift apart. Everything lives under `/api/`, leaving the
rest of the server's paths to the gateway (`/v1/...`), OTLP ingest and the dashboard.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from agentgrad.store.base import Store
from agentgrad.types import (
    Attempt,
    AttemptedRollout,
    AttemptStatus,
    Metric,
    NamedResources,
    ResourcesSnapshot,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
    Worker,
    WorkerStatus,
)

LONG_POLL_SECONDS = 30.0
"""Longest a `wait` request is held open by the server; the client asks again until its own timeout."""

JSON = "application/json"

MAX_INT = 2**63 - 1
"""Largest count or offset accepted (what SQLite can hold)."""


class Body(BaseModel):
    """Request bodies refuse unknown fields, so a misspelt one is an error rather than ignored."""

    model_config = ConfigDict(extra="forbid")


class EnqueueBody(Body):
    requests: list[RolloutRequest]


class StartBody(Body):
    input: Any = None
    mode: Optional[str] = None
    resources_id: Optional[str] = None
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    worker_id: Optional[str] = None


class DequeueBody(Body):
    worker_id: Optional[str] = None


class QueryRolloutsBody(Body):
    status: Optional[list[RolloutStatus]] = None
    mode: Optional[str] = None
    rollout_ids: Optional[list[str]] = None
    limit: Optional[int] = Field(None, ge=0, le=MAX_INT)
    offset: int = Field(0, ge=0, le=MAX_INT)


class WaitBody(Body):
    rollout_ids: list[str]
    timeout: float = Field(LONG_POLL_SECONDS, ge=0, le=LONG_POLL_SECONDS, description="Seconds to hold the request.")


class UpdateRolloutBody(Body):
    status: Optional[RolloutStatus] = None
    metadata: Optional[dict[str, Any]] = None


class UpdateAttemptBody(Body):
    status: Optional[AttemptStatus] = None
    reward: Optional[float] = None
    error: Optional[str] = None


class CheckAttemptsBody(Body):
    force: bool = False


class AddSpansBody(Body):
    spans: list[Span]


class AddSpansReply(BaseModel):
    sequence_ids: list[int] = Field(description="The sequence id the store gave each span, in order.")


class SpansQuery(Body):
    rollout_id: Optional[str] = Field(None, description="Omit for the spans recorded outside any rollout.")
    attempt_id: Optional[str] = None
    all_attempts: bool = False


class AddResourcesBody(Body):
    resources: NamedResources
    metadata: dict[str, Any] = Field(default_factory=dict)


class UpdateResourcesBody(Body):
    metadata: dict[str, Any]


class HeartbeatBody(Body):
    worker_id: str
    status: Optional[WorkerStatus] = None
    active_attempts: Optional[list[tuple[str, str]]] = Field(None, description="(rollout id, attempt id) pairs.")
    info: Optional[dict[str, Any]] = None


class AddMetricsBody(Body):
    metrics: list[Metric]


class MetricsQuery(Body):
    name: Optional[str] = None
    prefix: Optional[str] = None


@dataclass(frozen=True)
class Operation:
    """One endpoint: `call(store, body_or_query, **path_params)` does the work."""

    name: str
    method: str
    path: str
    call: Callable[..., Awaitable[Any]]
    response: Any
    summary: str
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None


async def _add_spans(store: Store, body: AddSpansBody) -> AddSpansReply:
    return AddSpansReply(sequence_ids=[span.sequence_id for span in await store.add_spans(body.spans)])


async def _wait(store: Store, body: WaitBody) -> list[Rollout]:
    return await store.wait_for_rollouts(body.rollout_ids, timeout=body.timeout)


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "enqueue_rollouts", "POST", "/api/rollouts", lambda s, b: s.enqueue_rollouts(b.requests),
        list[Rollout], "Queue new rollouts, in order.", body=EnqueueBody,
    ),
    Operation(
        "query_rollouts", "POST", "/api/rollouts/query",
        lambda s, b: s.query_rollouts(
            status=b.status, mode=b.mode, rollout_ids=b.rollout_ids, limit=b.limit, offset=b.offset
        ),
        list[Rollout], "Rollouts in enqueue order, filtered and paginated.", body=QueryRolloutsBody,
    ),
    Operation(
        "dequeue_rollout", "POST", "/api/rollouts/dequeue", lambda s, b: s.dequeue_rollout(b.worker_id),
        Optional[AttemptedRollout], "Claim the oldest waiting rollout with a new attempt; null if none waits.",
        body=DequeueBody,
    ),
    Operation(
        "start_rollout", "POST", "/api/rollouts/start",
        lambda s, b: s.start_rollout(
            b.input, mode=b.mode, resources_id=b.resources_id, config=b.config, metadata=b.metadata,
            worker_id=b.worker_id,
        ),
        AttemptedRollout, "Create a rollout already running with its first attempt.", body=StartBody,
    ),
    Operation(
        "wait_for_rollouts", "POST", "/api/rollouts/wait", _wait,
        list[Rollout], "Hold the request until every rollout is finished or `timeout` passes; returns the finished.",
        body=WaitBody,
    ),
    Operation(
        "get_rollout", "GET", "/api/rollouts/{rollout_id}", lambda s, _, rollout_id: s.get_rollout(rollout_id),
        Rollout, "One rollout.",
    ),
    Operation(
        "update_rollout", "PATCH", "/api/rollouts/{rollout_id}",
        lambda s, b, rollout_id: s.update_rollout(rollout_id, status=b.status, metadata=b.metadata),
        Rollout, "Cancel a rollout or merge keys into its metadata.", body=UpdateRolloutBody,
    ),
    Operation(
        "query_attempts", "GET", "/api/rollouts/{rollout_id}/attempts",
        lambda s, _, rollout_id: s.query_attempts(rollout_id), list[Attempt], "Attempts of a rollout, first to last.",
    ),
    Operation(
        "update_attempt", "PATCH", "/api/rollouts/{rollout_id}/attempts/{attempt_id}",
        lambda s, b, rollout_id, attempt_id: s.update_attempt(
            rollout_id, attempt_id, status=b.status, reward=b.reward, error=b.error
        ),
        Attempt, "End an attempt or record its reward.", body=UpdateAttemptBody,
    ),
    Operation(
        "check_attempts", "POST", "/api/attempts/check", lambda s, b: s.check_attempts(b.force),
        None, "Mark timed-out and unresponsive attempts now.", body=CheckAttemptsBody,
    ),
    Operation(
        "add_spans", "POST", "/api/spans", _add_spans,
        AddSpansReply, "Store spans; each gets the next sequence id of its rollout.", body=AddSpansBody,
    ),
    Operation(
        "query_spans", "GET", "/api/spans",
        lambda s, q: s.query_spans(q.rollout_id, q.attempt_id, all_attempts=q.all_attempts),
        list[Span], "Spans of a rollout's latest attempt, of one attempt, or of all attempts.", query=SpansQuery,
    ),
    Operation(
        "add_resources", "POST", "/api/resources", lambda s, b: s.add_resources(b.resources, b.metadata),
        ResourcesSnapshot, "Store a new version of the resources.", body=AddResourcesBody,
    ),
    Operation(
        "query_resources", "GET", "/api/resources", lambda s, _: s.query_resources(),
        list[ResourcesSnapshot], "Every snapshot, oldest first.",
    ),
    Operation(
        "get_latest_resources", "GET", "/api/resources/latest", lambda s, _: s.get_latest_resources(),
        Optional[ResourcesSnapshot], "The newest snapshot, or null.",
    ),
    Operation(
        "get_resources", "GET", "/api/resources/{resources_id}",
        lambda s, _, resources_id: s.get_resources(resources_id), ResourcesSnapshot, "One snapshot.",
    ),
    Operation(
        "update_resources", "PATCH", "/api/resources/{resources_id}",
        lambda s, b, resources_id: s.update_resources(resources_id, b.metadata),
        ResourcesSnapshot, "Merge keys into a snapshot's metadata.", body=UpdateResourcesBody,
    ),
    Operation(
        "heartbeat", "POST", "/api/workers/heartbeat",
        lambda s, b: s.heartbeat(b.worker_id, status=b.status, active_attempts=b.active_attempts, info=b.info),
        Worker, "A worker is alive, with the attempts it runs.", body=HeartbeatBody,
    ),
    Operation("query_workers", "GET", "/api/workers", lambda s, _: s.query_workers(), list[Worker], "Every worker."),
    Operation(
        "add_metrics", "POST", "/api/metrics", lambda s, b: s.add_metrics(b.metrics),
        None, "Append points to training curves.", body=AddMetricsBody,
    ),
    Operation(
        "query_metrics", "GET", "/api/metrics", lambda s, q: s.query_metrics(q.name, q.prefix),
        list[Metric], "Points by exact name or name prefix.", query=MetricsQuery,
    ),
    Operation("stats", "GET", "/api/stats", lambda s, _: s.stats(), StoreStats, "Counts by status."),
)


def openapi_schema(operations: Sequence[Operation] = OPERATIONS) -> dict[str, Any]:
    """OpenAPI 3.1 for the store API, from the pydantic models that validate its requests."""
    components: dict[str, Any] = {
        "Error": {
            "type": "object",
            "properties": {"error": {"type": "string"}, "detail": {"type": "string"}},
            "required": ["error", "detail"],
        }
    }

    def schema_of(annotation: Any) -> dict[str, Any]:
        schema = TypeAdapter(annotation).json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        return schema

    errors = {"$ref": "#/components/schemas/Error"}
    paths: dict[str, Any] = {
        "/api/health": {"get": {"operationId": "health", "summary": "Is the server up?", "responses": {"200": {
            "description": "up", "content": {JSON: {"schema": {"type": "object"}}}}}}},
    }
    for operation in operations:
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in re.findall(r"{(\w+)}", operation.path)
        ]
        if operation.query is not None:
            query = schema_of(operation.query)
            for name, prop in query["properties"].items():
                parameters.append({"name": name, "in": "query", "required": name in query.get("required", ()), "schema": prop})
        entry: dict[str, Any] = {
            "operationId": operation.name,
            "summary": operation.summary,
            "parameters": parameters,
            "responses": {
                "200": {"description": operation.summary, "content": {JSON: {"schema": schema_of(operation.response)}}},
                "default": {"description": "what was wrong", "content": {JSON: {"schema": errors}}},
            },
        }
        if operation.body is not None:
            required = any(field.is_required() for field in operation.body.model_fields.values())
            entry["requestBody"] = {"required": required, "content": {JSON: {"schema": schema_of(operation.body)}}}
        paths.setdefault(operation.path, {})[operation.method.lower()] = entry
    paths["/v1/traces"] = {"post": {
        "operationId": "otlp_traces",
        "summary": "OTLP/HTTP trace export (protobuf or JSON); spans with agentgrad.rollout_id land in that rollout.",
        "requestBody": {"required": True, "content": {
            JSON: {"schema": {"type": "object"}},
            "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
        }},
        "responses": {
            "200": {"description": "accepted, maybe partially", "content": {
                JSON: {"schema": {"type": "object"}},
                "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
            }},
            "default": {"description": "what was wrong", "content": {JSON: {"schema": errors}}},
        },
    }}
    _tagged_unions(paths, components)
    return {
        "openapi": "3.1.0",
        "info": {"title": "agentgrad store", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }


def _tagged_unions(paths: dict[str, Any], components: dict[str, Any]) -> None:
    """Spell pydantic's discriminated unions (resources) as what they are: the tag is required in each
    variant, so the variants exclude one another and `anyOf` says the same as `oneOf`, in a form
    schema-driven tools can generate from (schemathesis cannot always negate a `oneOf`)."""
    stack: list[Any] = [paths, components]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "discriminator" in node and "oneOf" in node:
                node["anyOf"] = node.pop("oneOf")
                tag = node["discriminator"]["propertyName"]
                for ref in node["discriminator"].get("mapping", {}).values():
                    variant = components[ref.rsplit("/", 1)[-1]]
                    variant["required"] = sorted({*variant.get("required", ()), tag})
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
