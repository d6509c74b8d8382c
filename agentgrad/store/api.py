"""The store's HTTP API as data: one `Operation` per `Store` method, with its route and body.

The server builds its routes and its OpenAPI schema from `OPERATIONS`, and the client
dispatches from it (route, body model, answer type), so the two cannot drift apart. Everything lives under `/api/`, leaving the
rest of the server's paths to the gateway (`/v1/...`), OTLP ingest and the dashboard.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

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
    Run,
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
    """Request bodies refuse unknown fields, so a misspelt one is an error rather than ignored. A NaN or
    infinite number travels as such (not as null), for the store to refuse it with the reason."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class EnqueueBody(Body):
    requests: list[RolloutRequest]


class StartBody(Body):
    input: Any = None
    mode: str | None = None
    resources_id: str | None = None
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    worker_id: str | None = None


class DequeueBody(Body):
    worker_id: str | None = None


class QueryRolloutsBody(Body):
    status: list[RolloutStatus] | None = None
    mode: str | None = None
    rollout_ids: list[str] | None = None
    limit: int | None = Field(None, ge=0, le=MAX_INT)
    offset: int = Field(0, ge=0, le=MAX_INT)


class WaitBody(Body):
    rollout_ids: list[str]
    timeout: float = Field(LONG_POLL_SECONDS, ge=0, le=LONG_POLL_SECONDS, description="Seconds to hold the request.")


class UpdateRolloutBody(Body):
    status: RolloutStatus | None = None
    metadata: dict[str, Any] | None = None


class UpdateAttemptBody(Body):
    status: AttemptStatus | None = None
    reward: float | None = None
    error: str | None = None


class CheckAttemptsBody(Body):
    force: bool = False


class AddSpansBody(Body):
    spans: list[Span]


class AddSpansReply(BaseModel):
    sequence_ids: list[int] = Field(description="The sequence id the store gave each span, in order.")


class SpansQuery(Body):
    rollout_id: str | None = Field(None, description="Omit for the spans recorded outside any rollout.")
    attempt_id: str | None = None
    all_attempts: bool = False


class SpansOfBody(Body):
    rollout_ids: list[str]


class AddResourcesBody(Body):
    resources: NamedResources
    metadata: dict[str, Any] = Field(default_factory=dict)


class UpdateResourcesBody(Body):
    metadata: dict[str, Any]


class HeartbeatBody(Body):
    worker_id: str
    status: WorkerStatus | None = None
    active_attempts: list[tuple[str, str]] | None = Field(None, description="(rollout id, attempt id) pairs.")
    info: dict[str, Any] | None = None


class AddMetricsBody(Body):
    metrics: list[Metric]

    @model_validator(mode="after")
    def _finite(self) -> AddMetricsBody:
        """JSON has no NaN or infinity: such a value would read back as null, so the server refuses it."""
        for index, metric in enumerate(self.metrics):
            if not math.isfinite(metric.value):
                raise ValueError(
                    f"metrics[{index}].value ({metric.name!r} at step {metric.step}) is {metric.value}, "
                    "not a finite number; send finite values"
                )
        return self


class MetricsQuery(Body):
    name: str | None = None
    prefix: str | None = None
    run_id: str | None = None


class PutRunBody(Body):
    run: Run


@dataclass(frozen=True)
class Operation:
    """One endpoint: the `Store` method it calls (`name`), its route, and how its input travels.

    Path parameters and the fields of `body` (or `query`) are the method's keyword arguments, by
    name: the server calls `getattr(store, name)(**path, **fields)`, the client builds the same
    body from its arguments. `once` marks the writes whose repeat would change more than the first
    try did: the client sends them with an idempotency key and the store applies each key once
    (a repeated heartbeat or health scan changes nothing more, so they go without). `reply` turns
    the method's result into what goes on the wire, when that differs. `repeat_safe` says of a body
    whether the store recognizes its repeat by its content (spans that all carry an id: a span id
    already stored gets its first sequence id back), so its key needs no stored answer.
    """

    name: str
    method: str
    path: str
    response: Any
    summary: str
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    once: bool = False
    reply: Callable[[Any], Any] | None = None
    repeat_safe: Callable[[Any], bool] | None = None

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"{(\w+)}", self.path)


def _sequence_ids(spans: list[Span]) -> AddSpansReply:
    return AddSpansReply(sequence_ids=[span.sequence_id for span in spans])


