"""A small OpenAI-compatible server that speaks the wire format of vLLM and the agentgrad engine.

Token ids are the UTF-8 bytes of the text, so a test can decode what was recorded. Logprobs
are a function of the byte. Like vLLM, token ids and logprobs are only returned when asked for.
It answers `echo: <last user message>`; with tools and a user message last holding two numbers, it calls the first
tool with the integers found in the message (as `a` and `b`, or as `expression: "a + b"` for a
tool that takes an expression); after a tool result it answers `Answer: <result>`.
`/v1/responses` answers the same way in the Responses API's shape, with token ids (in the body,
as the agentgrad engine gives them) when asked, and vLLM's raw turn with `enable_response_messages`. `/v1/messages` (vLLM serves Anthropic's API too) answers only
the bodies a test queues in `answers`, as chat and Responses calls can. `strict=True` refuses any argument OpenAI's own
API does not know, with OpenAI's message (`Unrecognized request argument supplied: ...`).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import deque
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

VERSION = 7
OPENAI_ARGUMENTS = {
    "chat": {"model", "messages", "temperature", "top_p", "n", "stream", "stream_options", "stop", "max_tokens",
             "max_completion_tokens", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
             "user", "seed", "tools", "tool_choice", "parallel_tool_calls", "response_format"},
    "completions": {"model", "prompt", "temperature", "top_p", "n", "stream", "stream_options", "stop", "max_tokens",
                    "logprobs", "echo", "seed", "user"},
    "responses": {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "temperature",
                  "top_p", "max_output_tokens", "top_logprobs", "include", "text", "stream", "store", "metadata",
                  "user", "truncation", "reasoning", "previous_response_id"},
}
"""What OpenAI's API accepts on each endpoint (enough of it for the tests): a strict upstream refuses the rest."""


def logprob(byte: int) -> float:
    return -(byte % 10) / 10


def render(messages: list[dict[str, Any]]) -> str:
    return "".join(f"<{m['role']}>{m.get('content') or ''}" for m in messages)


