"""A small Anthropic-compatible server standing in for the hosted Messages API (which tests cannot reach).

It behaves like the real one where the gateway and the `anthropic` SDK look: `x-api-key` checked
(401 `authentication_error` otherwise), `anthropic-version` required, errors in Anthropic's shape,
streams made of `message_start`, `content_block_*`, `message_delta` and `message_stop` events with a
`ping`. Its model is deterministic: with tools and a user question it calls the first tool with the
two numbers of the question; given a `tool_result` it answers "The answer is <result>."; otherwise
it echoes the last user text. One character is one token: `max_tokens` cuts the text, a stop
sequence ends it. Asked for `return_token_ids` (as the agentgrad engine is), it returns the bytes of
the rendered prompt and of its text as token ids, each with logprob `LOGPROB`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

LOGPROB = -0.25
KEY = "sk-ant-upstream-5678"


def render(request: dict[str, Any]) -> str:
    """The fake's 'chat template': what its prompt token ids are the bytes of."""
    return json.dumps([request.get("system"), request.get("messages")], sort_keys=True)


def error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status)


@dataclass
class FakeAnthropic:
    """The server and what it was sent. `overloaded`: how many next calls get a 529."""

    key: str = KEY
    overloaded: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/messages", self.messages, methods=["POST"])])

    async def messages(self, request: Request) -> Response:
        body = await request.json()
        with self.lock:
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            if self.overloaded > 0:
                self.overloaded -= 1
                return error(529, "overloaded_error", "Overloaded")
        if request.headers.get("x-api-key") != self.key:
            return error(401, "authentication_error", "invalid x-api-key")
        if "anthropic-version" not in request.headers:
            return error(400, "invalid_request_error", "anthropic-version: header is required")
        if not isinstance(body.get("max_tokens"), int):
            return error(400, "invalid_request_error", "max_tokens: Field required")
        message = self.answer(body)
        if body.get("stream"):
            return StreamingResponse(self.events(message), media_type="text/event-stream")
        return JSONResponse(message)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        content = last["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        results = [b for b in blocks if b.get("type") == "tool_result"]
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        tools = body.get("tools") or []
        choice = (body.get("tool_choice") or {}).get("type", "auto")
        message: dict[str, Any] = {
            "id": f"msg_{len(self.requests):04d}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "stop_sequence": None,
            "usage": {"input_tokens": len(render(body)), "output_tokens": 0},
        }
        if tools and not results and choice != "none":
            a, b = (int(n) for n in re.findall(r"\d+", text)[:2])
            call = {"type": "tool_use", "id": f"toolu_{len(self.requests):04d}", "name": tools[0]["name"]}
            message.update(content=[{**call, "input": {"a": a, "b": b}}], stop_reason="tool_use")
            output = json.dumps({"a": a, "b": b})
        else:
            if results:
                result = results[0]["content"]
                result = result if isinstance(result, str) else "".join(p["text"] for p in result)
                output = f"The answer is {result}."
            else:
                output = f"echo: {text}"
            reason = "end_turn"
            for stop in body.get("stop_sequences") or ():
                if stop in output:
                    output, reason, message["stop_sequence"] = output[: output.index(stop)], "stop_sequence", stop
            if len(output) > body["max_tokens"]:
                output, reason = output[: body["max_tokens"]], "max_tokens"
            message.update(content=[{"type": "text", "text": output}], stop_reason=reason)
        message["usage"]["output_tokens"] = len(output.encode())
        if body.get("return_token_ids"):
            message["prompt_token_ids"] = list(render(body).encode())
            message["token_ids"] = list(output.encode())
            message["token_logprobs"] = [LOGPROB] * len(message["token_ids"])
        return message

    async def events(self, message: dict[str, Any]) -> AsyncIterator[bytes]:
        def event(kind: str, data: dict[str, Any]) -> bytes:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

        start = {k: v for k, v in message.items() if k not in ("prompt_token_ids", "token_ids", "token_logprobs")}
        start.update(content=[], stop_reason=None, usage={**message["usage"], "output_tokens": 0})
        yield event("message_start", {"message": start})
        yield event("ping", {})
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                yield event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
                text = block["text"]
                for i in range(0, len(text), 4):
                    delta = {"type": "text_delta", "text": text[i : i + 4]}
                    yield event("content_block_delta", {"index": index, "delta": delta})
            else:
                opened = {**block, "input": {}}
                yield event("content_block_start", {"index": index, "content_block": opened})
                arguments = json.dumps(block["input"])
                for i in range(0, len(arguments), 5):
                    delta = {"type": "input_json_delta", "partial_json": arguments[i : i + 5]}
                    yield event("content_block_delta", {"index": index, "delta": delta})
            yield event("content_block_stop", {"index": index})
        final: dict[str, Any] = {
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
            "usage": {"output_tokens": message["usage"]["output_tokens"]},
        }
        for name in ("prompt_token_ids", "token_ids", "token_logprobs"):
            if name in message:
                final[name] = message[name]
        yield event("message_delta", final)
        yield event("message_stop", {})