def _all_have_ids(body: AddSpansBody) -> bool:
    return all(span.span_id for span in body.spans)


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "enqueue_rollouts",
        "POST",
        "/api/rollouts",
        list[Rollout],
        "Queue new rollouts, in order.",
        body=EnqueueBody,
        once=True,
    ),
    Operation(
        "query_rollouts",
        "POST",
        "/api/rollouts/query",
        list[Rollout],
        "Rollouts in enqueue order, filtered and paginated.",
        body=QueryRolloutsBody,
    ),
    Operation(
        "dequeue_rollout",
        "POST",
        "/api/rollouts/dequeue",
        AttemptedRollout | None,
        "Claim the oldest waiting rollout with a new attempt; null if none waits.",
        body=DequeueBody,
        once=True,
    ),
    Operation(
        "start_rollout",
        "POST",
        "/api/rollouts/start",
        AttemptedRollout,
        "Create a rollout already running with its first attempt.",
        body=StartBody,
        once=True,
    ),
    Operation(
        "wait_for_rollouts",
        "POST",
        "/api/rollouts/wait",
        list[Rollout],
        "Hold the request until every rollout is finished or `timeout` passes; returns the finished.",
        body=WaitBody,
    ),
    Operation("get_rollout", "GET", "/api/rollouts/{rollout_id}", Rollout, "One rollout."),
    Operation(
        "update_rollout",
        "PATCH",
        "/api/rollouts/{rollout_id}",
        Rollout,
        "Cancel a rollout or merge keys into its metadata.",
        body=UpdateRolloutBody,
        once=True,
    ),
    Operation(
        "query_attempts",
        "GET",
        "/api/rollouts/{rollout_id}/attempts",
        list[Attempt],
        "Attempts of a rollout, first to last.",
    ),
    Operation(
        "update_attempt",
        "PATCH",
        "/api/rollouts/{rollout_id}/attempts/{attempt_id}",
        Attempt,
        "End an attempt or record its reward.",
        body=UpdateAttemptBody,
        once=True,
    ),
    Operation(
        "check_attempts",
        "POST",
        "/api/attempts/check",
        None,
        "Mark timed-out and unresponsive attempts now.",
        body=CheckAttemptsBody,
    ),
    Operation(
        "add_spans",
        "POST",
        "/api/spans",
        AddSpansReply,
        "Store spans; each gets the next sequence id of its rollout.",
        body=AddSpansBody,
        once=True,
        reply=_sequence_ids,
        repeat_safe=_all_have_ids,
    ),
    Operation(
        "query_spans",
        "GET",
        "/api/spans",
        list[Span],
        "Spans of a rollout's latest attempt, of one attempt, or of all attempts.",
        query=SpansQuery,
    ),
    Operation(
        "query_spans_of",
        "POST",
        "/api/spans/query",
        dict[str, list[Span]],
        "The spans of each rollout's latest attempt, keyed by rollout id (one read for many rollouts).",
        body=SpansOfBody,
    ),
    Operation(
        "add_resources",
        "POST",
        "/api/resources",
        ResourcesSnapshot,
        "Store a new version of the resources.",
        body=AddResourcesBody,
        once=True,
    ),
    Operation("query_resources", "GET", "/api/resources", list[ResourcesSnapshot], "Every snapshot, oldest first."),
    Operation(
        "get_latest_resources",
        "GET",
        "/api/resources/latest",
        ResourcesSnapshot | None,
        "The newest snapshot, or null.",
    ),
    Operation("get_resources", "GET", "/api/resources/{resources_id}", ResourcesSnapshot, "One snapshot."),
    Operation(
        "update_resources",
        "PATCH",
        "/api/resources/{resources_id}",
        ResourcesSnapshot,
        "Merge keys into a snapshot's metadata.",
        body=UpdateResourcesBody,
        once=True,
    ),
    Operation(
        "heartbeat",
        "POST",
        "/api/workers/heartbeat",
        Worker,
        "A worker is alive, with the attempts it runs.",
        body=HeartbeatBody,
    ),
    Operation("query_workers", "GET", "/api/workers", list[Worker], "Every worker."),
    Operation(
        "add_metrics", "POST", "/api/metrics", None, "Append points to training curves.", body=AddMetricsBody, once=True
    ),
    Operation(
        "query_metrics", "GET", "/api/metrics", list[Metric], "Points by exact name or name prefix.", query=MetricsQuery
    ),
    Operation("latest_metrics", "GET", "/api/metrics/latest", list[Metric], "The newest point of each curve, by time."),
    Operation(
        "put_run", "POST", "/api/runs", Run, "Record a run, or replace its record by id.", body=PutRunBody, once=True
    ),
    Operation("query_runs", "GET", "/api/runs", list[Run], "Every run, by start time."),
    Operation("get_run", "GET", "/api/runs/{run_id}", Run, "One run."),
    Operation("stats", "GET", "/api/stats", StoreStats, "Counts by status."),
)

BY_NAME: dict[str, Operation] = {operation.name: operation for operation in OPERATIONS}


def arguments(operation: Operation, model: BaseModel | None, path: dict[str, str]) -> dict[str, Any]:
    """The store method's keyword arguments: path parameters and the body's (or query's) fields."""
    fields = {} if model is None else {name: getattr(model, name) for name in type(model).model_fields}
    return {**path, **fields}


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
        "/api/health": {
            "get": {
                "operationId": "health",
                "summary": "Is the server up?",
                "responses": {"200": {"description": "up", "content": {JSON: {"schema": {"type": "object"}}}}},
            }
        },
    }
    for operation in operations:
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in re.findall(r"{(\w+)}", operation.path)
        ]
        if operation.query is not None:
            query = schema_of(operation.query)
            for name, prop in query["properties"].items():
                parameters.append(
                    {"name": name, "in": "query", "required": name in query.get("required", ()), "schema": prop}
                )
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
    paths["/v1/traces"] = {
        "post": {
            "operationId": "otlp_traces",
            "summary": "OTLP/HTTP trace export (protobuf or JSON); spans with agentgrad.rollout_id land in that rollout.",
            "requestBody": {
                "required": True,
                "content": {
                    JSON: {"schema": {"type": "object"}},
                    "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
                },
            },
            "responses": {
                "200": {
                    "description": "accepted, maybe partially",
                    "content": {
                        JSON: {"schema": {"type": "object"}},
                        "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
                    },
                },
                "default": {"description": "what was wrong", "content": {JSON: {"schema": errors}}},
            },
        }
    }
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
