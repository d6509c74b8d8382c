"""`/v1/chat/completions`: messages in, text or tool calls out, with the exact token ids and logprobs.

Tool calls and structured output are planned here (`plan`), shared with `/v1/responses`:
`tool_choice` `required` or a named function, and `response_format` `json_object` /
`json_schema`, become a grammar the engine decodes under; `auto` lets the model choose and
parses what it wrote. The token ids returned are always those sampled; under a grammar the
logprobs are the model's before the grammar's mask, and `allowed_tokens` (with
`return_token_ids`) says how many tokens the grammar allowed at each position (1: forced).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

import agentgrad.engine.tools as toolfmt
from agentgrad.engine.api import ChatRequest, RequestError, read_json, text_of, validate
from agentgrad.engine.constraints import json_object_grammar, json_schema_grammar
from agentgrad.engine.engine import Engine
from agentgrad.engine.params import SamplingParams
from agentgrad.engine.rows import Completion, Generation
from agentgrad.engine.wire import admitted_adapter, generate, headers, stream, token_logprobs, usage
from agentgrad.semconv import ALLOWED_TOKENS_FIELD, ENGINE_PARSER_PREFIX, TOOL_CALL_PARSER_FIELD, weights_fingerprint


@dataclass
class Plan:
    """What a request's tools and format ask of the engine, and how to read its reply."""

    tools: dict[str, dict[str, Any]] = field(
        default_factory=dict
    )  # name -> function spec, empty when no call may be made
    rendered_tools: list[dict[str, Any]] | None = None  # what goes into the prompt
    grammar: str | None = None
    finish_after: list[str] = field(default_factory=list)
    fmt: toolfmt.ToolFormat = toolfmt.HERMES  # how this model writes calls
    forced: bool = False  # tool_choice required or named: the reply is a call, or nothing

    def reply(self, completion: Completion) -> tuple[toolfmt.ParsedReply, str]:
        """The reply as text and tool calls, and its finish reason (`tool_calls` when it called).

        A forced call that did not finish (cut at `max_tokens` or the context: finish `length`) is
        never returned as text: no content, no calls, the finish reason and an error that says so."""
        parsed = toolfmt.parse_reply(completion.text, self.tools)
        finish = "tool_calls" if parsed.tool_calls and completion.finish_reason == "stop" else completion.finish_reason
        if self.forced and not parsed.tool_calls:
            parsed = toolfmt.ParsedReply(
                None,
                error=(
                    f"the forced tool call ended unfinished (finish_reason {finish!r}) after {len(completion.token_ids)} tokens: "
                    "raise max_tokens, or leave it unset (the context left over)"
                ),
            )
        return parsed, finish


def reply_fields(reply: toolfmt.ParsedReply) -> dict[str, str]:
    """The answer's fields about its calls: which parser read them (`engine:hermes`, `engine:pythonic`; the gateway
    records it, `semconv.TOOL_CALLS_PARSER`), or why a call-shaped reply stayed text (`tool_call_parse_error`)."""
    fields = {}
    if reply.tool_calls and reply.parser:
        fields[TOOL_CALL_PARSER_FIELD] = ENGINE_PARSER_PREFIX + reply.parser
    if reply.error:
        fields["tool_call_parse_error"] = reply.error
    return fields


