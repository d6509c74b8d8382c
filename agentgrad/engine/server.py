"""The engine as an OpenAI-compatible HTTP backend: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

Token ids and logprobs follow vLLM's wire format, so the gateway reads them the same way
from the local engine and from a vLLM server: with `return_token_ids: true` a chat response
carries top-level `prompt_token_ids` and per-choice `token_ids`; `logprobs: true` adds
`choices[i].logprobs.content`. Every response names the weights version that produced it,
in the `x-agentgrad-model-version` header and as `system_fingerprint`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentgrad.engine.engine import Engine, Generation, SamplingParams
from agentgrad.semconv import VERSION_HEADER

DEFAULT_MAX_TOKENS = 512


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool = False

    def params(self) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            stop=stop,
            n=self.n,
            seed=self.seed,
        )


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    logprobs: bool = False


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0)
    echo: Literal[False] = False


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status)


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of content parts."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")


def create_engine_app(engine: Engine, served_names: list[str] | None = None) -> Starlette:
    """An ASGI app serving `engine`; `served_names` are the model names it answers to."""
    names = served_names or [engine.name]

    async def parse(request: Request, schema: type[_Sampling]) -> _Sampling | JSONResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"the request body is not valid JSON: {exc}")
        try:
            parsed = schema.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            return _error(400, f"{where}: {first['msg']}", param=where)
        if parsed.model not in names:
            return _error(404, f"model {parsed.model!r} is not served here; this engine serves {names}", "not_found_error", "model")
        return parsed

    def headers(version: int) -> dict[str, str]:
        return {VERSION_HEADER: str(version)}

    async def submit(prompt_ids: list[int], params: SamplingParams, on_token: Any = None) -> Generation:
        return await asyncio.wrap_future(engine.submit(prompt_ids, params, on_token))

    def token_logprobs(token_ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
        tokens = [engine.tokenizer.decode([t]) for t in token_ids]
        return [
            {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
            for tok, lp in zip(tokens, logprobs)
        ]

    async def chat_completions(request: Request) -> Response:
        parsed = await parse(request, ChatRequest)
        if isinstance(parsed, JSONResponse):
            return parsed
        assert isinstance(parsed, ChatRequest)
        messages = [{**m, "content": _text(m.get("content"))} for m in parsed.messages]
        try:
            prompt_ids = engine.chat_prompt_ids(messages, parsed.tools)
            params = parsed.params()
            params.check(engine.max_batch_size)
            if len(prompt_ids) >= engine.max_model_len:
                raise ValueError(f"the prompt has {len(prompt_ids)} tokens; this model takes at most {engine.max_model_len - 1}")
        except (ValueError, TypeError, KeyError) as exc:
            return _error(400, str(exc))
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        if parsed.stream:
            return _stream_chat(parsed, prompt_ids, params, completion_id)
        generation = await submit(prompt_ids, params)
        choices = []
        for index, c in enumerate(generation.completions):
            choice: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": c.text},
                "finish_reason": c.finish_reason,
                "logprobs": {"content": token_logprobs(c.token_ids, c.logprobs)} if parsed.logprobs else None,
            }
            if parsed.return_token_ids:
                choice["token_ids"] = c.token_ids
            choices.append(choice)
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": parsed.model,
            "system_fingerprint": f"agentgrad-weights-v{generation.version}",
            "choices": choices,
            "usage": _usage(generation),
        }
        if parsed.return_token_ids:
            body["prompt_token_ids"] = generation.prompt_token_ids
        return JSONResponse(body, headers=headers(generation.version))

    def _stream_chat(parsed: ChatRequest, prompt_ids: list[int], params: SamplingParams, completion_id: str) -> Response:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, int, float, str] | Generation | BaseException] = asyncio.Queue()
        future = engine.submit(prompt_ids, params, lambda *event: loop.call_soon_threadsafe(queue.put_nowait, event))
        future.add_done_callback(
            lambda f: loop.call_soon_threadsafe(queue.put_nowait, f.exception() or f.result())  # type: ignore[arg-type]
        )
        created = int(time.time())
        version = engine.version

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            body = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": parsed.model,
                    "system_fingerprint": f"agentgrad-weights-v{version}", "choices": choices, **extra}
            return f"data: {json.dumps(body)}\n\n"

        async def events() -> AsyncIterator[str]:
            first: dict[str, Any] = {"prompt_token_ids": prompt_ids} if parsed.return_token_ids else {}
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                         for i in range(params.n)], **first)
            while True:
                event = await queue.get()
                if isinstance(event, BaseException):
                    yield f"data: {json.dumps({'error': {'message': str(event), 'type': 'server_error'}})}\n\n"
                    break
                if isinstance(event, Generation):
                    yield chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": c.finish_reason}
                                 for i, c in enumerate(event.completions)])
                    if (parsed.stream_options or {}).get("include_usage"):
                        yield chunk([], usage=_usage(event))
                    break
                index, token, logprob, delta = event
                choice: dict[str, Any] = {"index": index, "delta": {"content": delta}, "finish_reason": None,
                                          "logprobs": {"content": token_logprobs([token], [logprob])} if parsed.logprobs else None}
                if parsed.return_token_ids:
                    choice["token_ids"] = [token]
                yield chunk([choice])
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers(version))

    async def completions(request: Request) -> Response:
        parsed = await parse(request, CompletionRequest)
        if isinstance(parsed, JSONResponse):
            return parsed
        assert isinstance(parsed, CompletionRequest)
        if parsed.stream:
            return _error(400, "streaming is supported on /v1/chat/completions only", param="stream")
        prompt = parsed.prompt
        if isinstance(prompt, str):
            prompts = [engine.tokenizer.encode(prompt)]
        elif prompt and isinstance(prompt[0], int):
            prompts = [list(prompt)]  # type: ignore[arg-type]
        else:
            prompts = [engine.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]  # type: ignore[union-attr]
        params = parsed.params()
        try:
            futures = [engine.submit(ids, params) for ids in prompts]
        except ValueError as exc:
            return _error(400, str(exc))
        generations = [await asyncio.wrap_future(f) for f in futures]
        choices = []
        for p, generation in enumerate(generations):
            for i, c in enumerate(generation.completions):
                choice: dict[str, Any] = {"index": p * params.n + i, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}
                if parsed.logprobs is not None:
                    tokens = [engine.tokenizer.decode([t]) for t in c.token_ids]
                    offsets = [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
                    choice["logprobs"] = {"tokens": tokens, "token_logprobs": c.logprobs, "top_logprobs": None, "text_offset": offsets}
                if parsed.return_token_ids:
                    choice["prompt_token_ids"] = generation.prompt_token_ids
                    choice["token_ids"] = c.token_ids
                choices.append(choice)
        version = max(g.version for g in generations)
        usage = {
            "prompt_tokens": sum(len(g.prompt_token_ids) for g in generations),
            "completion_tokens": sum(len(c.token_ids) for g in generations for c in g.completions),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        body = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": parsed.model, "system_fingerprint": f"agentgrad-weights-v{version}", "choices": choices, "usage": usage}
        return JSONResponse(body, headers=headers(version))

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "agentgrad"} for n in names]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": engine.version, **engine.stats})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


def _usage(generation: Generation) -> dict[str, int]:
    completion = sum(len(c.token_ids) for c in generation.completions)
    prompt = len(generation.prompt_token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
