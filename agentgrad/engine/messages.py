"""`/v1/messages`: Anthropic's Messages API on the local model, so an agent on the `anthropic` SDK trains unchanged.

Served: `system` (a string or text blocks), `messages` with text, `tool_use` (assistant) and
`tool_result` (user) blocks, custom `tools` (`input_schema`) with `tool_choice` auto / any / tool /
none and `disable_parallel_tool_use`, `max_tokens` (required, as Anthropic requires it),
`stop_sequences`, `temperature`, `top_p`, `metadata`, and streaming with Anthropic's events. The
request is rendered with the model's chat template, tools included (the chat path's `plan`); a
tool call comes back as a `tool_use` block whose input the grammar held to the schema when forced.

What the engine cannot honour (`top_k`, `thinking`, server tools, image blocks, ...) is refused
with a 400 in Anthropic's error shape naming the field. With `return_token_ids: true` the message
(and, streamed, the `message_delta` event) carries `prompt_token_ids`, `token_ids` and
`token_logprobs`: exactly what was sampled.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from agentgrad.engine.api import RequestError, _Strict, read_json, validate
from agentgrad.engine.chat import Plan, _HeldText, plan, prompt_ids, reply_fields
from agentgrad.engine.engine import Engine
from agentgrad.engine.params import SamplingParams
from agentgrad.engine.rows import Completion, Generation
from agentgrad.engine.tools import format_for
from agentgrad.engine.wire import admitted_adapter, generate, headers, stream
from agentgrad.semconv import ALLOWED_TOKENS_FIELD

REFUSED: dict[str, str] = {
    "top_k": "top-k sampling is not implemented; use top_p",
    "thinking": "this model does not think in a separate channel",
    "mcp_servers": "this engine connects to no MCP server",
    "container": "this engine runs no code container",
    "context_management": "this engine does not edit the context",
}
"""Messages API parameters the engine refuses, with the reason given in the 400."""

STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}
"""The engine's finish reason as Anthropic's `stop_reason` (a plain stop is `end_turn` or `stop_sequence`)."""

ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "request_too_large"}


class MessagesRequest(_Strict):
    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    return_token_ids: bool = False


def anthropic_error(exc: RequestError) -> JSONResponse:
    """A refusal in Anthropic's error shape (the `anthropic` SDK raises its own exception for it)."""
    kind = ERROR_TYPES.get(exc.status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": exc.message}}, status_code=exc.status)


def _text(content: Any, where: str) -> str:
    """A string, or text blocks joined; any other block is refused by name."""
    if isinstance(content, str):
        return content
    texts = []
    for i, block in enumerate(content if isinstance(content, list) else [content]):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise RequestError(f"{where}[{i}]: blocks of type {kind!r} are not supported here (text only)", where)
        texts.append(block["text"])
    return "".join(texts)


def chat_messages(parsed: MessagesRequest) -> list[dict[str, Any]]:
    """`system` and `messages` as chat messages: tool_use blocks as tool calls, tool_result blocks as tool messages."""
    out: list[dict[str, Any]] = []
    if parsed.system:
        out.append({"role": "system", "content": _text(parsed.system, "system")})
    for i, message in enumerate(parsed.messages):
        where, role, content = f"messages[{i}]", message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise RequestError(f"{where}.role must be user or assistant, not {role!r}", f"{where}.role")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise RequestError(f"{where}.content must be a string or a list of blocks", f"{where}.content")
        texts, calls = [], []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            at = f"{where}.content[{j}]"
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use" and role == "assistant":
                calls.append(
                    {
                        "id": block.get("id"),
                        "type": "function",
                        "function": {"name": block.get("name"), "arguments": json.dumps(block.get("input") or {})},
                    }
                )
            elif kind == "tool_result" and role == "user":
                result = block.get("content")
                text = "" if result is None else _text(result, f"{at}.content")
                out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
            else:
                raise RequestError(
                    f"{at}: {role} blocks of type {kind!r} are not supported "
                    "(text; tool_use from the assistant; tool_result from the user)",
                    f"{at}.type",
                )
        if texts or calls:
            item: dict[str, Any] = {"role": role, "content": "".join(texts)}
            if calls:
                item["tool_calls"] = calls
            out.append(item)
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Custom tools (`name`, `description`, `input_schema`) as chat function tools; server tools are refused."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type", "custom") != "custom" or "input_schema" not in tool:
            raise RequestError(
                f"tools[{i}]: only custom tools with an input_schema are served, not {tool.get('type')!r}",
                f"tools[{i}]",
            )
        function = {
            "name": tool.get("name"),
            "description": tool.get("description", ""),
            "parameters": tool["input_schema"],
        }
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """Anthropic's `tool_choice` as the chat one, and whether parallel calls are allowed."""
    if choice is None:
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise RequestError("tool_choice: a tool choice of type 'tool' needs a name", "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    raise RequestError(f"tool_choice.type must be auto, any, tool or none, not {kind!r}", "tool_choice.type")


def content_blocks(the_plan: Plan, completion: Completion) -> tuple[list[dict[str, Any]], str, dict[str, str]]:
    """The reply as content blocks (text, tool_use), its stop reason, and the fields about its calls (`reply_fields`)."""
    reply, finish = the_plan.reply(completion)
    blocks: list[dict[str, Any]] = []
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    for call in reply.tool_calls:
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            arguments = {}
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments})
    if not blocks and not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.content or ""})
    return blocks, finish, reply_fields(reply)


