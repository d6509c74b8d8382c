"""`/v1/responses`: the OpenAI Responses API on the local model (what the OpenAI Agents SDK speaks by default).

Served: `input` as a string or items (messages, `function_call`, `function_call_output`),
`instructions`, function `tools` with `tool_choice` and `parallel_tool_calls`,
`text.format` (text / json_object / json_schema), `temperature`, `top_p`,
`max_output_tokens`, `top_logprobs` with `include: ["message.output_text.logprobs"]`, and
streaming events. Nothing is stored: `store: true` and `previous_response_id` are refused, so
an agent sends its whole history each turn (the Agents SDK does by default).

With `return_token_ids: true` the response (and the `response.completed` event) carries
`prompt_token_ids`, `token_ids` and `token_logprobs`: what was sampled, text or tool call (and,
under a grammar, `allowed_tokens`: how many tokens it allowed at each position).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from agentgrad.engine.api import RequestError, _Strict, read_json, text_of, validate
from agentgrad.engine.chat import Plan, _HeldText, plan, prompt_ids, reply_fields
from agentgrad.engine.engine import Engine
from agentgrad.engine.params import MAX_SEED, MAX_TOP_LOGPROBS, SamplingParams
from agentgrad.engine.rows import Completion, Generation
from agentgrad.engine.tools import format_for
from agentgrad.engine.wire import admitted_adapter, generate, headers, stream
from agentgrad.semconv import ALLOWED_TOKENS_FIELD, weights_fingerprint

LOGPROBS_INCLUDE = "message.output_text.logprobs"


class ResponsesRequest(_Strict):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_output_tokens: int | None = Field(None, ge=1)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    include: list[Literal["message.output_text.logprobs"]] | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: Literal[False] | None = None
    truncation: Literal["disabled"] | None = None
    reasoning: None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: Literal["auto", "default"] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    return_token_ids: bool = False


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (flat) as chat tools; other tool types are refused."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise RequestError(
                f"tools[{i}]: tools of type {tool.get('type')!r} are not supported (function only)", "tools"
            )
        out.append(
            {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool}}
        )
    return out


def chat_messages(parsed: ResponsesRequest) -> list[dict[str, Any]]:
    """`instructions` and `input` items as chat messages (calls joined to their assistant turn)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": parsed.instructions}] if parsed.instructions else []
    items = [{"role": "user", "content": parsed.input}] if isinstance(parsed.input, str) else parsed.input
    for i, item in enumerate(items):
        kind, where = item.get("type", "message"), f"input[{i}]"
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(
                    f"{where}.role must be user, system, developer or assistant, got {role!r}", f"{where}.role"
                )
            content = item.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise RequestError(f"{where}.content must be a string or a list of content parts", f"{where}.content")
            messages.append({"role": role, "content": text_of(content, where)})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("call_id"), str):
                raise RequestError(f"{where}: a function_call needs a string name and call_id", where)
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = (
                output
                if isinstance(output, str)
                else text_of(output, where)
                if isinstance(output, list)
                else json.dumps(output)
            )
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        else:
            raise RequestError(
                f"{where}: input items of type {kind!r} are not supported (message, function_call, function_call_output)",
                f"{where}.type",
            )
    if not messages:
        raise RequestError("input is empty", "input")
    return messages


def output_items(
    engine: Engine, the_plan: Plan, completion: Completion, logprobs: bool
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The output items (a message, function calls) and the body's fields about the calls (`reply_fields`)."""
    reply, _ = the_plan.reply(completion)
    items: list[dict[str, Any]] = []
    if reply.content is not None or not reply.tool_calls:
        part: dict[str, Any] = {"type": "output_text", "text": reply.content or "", "annotations": []}
        if logprobs:
            part["logprobs"] = _logprobs(engine, completion)
        items.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for call in reply.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    return items, reply_fields(reply)


def _logprobs(engine: Engine, c: Completion) -> list[dict[str, Any]]:
    decode = engine.tokenizer.decode
    return [
        {
            "token": decode([t]),
            "logprob": lp,
            "bytes": list(decode([t]).encode()),
            "top_logprobs": [
                {"token": decode([a]), "logprob": v, "bytes": list(decode([a]).encode())}
                for a, v in (c.top_logprobs[i] if i < len(c.top_logprobs) else [])
            ],
        }
        for i, (t, lp) in enumerate(zip(c.token_ids, c.logprobs))
    ]


def _body(
    parsed: ResponsesRequest,
    response_id: str,
    created: int,
    status: str,
    output: list[dict[str, Any]],
    generation: Generation | None,
    version: int,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": parsed.model,
        "output": output,
        "instructions": parsed.instructions,
        "tools": parsed.tools or [],
        "tool_choice": parsed.tool_choice or "auto",
        "parallel_tool_calls": parsed.parallel_tool_calls is not False,
        "temperature": parsed.temperature,
        "top_p": parsed.top_p,
        "max_output_tokens": parsed.max_output_tokens,
        "text": parsed.text or {"format": {"type": "text"}},
        "metadata": parsed.metadata or {},
        "store": False,
        "previous_response_id": None,
        "reasoning": None,
        "truncation": "disabled",
        "error": None,
        "incomplete_details": None,
        "usage": None,
        "system_fingerprint": weights_fingerprint(version),
    }
    if generation is not None:
        c = generation.completions[0]
        if c.finish_reason == "length":
            body["status"], body["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        prompt, out = len(generation.prompt_token_ids), len(c.token_ids)
        body["usage"] = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + out,
        }
        if parsed.return_token_ids:
            body.update(prompt_token_ids=generation.prompt_token_ids, token_ids=c.token_ids, token_logprobs=c.logprobs)
            if c.allowed_tokens is not None:
                body[ALLOWED_TOKENS_FIELD] = c.allowed_tokens
    return body


async def responses(engine: Engine, names: list[str], request: Request) -> Response:
    parsed: ResponsesRequest = validate(await read_json(request), ResponsesRequest, names)
    fmt = (parsed.text or {}).get("format") or {"type": "text"}
    response_format = (
        {"type": fmt.get("type"), "json_schema": {"schema": fmt.get("schema")}}
        if fmt.get("type") == "json_schema"
        else {"type": fmt.get("type", "text")}
    )
    tools = chat_tools(parsed.tools)
    choice = parsed.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}
    the_plan = plan(tools, choice, parsed.parallel_tool_calls, response_format, format_for(engine.tokenizer))
    ids = prompt_ids(engine, chat_messages(parsed), the_plan.rendered_tools)
    logprobs = LOGPROBS_INCLUDE in (parsed.include or [])
    params = SamplingParams(
        max_tokens=parsed.max_output_tokens,  # absent: up to the context left
        temperature=1.0 if parsed.temperature is None else parsed.temperature,
        top_p=1.0 if parsed.top_p is None else parsed.top_p,
        seed=parsed.seed,
        top_logprobs=(parsed.top_logprobs or 0) if logprobs else 0,
        grammar=the_plan.grammar,
        finish_after=the_plan.finish_after,
    )
    adapter = admitted_adapter(engine, request, parsed.model, params)
    response_id, created = f"resp_{uuid.uuid4().hex}", int(time.time())
    if parsed.stream:
        return _stream(engine, parsed, the_plan, ids, params, response_id, created, logprobs, adapter)
    generation = await generate(engine, request, ids, params, adapter)
    items, call_fields = output_items(engine, the_plan, generation.completions[0], logprobs)
    body = _body(parsed, response_id, created, "completed", items, generation, generation.version)
    body.update(call_fields)
    return JSONResponse(body, headers=headers(generation.version, generation.adapter))


