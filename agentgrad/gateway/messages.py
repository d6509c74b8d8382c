"""Anthropic's Messages API (`/v1/messages`) in the gateway: relayed in its own shape, recorded as a chat.

A Messages call is recorded like a chat completion (`gen_ai.operation.name` "chat",
`agentgrad.llm.api` "messages"), so adapters, SFT and APO read every API alike: `system` becomes a
system message, an assistant's `tool_use` blocks its `tool_calls` (the input as JSON arguments), a
user's `tool_result` blocks `tool` messages, and the tools OpenAI-style function definitions. Token
ids come from an upstream that returns them when asked (`return_token_ids`): the agentgrad engine
puts `prompt_token_ids`, `token_ids` and `token_logprobs` in the body, and, streamed, on the
`message_delta` event; the gateway strips them when it was the one asking.

Errors reach the agent in Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`, an
`event: error` ending a stream), so the `anthropic` SDK raises its own exceptions for them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import orjson

from agentgrad import semconv as sc
from agentgrad.gateway.sse import Event

if TYPE_CHECKING:
    from agentgrad.gateway.upstreams import Added, GatewayError

ANTHROPIC_VERSION = "2023-06-01"
"""The `anthropic-version` sent to an Anthropic upstream when the agent sent none."""
RELAYED_HEADERS = (b"anthropic-version", b"anthropic-beta")
"""The agent's headers passed on to a Messages upstream (its `x-api-key` is the gateway's, never relayed)."""
TOKEN_FIELDS = ("prompt_token_ids", "token_ids", "token_logprobs")
"""Where an upstream that returns token ids puts them: the body, or the `message_delta` event, streamed."""

STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}
"""Anthropic's `stop_reason` as the chat-completions finish reason a span records."""

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
"""Anthropic's error type for each status the gateway answers with; any other is an `api_error`."""
ANTHROPIC_ERROR_TYPES = frozenset({*ERROR_TYPES.values(), "api_error", "billing_error", "timeout_error"})


# ----------------------------------------------------------------------------- requests and answers as chats


def _text(content: Any) -> Any:
    """Content as text: a string as is, a list of text blocks joined; anything else unchanged."""
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(str(b.get("text", "")) for b in content)
    return content


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    arguments = json.dumps(block.get("input") if block.get("input") is not None else {})
    return {"id": block.get("id"), "type": "function", "function": {"name": block.get("name"), "arguments": arguments}}


