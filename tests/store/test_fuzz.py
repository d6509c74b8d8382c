"""Schema-driven fuzzing: whatever schemathesis sends, from valid to mangled, the server answers
without a 5xx, with a documented status and a body that matches the schema.

`positive_data_acceptance` is left out: it expects a 2xx for every schema-valid body, but ids
that name nothing and numbers SQLite cannot hold are schema-valid and rightly refused (404, 422).

`POST /api/resources` is fuzzed with valid-shaped bodies only: schemathesis sometimes cannot
negate the tagged union of resources ("does not support a `not` whose complement is not
spelled out") and fails the run; its malformed bodies are tested by hand below.
"""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance
from starlette.testclient import TestClient

from agentgrad.store import SqliteStore
from agentgrad.store.server import create_app


@schemathesis.serializer("application/x-protobuf")
def as_bytes(ctx: object, value: object) -> bytes:
    """OTLP protobuf bodies are fuzzed as raw bytes."""
    return value if isinstance(value, bytes) else str(value).encode()


FOLDER = Path(tempfile.mkdtemp(prefix="agentgrad-fuzz-"))  # built at import, for schemathesis; gone at exit
atexit.register(shutil.rmtree, FOLDER, ignore_errors=True)
STORE = SqliteStore(FOLDER / "store.db")
asyncio.run(STORE.start_rollout({"seed": True}))
APP = create_app(STORE)
schema = schemathesis.openapi.from_asgi("/api/openapi.json", APP).exclude(path="/api/resources", method="POST")
resources_schema = schemathesis.openapi.from_asgi("/api/openapi.json", APP).include(path="/api/resources", method="POST")
resources_schema.config.generation.update(modes=[GenerationMode.POSITIVE])


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case: schemathesis.Case) -> None:
    if case.path == "/api/rollouts/wait" and isinstance(case.body, dict):
        timeout = case.body.get("timeout", 30)
        if type(timeout) in (int, float) and 0.05 < timeout <= 30:
            case.body["timeout"] = 0.05  # a long-poll on ids that never finish would hold each example 30 s
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


@resources_schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_resources_body_gets_a_server_error(case: schemathesis.Case) -> None:
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


def test_malformed_resources_are_refused_with_the_reason_and_change_nothing() -> None:
    client = TestClient(APP)
    before = client.get("/api/resources").json()
    for body, reason in (
        ({"resources": {"llm": {"resource_type": "gpu"}}}, "resource_type"),
        ({"resources": {"llm": {"resource_type": "llm"}}}, "base_url"),
        ({"resources": {"p": {"resource_type": "prompt_template", "template": 3}}}, "template"),
        ({"resources": ["not", "a", "mapping"]}, "resources"),
        ({"resources": {}, "metadata": "x"}, "metadata"),
    ):
        response = client.post("/api/resources", json=body)
        assert 400 <= response.status_code < 500 and reason in response.text, (body, response.text)
    assert client.get("/api/resources").json() == before