def _stop(engine: Engine, params: SamplingParams, completion: Completion, finish: str) -> tuple[str, str | None]:
    """Anthropic's `stop_reason` and `stop_sequence`: a plain stop not on an end-of-turn token was a stop sequence
    (the engine cut it from the text: it is what the decoded tokens hold past the text)."""
    if finish != "stop":
        return STOP_REASONS.get(finish, finish), None
    ids = completion.token_ids
    if not params.stop or not ids or ids[-1] in engine.eos_token_ids:
        return "end_turn", None
    past = engine.tokenizer.decode(ids, skip_special_tokens=True)[len(completion.text) :]
    hit = next((stop for stop in params.stop if stop and past.startswith(stop)), None)
    return ("stop_sequence", hit) if hit else ("end_turn", None)


def _body(
    parsed: MessagesRequest, message_id: str, blocks: list[dict[str, Any]], stop: tuple[str | None, str | None]
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": parsed.model,
        "content": blocks,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def _token_fields(parsed: MessagesRequest, generation: Generation) -> dict[str, Any]:
    if not parsed.return_token_ids:
        return {}
    c = generation.completions[0]
    fields: dict[str, Any] = {
        "prompt_token_ids": generation.prompt_token_ids,
        "token_ids": c.token_ids,
        "token_logprobs": c.logprobs,
    }
    if c.allowed_tokens is not None:
        fields[ALLOWED_TOKENS_FIELD] = c.allowed_tokens
    return fields


async def messages(engine: Engine, names: list[str], request: Request) -> Response:
    """Serve one Messages request; every refusal in Anthropic's error shape."""
    try:
        return await _messages(engine, names, request)
    except RequestError as exc:
        return anthropic_error(exc)


async def _messages(engine: Engine, names: list[str], request: Request) -> Response:
    body = await read_json(request)
    for name in REFUSED:
        if isinstance(body, dict) and name in body:
            raise RequestError(f"unsupported parameter {name!r}: {REFUSED[name]}", name)
    parsed: MessagesRequest = validate(body, MessagesRequest, names)
    choice, parallel = chat_tool_choice(parsed.tool_choice)
    the_plan = plan(chat_tools(parsed.tools), choice, parallel, None, format_for(engine.tokenizer))
    ids = prompt_ids(engine, chat_messages(parsed), the_plan.rendered_tools)
    params = SamplingParams(
        max_tokens=parsed.max_tokens,
        temperature=1.0 if parsed.temperature is None else parsed.temperature,  # Anthropic's default
        top_p=1.0 if parsed.top_p is None else parsed.top_p,
        stop=list(parsed.stop_sequences or []),
        grammar=the_plan.grammar,
        finish_after=the_plan.finish_after,
    )
    adapter = admitted_adapter(engine, request, parsed.model, params)
    message_id = f"msg_{uuid.uuid4().hex}"
    if parsed.stream:
        return _stream(engine, parsed, the_plan, ids, params, message_id, adapter)
    generation = await generate(engine, request, ids, params, adapter)
    c = generation.completions[0]
    blocks, finish, call_fields = content_blocks(the_plan, c)
    answer = _body(parsed, message_id, blocks, _stop(engine, params, c, finish))
    answer["usage"] = {"input_tokens": len(generation.prompt_token_ids), "output_tokens": len(c.token_ids)}
    answer.update(_token_fields(parsed, generation))
    answer.update(call_fields)
    return JSONResponse(answer, headers=headers(generation.version, generation.adapter))


def _stream(
    engine: Engine,
    parsed: MessagesRequest,
    the_plan: Plan,
    ids: list[int],
    params: SamplingParams,
    message_id: str,
    adapter: str | None,
) -> Response:
    future, queue = stream(engine, ids, params, adapter)
    version = engine.version
    held = _HeldText(bool(the_plan.tools), the_plan.fmt.open)

    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    async def events() -> AsyncIterator[str]:
        text_open = False
        try:
            start = _body(parsed, message_id, [], (None, None))
            start["usage"] = {"input_tokens": len(ids), "output_tokens": 0}
            yield event("message_start", message=start)
            yield event("ping")
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    yield event("error", error={"type": "api_error", "message": str(item)})
                    return
                if isinstance(item, Generation):
                    break
                text = held.feed(item[3])  # the event is (choice, token id, logprob, delta, top logprobs)
                if text:
                    if not text_open:
                        text_open = True
                        yield event("content_block_start", index=0, content_block={"type": "text", "text": ""})
                    yield event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})
            generation = item
            c = generation.completions[0]
            blocks, finish, call_fields = content_blocks(the_plan, c)
            if text_open and blocks[0]["type"] != "text":  # text streamed before calls that then parsed: keep it
                blocks.insert(0, {"type": "text", "text": held.text[: held.sent]})
            for index, block in enumerate(blocks):
                if block["type"] == "text":
                    if not text_open:
                        yield event("content_block_start", index=index, content_block={"type": "text", "text": ""})
                    rest = block["text"][held.sent :] if text_open else block["text"]
                    if rest:
                        yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": rest})
                else:
                    yield event("content_block_start", index=index, content_block={**block, "input": {}})
                    partial = json.dumps(block["input"])
                    yield event(
                        "content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": partial}
                    )
                yield event("content_block_stop", index=index)
            stop_reason, stop_sequence = _stop(engine, params, c, finish)
            final: dict[str, Any] = {
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": {"output_tokens": len(c.token_ids)},
                **_token_fields(parsed, generation),
            }
            final.update(call_fields)
            yield event("message_delta", **final)
            yield event("message_stop")
        finally:
            engine.cancel(future)

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers(version, adapter))