def input_messages(request: dict[str, Any]) -> list[Any]:
    """`system` and `messages` as chat messages: tool_use blocks as tool calls, tool_result blocks as tool messages."""
    messages: list[Any] = []
    system = _text(request.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for message in request.get("messages") or ():
        if not isinstance(message, dict):
            messages.append(message)
            continue
        role, content = message.get("role"), message.get("content")
        if not isinstance(content, list):
            messages.append({"role": role, "content": content})
            continue
        calls = [_tool_call(b) for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                result = _text(block.get("content"))
                text = result if isinstance(result, str) else json.dumps(result)
                messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        rest = [b for b in content if not (isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result"))]
        if rest or calls or not content:
            text = _text(rest)
            chat: dict[str, Any] = {"role": role, "content": (text or None) if calls else text}
            if calls:
                chat["tool_calls"] = calls
            messages.append(chat)
    return messages


def tool_definitions(tools: list[Any]) -> list[Any]:
    """Anthropic tools (`name`, `description`, `input_schema`) as OpenAI function definitions."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.get("name"),
                "description": t.get("description", ""),
                "parameters": t.get("input_schema", {}),
            },
        }
        if isinstance(t, dict) and "input_schema" in t
        else t
        for t in tools
    ]


def output_message(response: dict[str, Any]) -> dict[str, Any]:
    """The content blocks as one assistant message: its text, its tool_use blocks as tool calls."""
    blocks = [b for b in response.get("content") or () if isinstance(b, dict)]
    text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    calls = [_tool_call(b) for b in blocks if b.get("type") == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def output_attributes(response: dict[str, Any]) -> dict[str, Any]:
    """The answer's own attributes; `recording.response_attributes` adds the id, model, usage and version."""
    reason = response.get("stop_reason")
    attributes: dict[str, Any] = {
        sc.CHOICE_COUNT: 1,
        sc.GEN_AI_FINISH_REASONS: [STOP_REASONS.get(str(reason), str(reason or ""))],
        sc.GEN_AI_OUTPUT_MESSAGES: json.dumps([output_message(response)]),
    }
    for field, name in zip(TOKEN_FIELDS, (sc.PROMPT_TOKEN_IDS, sc.RESPONSE_TOKEN_IDS, sc.RESPONSE_LOGPROBS)):
        if isinstance(response.get(field), list):
            attributes[name] = response[field]
    return attributes


def request_problem(request: dict[str, Any]) -> str | None:
    """Why the gateway cannot read this Messages request, or None (the rest is the upstream's to judge)."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return f"'messages' must be a list of message objects, not {type(messages).__name__}"
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, str) and not (
            isinstance(content, list) and all(isinstance(b, dict) for b in content)
        ):
            return f"messages[{i}].content must be a string or a list of content blocks"
    stop = request.get("stop_sequences")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        return "'stop_sequences' must be a list of strings"
    for name, expected in (("tools", list), ("tool_choice", dict), ("max_tokens", int)):
        value = request.get(name)
        if value is not None and (not isinstance(value, expected) or isinstance(value, bool)):
            return f"'{name}' must be {'an integer' if expected is int else 'a ' + expected.__name__}"
    return None


# ----------------------------------------------------------------------------- streaming


class MessagesStream:
    """Rebuilds the message from a stream's events (`message_start` ... `message_stop`), or what came before a break."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, str] = {}
        self.generating = False
        """Whether a content delta came: the first token's time."""

    def add(self, event: dict[str, Any]) -> None:
        kind, index = event.get("type"), event.get("index", 0)
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self.message = dict(event["message"])
        elif kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self.blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            self.generating = True
            block, delta = self.blocks.setdefault(index, {"type": "text", "text": ""}), event["delta"]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif delta.get("type") == "input_json_delta":
                self.partial_json[index] = self.partial_json.get(index, "") + str(delta.get("partial_json", ""))
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
        elif kind == "content_block_stop" and index in self.partial_json:
            try:
                self.blocks[index]["input"] = json.loads(self.partial_json.pop(index) or "{}")
            except (ValueError, KeyError):
                pass
        elif kind == "message_delta":
            delta = event["delta"] if isinstance(event.get("delta"), dict) else {}
            self.message.update({k: v for k, v in delta.items() if k in ("stop_reason", "stop_sequence")})
            if isinstance(event.get("usage"), dict):
                self.message["usage"] = {**(self.message.get("usage") or {}), **event["usage"]}
            for field in TOKEN_FIELDS:
                if isinstance(event.get(field), list):
                    self.message[field] = event[field]
            if isinstance(event.get(sc.TOOL_CALL_PARSER_FIELD), str):  # the engine's, on its last delta
                self.message[sc.TOOL_CALL_PARSER_FIELD] = event[sc.TOOL_CALL_PARSER_FIELD]

    def result(self) -> dict[str, Any]:
        return {**self.message, "content": [self.blocks[i] for i in sorted(self.blocks)]}


def relay_event(event: bytes, stream: MessagesStream, added: Added) -> bytes:
    """One Messages stream event (`event:` and `data:` lines) on its way to the agent: recorded, and stripped of
    the token ids the gateway asked for."""
    if not event:
        return b""
    parsed = Event.parse(event)
    data = parsed.data
    if not isinstance(data, dict):
        return event + b"\n\n"
    stream.add(data)
    if added.token_ids and any(field in data for field in TOKEN_FIELDS):
        for field in TOKEN_FIELDS:
            data.pop(field, None)
        return parsed.encode()
    return event + b"\n\n"


# ----------------------------------------------------------------------------- errors


def error_body(error: GatewayError) -> bytes:
    """The gateway's refusal in Anthropic's shape: the type its status stands for, else an upstream's own."""
    kind = ERROR_TYPES.get(error.status) or (error.type if error.type in ANTHROPIC_ERROR_TYPES else "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": error.message}})


def error_event(error: GatewayError) -> bytes:
    """The event ending a stream that broke off."""
    return b"event: error\ndata: " + error_body(error) + b"\n\n"


def relayed_headers(headers: dict[bytes, bytes]) -> dict[str, str]:
    """The agent's Anthropic headers to pass upstream (`anthropic-version`, `anthropic-beta`)."""
    return {name.decode(): headers[name].decode("latin-1") for name in RELAYED_HEADERS if name in headers}
