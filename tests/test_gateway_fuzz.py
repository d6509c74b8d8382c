"""Schema-driven fuzzing of the gateway, as tests/store/test_fuzz.py does the store: whatever
schemathesis sends, valid or mangled, the gateway answers without a 5xx of its own, with a
documented status and OpenAI's error shape.

The gateway has no OpenAPI document of its own (it proxies OpenAI's API), so the part of OpenAI's
it reads is written out here. Its upstream answers every call with one canned completion, so any
5xx would be the gateway's own. (This fuzz found the 405 without an `Allow` header.)
"""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import negative_data_rejection, positive_data_acceptance
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentgrad.gateway import Backend, Gateway
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore

CANNED = {
    "id": "chatcmpl-canned", "object": "chat.completion", "created": 0, "model": "policy",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop",
                 "logprobs": {"content": [{"token": "ok", "logprob": -0.1, "bytes": [111, 107], "top_logprobs": []}]},
                 "token_ids": [1, 2], "text": "ok"}],
    "prompt_token_ids": [3, 4], "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
}


async def canned(request: Request) -> JSONResponse:
    await request.body()
    return JSONResponse(CANNED)


UPSTREAM = ServerThread(Starlette(routes=[Route("/v1/{path:path}", canned, methods=["POST"])])).start()
GATEWAY = ServerThread(Gateway(MemoryStore(), {"policy": Backend(UPSTREAM.url + "/v1")}, max_retries=0)).start()

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"}}}}}
MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"enum": ["system", "user", "assistant", "tool"]}, "content": {"type": "string"}}}
SAMPLING = {
    "model": {"enum": ["policy", "unknown-model"]},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "max_tokens": {"type": "integer", "minimum": 1},
    "n": {"type": "integer", "minimum": 1, "maximum": 4},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]},
    "seed": {"type": "integer"},
    "logprobs": {"type": "boolean"},
}


def answers(ok: dict[str, Any], *errors: int) -> dict[str, Any]:
    documented = {"200": {"description": "the upstream's answer", "content": {"application/json": {"schema": ok}}}}
    for status in errors:
        documented[str(status)] = {"description": "refused", "content": {"application/json": {"schema": ERROR}}}
    return documented


def post(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    body = {"type": "object", "required": required, "properties": {**SAMPLING, **properties}}
    return {"post": {
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "parameters": [{"name": "x-agentgrad-rollout-id", "in": "header", "required": False, "schema": {"type": "string"}}],
        "responses": answers({"type": "object"}, 400, 403, 404, 413, 502),
    }}


CHAT = post({"messages": {"type": "array", "items": MESSAGE, "minItems": 1}}, ["model", "messages"])
ROUTE = [{"name": name, "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[a-z0-9-]{1,12}$"}}
         for name in ("rollout_id", "attempt_id")]
OPENAPI = {
    "openapi": "3.0.3",
    "info": {"title": "agentgrad gateway (the OpenAI API it proxies)", "version": "1"},
    "paths": {
        "/v1/chat/completions": CHAT,
        "/v1/completions": post({"prompt": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]}},
                                ["model", "prompt"]),
        "/rollouts/{rollout_id}/attempts/{attempt_id}/v1/chat/completions": {**CHAT, "parameters": ROUTE},
        "/v1/models": {"get": {"responses": answers({"type": "object", "required": ["data"]}, 400)}},
        "/v1/agentgrad/flush": {"post": {"responses": answers({"type": "object"}, 400)}},
    },
}
schema = schemathesis.openapi.from_dict(OPENAPI)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error_from_the_gateway(case: schemathesis.Case) -> None:
    # The gateway judges only what it reads (`agentgrad.gateway.checks`); the rest of a body is the upstream's to
    # refuse, so a schema-violating `temperature` rightly reaches it: `negative_data_rejection` is left out.
    case.call_and_validate(base_url=GATEWAY.url, excluded_checks=[positive_data_acceptance, negative_data_rejection])