def plan(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    parallel: bool | None,
    response_format: dict[str, Any] | None,
    fmt: toolfmt.ToolFormat = toolfmt.HERMES,
) -> Plan:
    """The plan for chat-shaped `tools` / `tool_choice` / `response_format` (calls in `fmt`); RequestError naming what is wrong."""
    try:
        specs = toolfmt.functions(tools)
    except ValueError as exc:
        raise RequestError(str(exc), "tools") from None
    choice, only = tool_choice or "auto", None
    if isinstance(choice, dict):
        only = (choice.get("function") or {}).get("name") or choice.get("name")
        if choice.get("type") != "function" or not isinstance(only, str):
            raise RequestError(
                "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
                "tool_choice",
            )
        if only not in specs:
            raise RequestError(
                f"tool_choice names {only!r}, which is not among the tools {sorted(specs)}", "tool_choice"
            )
        choice = "required"
    if choice == "required" and not specs:
        raise RequestError("tool_choice 'required' needs tools", "tool_choice")
    if choice == "none" or not specs:
        result = Plan()  # the tools are not shown: the model cannot call one
    else:
        result = Plan(specs, list(tools or []), fmt=fmt)
        if choice == "required":
            result.forced = True
            # one call unless parallel calls are asked for: a small model forced to call tends to call forever
            result.grammar = toolfmt.call_grammar(specs, only, parallel is True, fmt)
        elif parallel is False:
            result.finish_after = [fmt.close]
    kind = (response_format or {}).get("type", "text")
    if kind == "json_object" and result.grammar is None:
        result.grammar = json_object_grammar()
    elif kind == "json_schema" and result.grammar is None:
        schema = ((response_format or {}).get("json_schema") or {}).get("schema")
        try:
            result.grammar = json_schema_grammar(schema if schema is not None else {})
        except ValueError as exc:
            raise RequestError(f"response_format.json_schema.schema: {exc}", "response_format") from None
    elif kind not in ("text", "json_object", "json_schema"):
        raise RequestError(
            f"response_format type {kind!r} is not supported (text, json_object, json_schema)", "response_format"
        )
    return result


def chat_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """Validated messages as plain dicts with text content, ready for the template."""
    out = []
    for i, message in enumerate(messages):
        item: dict[str, Any] = {"role": message.role, "content": text_of(message.content, f"messages[{i}]")}
        if message.tool_calls:
            item["tool_calls"] = [call.model_dump(exclude_none=True) for call in message.tool_calls]
        for key in ("tool_call_id", "name"):
            if getattr(message, key):
                item[key] = getattr(message, key)
        out.append(item)
    return out


def prompt_ids(engine: Engine, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    try:
        ids = engine.chat_prompt_ids(toolfmt.template_history(messages), tools)
    except Exception as exc:  # a template that cannot render these messages
        raise RequestError(f"the chat template cannot render these messages: {exc}", "messages") from None
    if len(ids) >= engine.max_model_len:
        raise RequestError(
            f"the prompt has {len(ids)} tokens; this model takes at most {engine.max_model_len - 1}", "messages"
        )
    return ids


async def chat_completions(engine: Engine, names: list[str], request: Request) -> Response:
    parsed: ChatRequest = validate(await read_json(request), ChatRequest, names)
    the_plan = plan(
        parsed.tools,
        parsed.tool_choice,
        parsed.parallel_tool_calls,
        parsed.response_format,
        toolfmt.format_for(engine.tokenizer),
    )
    ids = prompt_ids(engine, chat_messages(parsed.messages), the_plan.rendered_tools)
    top = (parsed.top_logprobs or 0) if parsed.logprobs else 0
    if parsed.top_logprobs and not parsed.logprobs:
        raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
    params = parsed.params(grammar=the_plan.grammar, finish_after=the_plan.finish_after, top_logprobs=top)
    adapter = admitted_adapter(engine, request, parsed.model, params)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    if parsed.stream:
        return _stream(engine, parsed, the_plan, ids, params, completion_id, adapter)
    generation = await generate(engine, request, ids, params, adapter)
    choices = []
    for index, c in enumerate(generation.completions):
        reply, finish = the_plan.reply(c)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        choice: dict[str, Any] = {
            "index": index,
            "message": message,
            "finish_reason": finish,
            "logprobs": {"content": token_logprobs(engine, c.token_ids, c.logprobs, c.top_logprobs)}
            if parsed.logprobs
            else None,
        }
        choice.update(reply_fields(reply))
        if parsed.return_token_ids:
            choice["token_ids"] = c.token_ids
            if c.allowed_tokens is not None:
                choice[ALLOWED_TOKENS_FIELD] = c.allowed_tokens
        choices.append(choice)
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": parsed.model,
        "system_fingerprint": weights_fingerprint(generation.version),
        "choices": choices,
        "usage": usage(generation),
    }
    if parsed.return_token_ids:
        body["prompt_token_ids"] = generation.prompt_token_ids
    return JSONResponse(body, headers=headers(generation.version, generation.adapter))


