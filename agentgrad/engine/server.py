"""The engine as an OpenAI-compatible HTTP backend: chat completions, completions, responses, models, and
Anthropic's messages.

Token ids and logprobs follow vLLM's wire format, so the gateway reads them the same way
from the local engine and from a vLLM server: with `return_token_ids: true` a chat response
carries top-level `prompt_token_ids` and per-choice `token_ids`; `logprobs: true` adds
`choices[i].logprobs.content`. Every response names the weights version that produced it,
in the `x-agentgrad-model-version` header and as `system_fingerprint`. The routes live in
`chat.py`, `completions.py` and `responses.py`; what each parameter does is in `api.py`. `GET /metrics` is
Prometheus's: requests by route and status, and the engine's batch, tokens and caches (`metrics.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agentgrad.engine.api import RequestError, error
from agentgrad.engine.chat import chat_completions
from agentgrad.engine.completions import completions
from agentgrad.engine.engine import Engine
from agentgrad.engine.messages import messages
from agentgrad.engine.metrics import EngineCollector
from agentgrad.engine.responses import responses
from agentgrad.engine.wire import VERSION_HEADER, ClientGone, model_names
from agentgrad.serving.metrics import ServerMetrics, instrument

__all__ = ["VERSION_HEADER", "create_engine_app"]

log = logging.getLogger(__name__)

Handler = Callable[[Engine, list[str], Request], Awaitable[Response]]


def create_engine_app(engine: Engine, served_names: list[str] | None = None) -> Starlette:
    """An ASGI app serving `engine`; `served_names` are the model names its base answers to, and each adapter it
    holds answers to its own name (`adapters.load_adapters`), listed in `/v1/models` with its `parent` as vLLM lists
    LoRA modules.

    `/health` says only that the engine is up and its weights version; put the app behind
    `guard.Guard(app, token=...)` (as `agentgrad engine serve --token` does) to require the token there too, and on
    `/metrics` (`app.state.metrics`).
    """
    names = served_names or [engine.name]

    def route(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(engine, model_names(engine, names), request)
            except RequestError as exc:
                return exc.response()
            except ClientGone:
                return Response(status_code=499)
            except Exception:  # a bug here must not look like the client's fault, nor take the server down
                log.exception("engine request failed")
                return error(500, "the engine failed on this request; see the engine's log", "server_error")

        return endpoint

    async def models(request: Request) -> Response:
        base = [{"id": n, "object": "model", "created": 0, "owned_by": "agentgrad"} for n in names]
        adapters = [
            {"id": n, "object": "model", "created": 0, "owned_by": "agentgrad", "parent": names[0]}
            for n in model_names(engine, names)[len(names) :]
        ]
        return JSONResponse({"object": "list", "data": base + adapters})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": engine.version})

    metrics = ServerMetrics()
    metrics.add(EngineCollector(engine))
    app = Starlette(
        middleware=[Middleware(instrument, metrics=metrics, server="engine")],
        routes=[
            Route("/v1/chat/completions", route(chat_completions), methods=["POST"]),
            Route("/v1/completions", route(completions), methods=["POST"]),
            Route("/v1/responses", route(responses), methods=["POST"]),
            Route("/v1/messages", route(messages), methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
    )
    app.state.metrics = metrics
    return app
