"""Schema-driven fuzzing of the engine server behind the guard, as `agentgrad engine serve` runs it:
whatever schemathesis sends, the engine answers without a 5xx, in OpenAI's error shape.

The engine serves OpenAI's API and no OpenAPI document; the part it implements is written out
here, with small `max_tokens` so each example generates a few tokens at most.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import negative_data_rejection, positive_data_acceptance

from agentgrad.engine.server import create_engine_app
from agentgrad.serving import ServerThread


@pytest.fixture(scope="module")
def engine(tiny_engine: Any) -> Any:
    """Wiring, not what the model says: the tiny SmolLM2-family model (tests/tiny_models.py)."""
    return tiny_engine

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"}}}}}
SAMPLING = {
    "model": {"enum": ["tiny-smollm2", "unknown-model"]},  # the name the tiny engine serves
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 3},
    "n": {"type": "integer", "minimum": 1, "maximum": 2},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 2}]},
    "seed": {"type": "integer", "minimum": 0, "maximum": 2**32},
    "return_token_ids": {"type": "boolean"},
}


def post(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    body = {"type": "object", "required": [*required, "max_tokens"], "properties": {**SAMPLING, **properties}}
    responses: dict[str, Any] = {"200": {"description": "a completion", "content": {"application/json": {"schema": {"type": "object"}}}}}
    for status in (400, 403, 404, 413, 422):
        responses[str(status)] = {"description": "refused", "content": {"application/json": {"schema": ERROR}}}
    return {"post": {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                     "responses": responses}}


MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"enum": ["system", "user", "assistant"]}, "content": {"type": "string", "maxLength": 40}}}
OPENAPI = {
    "openapi": "3.0.3",
    "info": {"title": "agentgrad engine (the OpenAI API it serves)", "version": "1"},
    "paths": {
        "/v1/chat/completions": post({"messages": {"type": "array", "items": MESSAGE, "minItems": 1, "maxItems": 3}},
                                     ["model", "messages"]),
        "/v1/completions": post({"prompt": {"type": "string", "maxLength": 40}}, ["model", "prompt"]),
    },
}
schema = schemathesis.openapi.from_dict(OPENAPI)


@pytest.fixture(scope="module")
def engine_url(engine: Any) -> Iterator[str]:
    with ServerThread(create_engine_app(engine)) as server:
        yield server.url


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error_from_the_engine(case: schemathesis.Case, engine_url: str) -> None:
    # a generous read timeout: the check is the status and shape of each answer, not its latency on a loaded machine
    case.call_and_validate(
        base_url=engine_url, timeout=120, excluded_checks=[positive_data_acceptance, negative_data_rejection]
    )