class _HeldText:
    """Streams a choice's text while it cannot be a tool call; from the call's start (`<tool_call>`, `[`) on, holds it for the end."""

    def __init__(self, active: bool, marker: str = toolfmt.OPEN) -> None:
        self.active, self.text, self.sent, self.holding, self.marker = active, "", 0, False, marker

    def feed(self, delta: str) -> str:
        self.text += delta
        if not self.active:
            self.sent = len(self.text)
            return delta
        if not self.holding and self.marker in self.text:
            self.holding = True
        end = self.text.index(self.marker) if self.holding else len(self.text)
        if not self.holding:  # hold back a possible start of the tag
            for k in range(min(len(self.marker) - 1, len(self.text)), 0, -1):
                if self.marker.startswith(self.text[-k:]):
                    end = len(self.text) - k
                    break
        out, self.sent = self.text[self.sent : max(end, self.sent)], max(end, self.sent)
        return out


def _stream(
    engine: Engine,
    parsed: ChatRequest,
    the_plan: Plan,
    ids: list[int],
    params: SamplingParams,
    completion_id: str,
    adapter: str | None,
) -> Response:
    future, queue = stream(engine, ids, params, adapter)
    created, version = int(time.time()), engine.version
    held = [_HeldText(bool(the_plan.tools), the_plan.fmt.open) for _ in range(params.n)]

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": parsed.model,
            "system_fingerprint": weights_fingerprint(version),
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(body)}\n\n"

    def ending(index: int, c: Completion) -> list[str]:
        """The held text as tool calls (or as the text it is), then the finish reason."""
        reply, finish = the_plan.reply(c)
        rest = c.text[held[index].sent :]
        out = []
        if reply.tool_calls:
            calls = [
                {"index": k, "id": call["id"], "type": "function", "function": call["function"]}
                for k, call in enumerate(reply.tool_calls)
            ]
            close = the_plan.fmt.close
            trailing = rest[rest.rfind(close) + len(close) :] if close in rest else ""
            delta: dict[str, Any] = {"tool_calls": calls}
            if trailing.strip():
                delta["content"] = trailing
            out.append(chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]))
        elif rest and reply.content is not None:  # a forced call cut short is no text
            out.append(chunk([{"index": index, "delta": {"content": rest}, "logprobs": None, "finish_reason": None}]))
        last: dict[str, Any] = {"index": index, "delta": {}, "logprobs": None, "finish_reason": finish}
        if parsed.return_token_ids and c.allowed_tokens is not None:  # the whole choice's, once
            last[ALLOWED_TOKENS_FIELD] = c.allowed_tokens
        last.update(reply_fields(reply))
        out.append(chunk([last]))
        return out

    async def events() -> AsyncIterator[str]:
        try:
            first: dict[str, Any] = {"prompt_token_ids": ids} if parsed.return_token_ids else {}
            yield chunk(
                [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                    for i in range(params.n)
                ],
                **first,
            )
            while True:
                event = await queue.get()
                if isinstance(event, BaseException):
                    yield f"data: {json.dumps({'error': {'message': str(event), 'type': 'server_error'}})}\n\n"
                    break
                if isinstance(event, Generation):
                    for i, c in enumerate(event.completions):
                        for line in ending(i, c):
                            yield line
                    if (parsed.stream_options or {}).get("include_usage"):
                        yield chunk([], usage=usage(event))
                    break
                index, token, logprob, delta, top = event
                choice: dict[str, Any] = {
                    "index": index,
                    "delta": {"content": held[index].feed(delta)},
                    "finish_reason": None,
                    "logprobs": {"content": token_logprobs(engine, [token], [logprob], [top])}
                    if parsed.logprobs
                    else None,
                }
                if parsed.return_token_ids:
                    choice["token_ids"] = [token]
                yield chunk([choice])
            yield "data: [DONE]\n\n"
        finally:
            engine.cancel(future)  # a no-op once it finished; stops generating when the client left

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers(version, adapter))
