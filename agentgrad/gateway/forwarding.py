"""A call's way to its upstream: routed by the table, checked, answered from the cache or sent within its deadline,
its answer handed to `relay.py` for the way back; every outcome recorded.

`app.Gateway` reads and routes the agent's request, then runs `forward` as a task of its own (cancelled, and the
upstream request with it, when the agent hangs up). Each call has one deadline (connect, first byte, total:
`upstreams.Deadline`; the gateway's own limits override the backend's); a wait for the upstream's rate limit counts
against it, and retries happen within it, only where no byte of an answer exists yet. Whatever goes wrong upstream,
the agent gets an OpenAI-style JSON error (502 broken, 504 too slow; an error event ending a stream already begun)
and the call is a span with that error.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

import agentgrad.gateway.messages as messages
import agentgrad.gateway.routing as routing
from agentgrad import semconv as sc
from agentgrad.gateway.checks import request_problem
from agentgrad.gateway.recording import Call, upstream_headers
from agentgrad.gateway.relay import Recorder, fail, relay_answer, relay_stream
from agentgrad.gateway.table import RouteTable
from agentgrad.gateway.upstreams import Deadline, GatewayError, post_with_retries
from agentgrad.semconv import MESSAGES_API


async def forward(
    call: Call,
    send: Any,
    table: RouteTable,
    *,
    session: Any,
    recorder: Recorder,
    cache: routing.ResponseCache,
    timeouts: tuple[float | None, float | None, float | None],
    max_retries: int,
    backoff_s: float,
) -> None:
    """Send the call upstream, as `table` routes it, within its deadline and relay the answer; every outcome is
    recorded. `session` is the gateway's aiohttp pool; `timeouts` (connect, first byte, total) and `max_retries`
    override the backend's own where not None (a backend's `max_retries` wins over the gateway's)."""
    import aiohttp

    model, request = call.request["model"], call.request
    named, router = table.route(model)
    lease = await router.acquire(call.rollout_id, call.agent) if router is not None else None  # held through a sync
    upstream = lease.upstream if lease is not None else (named or table.default)
    call.upstream = upstream
    call.arm = getattr(lease, "arm", None)  # an A/B split's (agentgrad.gateway.ab)
    call.adapter = getattr(lease, "adapter", None)  # a pool of LoRA adapters': the agent's (vLLM names none)
    try:
        if upstream is None:
            await fail(
                send,
                call,
                GatewayError(
                    404,
                    f"model {model!r} is not served by this gateway; known models: {sorted(table.upstreams)}",
                    "invalid_request_error",
                    "model_not_found",
                ),
                recorder,
            )
            return
        problem = messages.request_problem(request) if call.api == MESSAGES_API else request_problem(call.api, request)
        if problem is not None:
            return await fail(
                send, call, GatewayError(400, problem, "invalid_request_error", "invalid_request"), recorder
            )
        try:
            outgoing, added = upstream.prepare(request, call.api)
        except orjson.JSONEncodeError as exc:  # nested too deep to re-encode
            return await fail(
                send, call, GatewayError(400, f"cannot forward this request: {exc}", "invalid_request_error"), recorder
            )
        call.token_ids_asked = added.asked
        backend = upstream.backend
        url = upstream.urls[call.api]
        cache_key = (url, call.api, outgoing) if backend.cache and not request.get("stream") else None
        cached = cache.get(cache_key) if cache_key is not None else None
        if cached is not None:
            call.sampling[sc.CACHE_HIT] = True
            return await relay_answer(send, call, cached, added, None, 0, recorder)
        limiter = table.limiters.get(upstream.name)
        connect_s, first_byte_s, total_s = (
            ours if ours is not None else theirs
            for ours, theirs in zip(
                timeouts, (backend.connect_timeout_s, backend.first_byte_timeout_s, backend.timeout_s)
            )
        )
        deadline = Deadline.start(connect_s, first_byte_s, total_s)
        retries, response = 0, None
        try:
            try:
                async with asyncio.timeout_at(deadline.ends):  # a wait for the rate limit counts too
                    if limiter is not None:
                        await limiter.acquire(routing.request_tokens(request, len(outgoing)))
                    response, retries = await post_with_retries(
                        session,
                        upstream,
                        call.api,
                        outgoing,
                        deadline=deadline,
                        max_retries=max_retries if backend.max_retries is None else backend.max_retries,
                        backoff_s=backoff_s,
                        headers=upstream_headers(call),
                    )
                    streamed = (
                        bool(request.get("stream"))
                        and response.content_type == "text/event-stream"
                        and response.status < 400
                    )
                    if not streamed:
                        payload = await response.read()  # a stall or a cut here: a 504 / 502 below
            except GatewayError as error:
                return await fail(send, call, error, recorder)
            except TimeoutError as exc:
                return await fail(send, call, deadline.error(upstream, url, exc, retries), recorder)
            except aiohttp.ClientError as exc:
                message = f"upstream {upstream.name!r} at {url} broke off its answer: {type(exc).__name__}: {exc}"
                interrupted = GatewayError(502, message, "upstream_error", "upstream_interrupted", retries)
                return await fail(send, call, interrupted, recorder)
            version = response.headers.get(sc.VERSION_HEADER) or (str(lease.version) if lease else None)
            call.adapter = response.headers.get(sc.ADAPTER_HEADER) or call.adapter  # the built-in engine's
            if streamed:
                return await relay_stream(send, call, response, added, version, retries, deadline, recorder)
        finally:
            if response is not None:
                response.release()
        if response.status >= 400:
            refused = GatewayError.from_response(upstream, response.status, payload)
            refused.retries = retries
            await fail(send, call, refused, recorder)
        else:
            if cache_key is not None:
                cache.put(cache_key, payload)
            await relay_answer(send, call, payload, added, version, retries, recorder)
    finally:
        if router is not None and lease is not None:
            router.release(lease)
