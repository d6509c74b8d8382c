"""Pieces every engine route shares: submitting with cancellation on disconnect, logprobs, usage, headers."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any
from urllib.parse import unquote

from starlette.requests import Request

from agentgrad.engine.api import RequestError
from agentgrad.engine.engine import Engine
from agentgrad.engine.params import SamplingParams
from agentgrad.engine.rows import Generation
from agentgrad.semconv import ADAPTER_HEADER, AGENT_HEADER, VERSION_HEADER

Event = tuple[int, int, float, str, list[tuple[int, float]]] | Generation | BaseException
"""What a streaming route's queue carries: a token (choice, id, logprob, delta, top), the end, or a failure."""


def headers(version: int, adapter: str | None = None) -> dict[str, str]:
    """The weights version of an answer and, where the engine holds several adapters, the one that served it."""
    return {VERSION_HEADER: str(version), **({ADAPTER_HEADER: adapter} if adapter else {})}


def adapter_for(engine: Engine, request: Request, model: str) -> str | None:
    """The adapter serving this request: the one the request's `model` names (vLLM's convention for LoRA
    modules), else by the agent name the gateway forwards (`x-agentgrad-agent`, percent-encoded); None when the
    engine serves one set of weights."""
    if engine.adapters is None:
        return None
    if model in engine.adapters.patterns:
        return model
    agent = request.headers.get(AGENT_HEADER)
    return engine.adapters.resolve(unquote(agent) if agent else None)


def admitted_adapter(engine: Engine, request: Request, model: str, params: SamplingParams) -> str | None:
    """Sampling parameters this engine cannot serve refused with a 400 before anything is queued; then the adapter
    serving the request (`adapter_for`)."""
    try:
        params.check(engine.max_batch_size, engine.vocab_size)
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    return adapter_for(engine, request, model)


def model_names(engine: Engine, names: list[str]) -> list[str]:
    """The `model` values a request may name: the served names of the base, then each adapter's name."""
    return names + (list(engine.adapters.patterns) if engine.adapters is not None else [])


def usage(generation: Generation) -> dict[str, int]:
    completion = sum(len(c.token_ids) for c in generation.completions)
    prompt = len(generation.prompt_token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def token_logprobs(
    engine: Engine, token_ids: list[int], logprobs: list[float], tops: list[list[tuple[int, float]]] | None = None
) -> list[dict[str, Any]]:
    """Chat `logprobs.content`: each token with its logprob and its top alternatives, all from the sampled distribution."""
    decode = engine.tokenizer.decode
    out = []
    for i, (token, logprob) in enumerate(zip(token_ids, logprobs)):
        text = decode([token])
        top = [
            {"token": decode([t]), "logprob": lp, "bytes": list(decode([t]).encode())}
            for t, lp in (tops[i] if tops and i < len(tops) else [])
        ]
        out.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": top})
    return out


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    """The client disconnected before its answer was ready; the server answers 499, which nobody reads."""


async def generate(
    engine: Engine,
    request: Request,
    prompt_ids: list[int],
    params: SamplingParams,
    adapter: str | None,
    param: str | None = None,
) -> Generation:
    """Generate with `adapter` (`adapter_for`); a request the engine refuses is a `RequestError` (about `param`),
    and the generation stops with `ClientGone` as soon as the client disconnects."""
    try:
        future = engine.submit(prompt_ids, params, adapter=adapter)
        done = asyncio.ensure_future(asyncio.wrap_future(future))
        gone = asyncio.ensure_future(_disconnected(request))
        racing: list[asyncio.Future[Any]] = [done, gone]
        await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        if done.done():
            gone.cancel()
            return done.result()
    except ValueError as exc:
        raise RequestError(str(exc), param) from None
    engine.cancel(future)
    done.cancel()
    raise ClientGone


def stream(
    engine: Engine, prompt_ids: list[int], params: SamplingParams, adapter: str | None = None
) -> tuple[concurrent.futures.Future[Generation], asyncio.Queue[Event]]:
    """Submit (to `adapter`, `adapter_for`) with a queue that receives each token, then the generation (or the failure)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Event] = asyncio.Queue()

    def on_token(*event: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, event)

    future = engine.submit(prompt_ids, params, on_token, adapter)
    future.add_done_callback(lambda f: loop.call_soon_threadsafe(queue.put_nowait, f.exception() or f.result()))
    return future, queue