def _stream(
    engine: Engine,
    parsed: ResponsesRequest,
    the_plan: Plan,
    ids: list[int],
    params: SamplingParams,
    response_id: str,
    created: int,
    logprobs: bool,
    adapter: str | None,
) -> Response:
    future, queue = stream(engine, ids, params, adapter)
    version = engine.version
    held = _HeldText(bool(the_plan.tools), the_plan.fmt.open)
    sequence = iter(range(1 << 62))

    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(sequence), **fields})}\n\n"

    async def events() -> AsyncIterator[str]:
        message_id, message_open = f"msg_{uuid.uuid4().hex}", False

        def text_event(kind: str, **fields: Any) -> str:
            """An event of the one message's one text part."""
            return event(kind, item_id=message_id, output_index=0, content_index=0, **fields)

        try:
            yield event(
                "response.created", response=_body(parsed, response_id, created, "in_progress", [], None, version)
            )
            yield event(
                "response.in_progress", response=_body(parsed, response_id, created, "in_progress", [], None, version)
            )
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    failed = _body(parsed, response_id, created, "failed", [], None, version)
                    failed["error"] = {"code": "server_error", "message": str(item)}
                    yield event("response.failed", response=failed)
                    return
                if isinstance(item, Generation):
                    break
                delta = item[3]  # the event is (choice, token id, logprob, delta, top logprobs)
                text = held.feed(delta)
                if text and not message_open:
                    message_open = True
                    yield event(
                        "response.output_item.added",
                        output_index=0,
                        item={
                            "type": "message",
                            "id": message_id,
                            "status": "in_progress",
                            "role": "assistant",
                            "content": [],
                        },
                    )
                    yield text_event(
                        "response.content_part.added", part={"type": "output_text", "text": "", "annotations": []}
                    )
                if text:
                    yield text_event("response.output_text.delta", delta=text, logprobs=[])
            generation = item
            items, call_fields = output_items(engine, the_plan, generation.completions[0], logprobs)
            if message_open or items[0]["type"] == "message":
                message = items[0] if items[0]["type"] == "message" else None
                text = message["content"][0]["text"] if message else held.text[: held.sent]
                if message is None:  # text streamed before calls that then parsed: keep it as the message it was
                    message = {
                        "type": "message",
                        "id": message_id,
                        "status": "completed",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}],
                    }
                    items.insert(0, message)
                message["id"] = message_id
                if not message_open:
                    yield event(
                        "response.output_item.added",
                        output_index=0,
                        item={**message, "status": "in_progress", "content": []},
                    )
                    yield text_event(
                        "response.content_part.added", part={"type": "output_text", "text": "", "annotations": []}
                    )
                rest = text[held.sent :] if len(text) > held.sent else ""
                if rest:
                    yield text_event("response.output_text.delta", delta=rest, logprobs=[])
                yield text_event("response.output_text.done", text=text, logprobs=[])
                yield text_event("response.content_part.done", part=message["content"][0])
                yield event("response.output_item.done", output_index=0, item=message)
            for index, call in enumerate(items):
                if call["type"] != "function_call":
                    continue
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item={**call, "arguments": "", "status": "in_progress"},
                )
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=call["id"],
                    output_index=index,
                    delta=call["arguments"],
                )
                yield event(
                    "response.function_call_arguments.done",
                    item_id=call["id"],
                    output_index=index,
                    name=call["name"],
                    arguments=call["arguments"],
                )
                yield event("response.output_item.done", output_index=index, item=call)
            body = _body(parsed, response_id, created, "completed", items, generation, generation.version)
            body.update(call_fields)
            yield event(
                "response.incomplete" if body["status"] == "incomplete" else "response.completed", response=body
            )
        finally:
            engine.cancel(future)

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers(version, adapter))