class FakeUpstream:
    """The app plus what a test steers and inspects: queued failures, received requests, a stream gate."""

    def __init__(self, api_key: str | None = None, chunk_chars: int = 4, strict: bool = False) -> None:
        self.api_key = api_key
        self.strict = strict
        self.chunk_chars = chunk_chars
        self.failures: deque[tuple[int, dict[str, str]]] = deque()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.stream_gate: threading.Event | None = None
        self.break_stream_after: int | None = None  # chunks sent before the connection drops
        self.echo_key_in_errors = False  # failures quote the Authorization header, as careless upstreams do
        self.echo_key_in_answers = False  # so do successful chat answers (streamed too)
        self.answers: deque[Any] = deque()  # raw JSON bodies to answer the next calls with, as they are
        self.bad_chunk: str | None = None  # a `data:` payload sent after the first chunk of the next stream
        self.drop_token_ids = False  # answer as an upstream that ignores `return_token_ids` does
        self.fault: str | None = None  # every POST until reset: one of FAULTS
        self.arrived = threading.Event()  # a request reached the fault
        self.hung_up = threading.Event()  # ...and its client (the gateway) then closed the connection
        self._routes = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
            ]
        )

    FAULTS = ("die after headers", "hang before headers", "hang after headers", "hang mid-stream")

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        fault = self.fault
        if fault is None or scope["type"] != "http" or scope["method"] != "POST":
            return await self._routes(scope, receive, send)
        assert fault in self.FAULTS, fault
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        self.requests.append(json.loads(body))
        self.arrived.set()
        if fault == "hang mid-stream":
            chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": "policy",
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "par"}, "finish_reason": None}]}
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(), "more_body": True})
        elif fault != "hang before headers":
            headers = [(b"content-type", b"application/json"), (b"content-length", b"1000")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b'{"id": "chatcmpl-fake", "cho', "more_body": True})
            if fault == "die after headers":
                raise ConnectionAbortedError("fake upstream dies after its headers")
        try:  # hang until the client goes away
            while (await receive())["type"] != "http.disconnect":
                pass
        finally:
            self.hung_up.set()

    def fail_next(self, status: int, times: int = 1, headers: dict[str, str] | None = None) -> None:
        self.failures.extend([(status, headers or {})] * times)

    async def _check(self, request: Request) -> tuple[dict[str, Any], Response | None]:
        body = await request.json()
        self.requests.append(dict(body))
        if self.drop_token_ids:
            body.pop("return_token_ids", None)
        self.headers.append(dict(request.headers))
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return body, JSONResponse(
                {
                    "error": {
                        "message": "Incorrect API key provided",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    }
                },
                status_code=401,
            )
        path = request.url.path
        known = OPENAI_ARGUMENTS.get("chat" if path.endswith("chat/completions") else path.rsplit("/", 1)[-1], set(body))
        unknown = sorted(set(body) - known)
        if self.strict and unknown:
            error = {"message": f"Unrecognized request argument supplied: {', '.join(unknown)}",
                     "type": "invalid_request_error", "param": None, "code": None}
            return body, JSONResponse({"error": error}, status_code=400)
        if self.failures:
            status, headers = self.failures.popleft()
            error = {"message": f"fake upstream failure {status}", "type": "server_error", "code": None}
            if self.echo_key_in_errors:
                authorization = request.headers.get("authorization", "")
                error["message"] += f" for {authorization} (key {authorization.removeprefix('Bearer ')})"
            if status == 400:
                error = {
                    "message": "max_tokens must be at least 1",
                    "type": "invalid_request_error",
                    "code": "bad_max_tokens",
                }
            return body, JSONResponse({"error": error}, status_code=status, headers=headers)
        return body, None

    # ------------------------------------------------------------------ chat

    def _reply(self, body: dict[str, Any], index: int) -> dict[str, Any]:
        messages = body["messages"]
        last = messages[-1]
        if last["role"] == "tool":
            return {"role": "assistant", "content": f"Answer: {last['content']}"}
        content = last.get("content")
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content or [])
        if body.get("tools") and last["role"] == "user" and len(re.findall(r"\d+", text)) >= 2:
            function = body["tools"][0]["function"]
            tool = function["name"]
            numbers = [int(n) for n in re.findall(r"\d+", text)]
            if "expression" in (function.get("parameters") or {}).get("properties", {}):
                arguments = json.dumps({"expression": f"{numbers[0]} + {numbers[1]}"})  # a calculator tool
            else:
                arguments = json.dumps({"a": numbers[0], "b": numbers[1]})
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"call_{index}", "type": "function", "function": {"name": tool, "arguments": arguments}}
                ],
            }
        prefix = f"{index}: " if body.get("n", 1) > 1 else ""  # no two numbers to add (a team's later turn): echo
        return {"role": "assistant", "content": f"{prefix}echo: {last.get('content')}"}

    @staticmethod
    def _text_of(message: dict[str, Any]) -> str:
        if message.get("tool_calls"):
            return json.dumps(message["tool_calls"])
        return message["content"]

    async def chat(self, request: Request) -> Response:
        body, failure = await self._check(request)
        if failure is not None:
            return failure
        if self.answers:
            return JSONResponse(self.answers.popleft())
        prompt_ids = list(render(body["messages"]).encode())
        replies = [self._reply(body, i) for i in range(body.get("n", 1))]
        if self.echo_key_in_answers:
            for reply in replies:
                reply["content"] = f"{reply['content'] or ''} (you called with {request.headers.get('authorization')})"
        headers = {"x-agentgrad-model-version": str(VERSION)}
        if body.get("stream"):
            return StreamingResponse(
                self._chat_stream(body, prompt_ids, replies), media_type="text/event-stream", headers=headers
            )
        choices = []
        for i, reply in enumerate(replies):
            ids = list(self._text_of(reply).encode())
            choice: dict[str, Any] = {
                "index": i,
                "message": reply,
                "logprobs": None,
                "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
            }
            if body.get("logprobs"):
                choice["logprobs"] = {
                    "content": [{"token": chr(b), "logprob": logprob(b), "bytes": [b], "top_logprobs": []} for b in ids]
                }
            if body.get("return_token_ids"):
                choice["token_ids"] = ids
            choices.append(choice)
        answer: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "system_fingerprint": f"agentgrad-weights-v{VERSION}",
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": sum(len(self._text_of(r).encode()) for r in replies),
                "total_tokens": 0,
            },
        }
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = prompt_ids
        return JSONResponse(answer, headers=headers)

    async def _chat_stream(self, body: dict[str, Any], prompt_ids: list[int], replies: list[dict[str, Any]]) -> Any:
        base = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": body["model"],
            "system_fingerprint": f"agentgrad-weights-v{VERSION}",
        }
        first = True
        completion_tokens = 0
        for i, reply in enumerate(replies):
            if reply.get("tool_calls"):
                call = reply["tool_calls"][0]
                arguments = call["function"]["arguments"]
                pieces = [
                    {
                        "index": 0,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }
                ]
                pieces += [
                    {"index": 0, "function": {"arguments": arguments[k : k + 5]}} for k in range(0, len(arguments), 5)
                ]
                deltas = [
                    ({"role": "assistant", "tool_calls": [p]} if n == 0 else {"tool_calls": [p]}, b"")
                    for n, p in enumerate(pieces)
                ]
                deltas[-1] = (deltas[-1][0], json.dumps(reply["tool_calls"]).encode())
            else:
                text = reply["content"]
                deltas = [({"role": "assistant", "content": ""}, b"")] + [
                    ({"content": text[k : k + self.chunk_chars]}, text[k : k + self.chunk_chars].encode())
                    for k in range(0, len(text), self.chunk_chars)
                ]
            for n, (delta, ids) in enumerate(deltas):
                choice: dict[str, Any] = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
                if body.get("logprobs") and ids:
                    choice["logprobs"] = {
                        "content": [
                            {"token": chr(b), "logprob": logprob(b), "bytes": [b], "top_logprobs": []} for b in ids
                        ]
                    }
                if body.get("return_token_ids"):
                    choice["token_ids"] = list(ids)
                completion_tokens += len(ids)
                chunk = {**base, "choices": [choice]}
                if first and body.get("return_token_ids"):
                    chunk["prompt_token_ids"] = prompt_ids
                first = False
                if self.break_stream_after is not None and n == self.break_stream_after:
                    raise ConnectionAbortedError("fake upstream drops the stream")
                yield f"data: {json.dumps(chunk)}\n\n"
                if n == 0 and self.bad_chunk is not None:
                    yield f"data: {self.bad_chunk}\n\n"
                    self.bad_chunk = None
                if n == 1 and self.stream_gate is not None:
                    await asyncio.to_thread(self.stream_gate.wait, 10)
            final = {
                "index": i,
                "delta": {},
                "logprobs": None,
                "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
            }
            if body.get("return_token_ids"):
                final["token_ids"] = []
            yield f"data: {json.dumps({**base, 'choices': [final]})}\n\n"
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens, "total_tokens": 0}
            yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"

    # ------------------------------------------------------------------ completions

    async def completions(self, request: Request) -> Response:
        body, failure = await self._check(request)
        if failure is not None:
            return failure
        prompt = body["prompt"]
        prompt_ids = list(prompt.encode())
        texts = [f"{i}: echo: {prompt}" if body.get("n", 1) > 1 else f"echo: {prompt}" for i in range(body.get("n", 1))]

        def choice(i: int, text: str, finish: str | None) -> dict[str, Any]:
            ids = list(text.encode())
            out: dict[str, Any] = {"index": i, "text": text, "logprobs": None, "finish_reason": finish}
            if body.get("logprobs") is not None:
                out["logprobs"] = {
                    "tokens": [chr(b) for b in ids],
                    "token_logprobs": [logprob(b) for b in ids],
                    "top_logprobs": None,
                    "text_offset": list(range(len(ids))),
                }
            if body.get("return_token_ids"):
                out["token_ids"] = ids
                out["prompt_token_ids"] = prompt_ids
            return out

        if body.get("stream"):

            async def stream() -> Any:
                for i, text in enumerate(texts):
                    pieces = [text[k : k + self.chunk_chars] for k in range(0, len(text), self.chunk_chars)]
                    for n, piece in enumerate(pieces):
                        c = choice(i, piece, "stop" if n == len(pieces) - 1 else None)
                        if n > 0:
                            c.pop("prompt_token_ids", None)
                        yield f"data: {json.dumps({'id': 'cmpl-fake', 'object': 'text_completion', 'model': body['model'], 'choices': [c]})}\n\n"
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = {
                        "prompt_tokens": len(prompt_ids),
                        "completion_tokens": sum(len(t) for t in texts),
                        "total_tokens": 0,
                    }
                    yield f"data: {json.dumps({'id': 'cmpl-fake', 'object': 'text_completion', 'model': body['model'], 'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(
                stream(), media_type="text/event-stream", headers={"x-agentgrad-model-version": str(VERSION)}
            )
        return JSONResponse(
            {
                "id": "cmpl-fake",
                "object": "text_completion",
                "created": 0,
                "model": body["model"],
                "choices": [choice(i, t, "stop") for i, t in enumerate(texts)],
                "usage": {
                    "prompt_tokens": len(prompt_ids),
                    "completion_tokens": sum(len(t) for t in texts),
                    "total_tokens": 0,
                },
            },
            headers={"x-agentgrad-model-version": str(VERSION)},
        )

    # ------------------------------------------------------------------ responses

    def _response_reply(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str, list[dict[str, Any]]]:
        """(chat messages of the input, the text the model "wrote", the output items)."""
        items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
        for item in items:
            if item.get("type") == "function_call_output":
                messages.append({"role": "tool", "content": item["output"]})
            elif item.get("type") == "function_call":
                messages.append({"role": "assistant", "content": item["arguments"]})
            else:
                content = item["content"]
                text = content if isinstance(content, str) else "".join(p["text"] for p in content)
                messages.append({"role": item["role"], "content": text})
        last = messages[-1]
        content = last.get("content")
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content or [])
        if body.get("tools") and last["role"] == "user" and len(re.findall(r"\d+", text)) >= 2:
            numbers = [int(n) for n in re.findall(r"\d+", last["content"])]
            if "expression" in (body["tools"][0].get("parameters") or {}).get("properties", {}):
                arguments = json.dumps({"expression": f"{numbers[0]} + {numbers[1]}"})  # a calculator tool
            else:
                arguments = json.dumps({"a": numbers[0], "b": numbers[1]})
            call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": body["tools"][0]["name"],
                    "arguments": arguments, "status": "completed"}
            return messages, arguments, [call]
        text = f"Answer: {last['content']}" if last["role"] == "tool" else f"echo: {last['content']}"
        message = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]}
        return messages, text, [message]

    def _response_body(self, body: dict[str, Any], messages: list[dict[str, Any]], written: str,
                       output: list[dict[str, Any]]) -> dict[str, Any]:
        prompt_ids, ids = list(render(messages).encode()), list(written.encode())
        answer: dict[str, Any] = {
            "id": "resp_fake", "object": "response", "created_at": 0, "status": "completed", "model": body["model"],
            "output": output, "system_fingerprint": f"agentgrad-weights-v{VERSION}",
            "usage": {"input_tokens": len(prompt_ids), "output_tokens": len(ids), "total_tokens": 0},
        }
        if body.get("return_token_ids"):
            answer.update(prompt_token_ids=prompt_ids, token_ids=ids, token_logprobs=[logprob(b) for b in ids])
        if body.get("enable_response_messages"):  # vLLM's raw turn: the rendered prompt and the reply, text and ids
            answer["input_messages"] = [{"message": render(messages), "tokens": prompt_ids, "type": "raw_message_tokens"}]
            answer["output_messages"] = [{"message": written, "tokens": ids, "type": "raw_message_tokens"}]
        return answer

    async def responses(self, request: Request) -> Response:
        body, failure = await self._check(request)
        if failure is not None:
            return failure
        if self.answers:
            return JSONResponse(self.answers.popleft())
        messages, written, output = self._response_reply(body)
        answer = self._response_body(body, messages, written, output)
        headers = {"x-agentgrad-model-version": str(VERSION)}
        if not body.get("stream"):
            return JSONResponse(answer, headers=headers)

        async def events() -> Any:
            sequence = iter(range(1000))

            def event(kind: str, **fields: Any) -> str:
                return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(sequence), **fields})}\n\n"

            added = ("prompt_token_ids", "token_ids", "token_logprobs", "input_messages", "output_messages")
            started = {k: v for k, v in answer.items() if k not in added}
            yield event("response.created", response={**started, "status": "in_progress", "output": []})
            item = output[0]
            yield event("response.output_item.added", output_index=0, item={**item, "status": "in_progress"})
            if item["type"] == "message":
                for k in range(0, len(written), self.chunk_chars):
                    yield event("response.output_text.delta", item_id=item["id"], output_index=0, content_index=0,
                                delta=written[k : k + self.chunk_chars])
                    if self.break_stream_after is not None and k // self.chunk_chars == self.break_stream_after:
                        raise ConnectionAbortedError("fake upstream drops the stream")
            else:
                yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=0, delta=written)
            yield event("response.output_item.done", output_index=0, item=item)
            yield event("response.completed", response=answer)

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    # ------------------------------------------------------------------ messages

    async def messages(self, request: Request) -> Response:
        _, failure = await self._check(request)
        if failure is not None:
            return failure
        if not self.answers:
            error = {"type": "error", "error": {"type": "api_error", "message": "queue a body in `answers` first"}}
            return JSONResponse(error, status_code=500)
        return JSONResponse(self.answers.popleft())
