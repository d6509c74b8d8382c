"""Schema-driven fuzzing: whatever schemathesis sends, from valid to mangled, the server answers
without a 5xx, with a documented status and a body that matches the schema.

`positive_data_acceptance` is left out: it expects a 2xx for every schema-valid body, but ids
that name nothing and numbers SQLite cannot hold are schema-valid and rightly refused (404, 422).
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from agentgrad.store import SqliteStore
from agentgrad.store.server import create_app


@schemathesis.serializer("application/x-protobuf")
def as_bytes(ctx: object, value: object) -> bytes:
    """OTLP protobuf bodies are fuzzed as raw bytes."""
    return value if isinstance(value, bytes) else str(value).encode()


STORE = SqliteStore(Path(tempfile.mkdtemp(prefix="agentgrad-fuzz-")) / "store.db")
asyncio.run(STORE.start_rollout({"seed": True}))
schema = schemathesis.openapi.from_asgi("/api/openapi.json", create_app(STORE))


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case: schemathesis.Case) -> None:
    if case.path == "/api/rollouts/wait" and isinstance(case.body, dict):
        timeout = case.body.get("timeout", 30)
        if type(timeout) in (int, float) and 0.05 < timeout <= 30:
            case.body["timeout"] = 0.05  # a long-poll on ids that never finish would hold each example 30 s
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
