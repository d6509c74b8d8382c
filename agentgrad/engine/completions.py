"""`/v1/completions`: raw prompts (text or token ids) in, text with token ids and logprobs out."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agentgrad.engine.api import CompletionRequest, RequestError, read_json, validate
from agentgrad.engine.engine import Engine
from agentgrad.engine.wire import adapter_for, generate, headers
from agentgrad.semconv import weights_fingerprint


async def completions(engine: Engine, names: list[str], request: Request) -> Response:
    parsed: CompletionRequest = validate(await read_json(request), CompletionRequest, names)
    if parsed.stream:
        raise RequestError("streaming is supported on /v1/chat/completions only", "stream")
    prompt = parsed.prompt
    if isinstance(prompt, str):
        prompts = [engine.tokenizer.encode(prompt)]
    elif prompt and isinstance(prompt[0], int):
        prompts = [list(prompt)]
    else:
        items = cast("list[str | list[int]]", prompt)  # not a list of ints: checked above
        prompts = [engine.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in items]
    if not prompts:
        raise RequestError("prompt is empty", "prompt")
    params = parsed.params(top_logprobs=parsed.logprobs or 0)
    try:
        for ids in prompts:  # everything is checked before anything is queued
            params.check(engine.max_batch_size, engine.vocab_size)
            bad = next((t for t in ids if not 0 <= t < engine.vocab_size), None)
            if bad is not None or not ids:
                raise ValueError(
                    f"prompt: token id {bad} is not in this model's vocabulary (0 to {engine.vocab_size - 1})"
                    if ids
                    else "prompt: an empty prompt"
                )
    except ValueError as exc:
        raise RequestError(str(exc), "prompt") from None
    adapter = adapter_for(engine, request, parsed.model)
    generations = await asyncio.gather(*(generate(engine, request, ids, params, adapter, "prompt") for ids in prompts))
    choices = []
    for p, generation in enumerate(generations):
        for i, c in enumerate(generation.completions):
            choice: dict[str, Any] = {
                "index": p * params.n + i,
                "text": c.text,
                "finish_reason": c.finish_reason,
                "logprobs": None,
            }
            if parsed.logprobs is not None:
                tokens = [engine.tokenizer.decode([t]) for t in c.token_ids]
                offsets = [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
                top = (
                    [{engine.tokenizer.decode([t]): lp for t, lp in row} for row in c.top_logprobs]
                    if parsed.logprobs
                    else None
                )
                choice["logprobs"] = {
                    "tokens": tokens,
                    "token_logprobs": c.logprobs,
                    "top_logprobs": top,
                    "text_offset": offsets,
                }
            if parsed.return_token_ids:
                choice["prompt_token_ids"] = generation.prompt_token_ids
                choice["token_ids"] = c.token_ids
            choices.append(choice)
    version = max(g.version for g in generations if g is not None)
    prompt_tokens = sum(len(g.prompt_token_ids) for g in generations if g is not None)
    completion_tokens = sum(len(c.token_ids) for g in generations if g is not None for c in g.completions)
    body = {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": parsed.model,
        "system_fingerprint": weights_fingerprint(version),
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    adapter = next(g.adapter for g in generations if g is not None)  # one request, one adapter
    return JSONResponse(body, headers=headers(version, adapter))
