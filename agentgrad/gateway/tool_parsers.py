"""Which parser read a call's tool calls, and whether agentgrad's parser reads the same text the same way.

Training learns from the token ids a model wrote; the calls an agent ran were read out of those
tokens by whoever served it: the built-in engine (it names its parser in the answer,
`semconv.TOOL_CALL_PARSER_FIELD`), a vLLM server (its `--tool-call-parser`, which the gateway knows
from `Backend.tool_parser`), or any other upstream. Where the answer carries the reply's raw text,
agentgrad's own parser (`agentgrad.tool_calls`) reads it too, and a difference is recorded: a reward
may then be about calls the engine would not have made. The raw text is a chat choice's per-token
logprobs (which the gateway asks vLLM for), a Responses answer's `output_messages` (vLLM's raw reply,
asked for with `enable_response_messages`), or, in every API, the reply's text when the upstream
parsed no call out of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import agentgrad.gateway.messages as messages
import agentgrad.gateway.responses as responses
from agentgrad import semconv as sc
from agentgrad.tool_calls import call_signature, functions, parse_reply


@dataclass
class Reply:
    """One reply as both parsers see it: the raw text the model wrote (None: the answer does not carry it) and the
    calls the upstream read out of it (OpenAI tool calls)."""

    index: int
    text: str | None
    calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Reading:
    """What a second parse needs of one call: the parser the answer names, the request's tools as OpenAI function
    tools, whether the request turned tools off, and the replies."""

    said: Any
    tools: Any
    tools_off: bool
    replies: list[Reply]


def parser_attributes(
    api: str, request: dict[str, Any], response: dict[str, Any], system: str, tool_parser: str | None
) -> dict[str, Any]:
    """The span attributes naming the parser of the reply's calls (`semconv.TOOL_CALLS_PARSER`), and agentgrad's
    reading where it differs; none for a reply without calls that agentgrad reads as none either."""
    reader = _READERS.get(api)
    if reader is None:
        return {}
    reading = reader(request, response)
    attributes = _named(reading.said, any(r.calls for r in reading.replies), system, tool_parser)
    if reading.said is not None or system == "agentgrad":
        return attributes  # the engine's own parser read it: there is no second reading
    others = _other_readings(reading)
    if others:
        attributes[sc.TOOL_CALLS_PARSER] = attributes.get(sc.TOOL_CALLS_PARSER) or _upstream(system, tool_parser)
        attributes[sc.TOOL_CALLS_PARSER_DISAGREES] = True
        attributes[sc.TOOL_CALLS_OTHER_PARSE] = json.dumps(others, ensure_ascii=False)
    return attributes


def _chat_reading(request: dict[str, Any], response: dict[str, Any]) -> Reading:
    choices = [c for c in response.get("choices") or () if isinstance(c, dict)]
    said = next((c[sc.TOOL_CALL_PARSER_FIELD] for c in choices if c.get(sc.TOOL_CALL_PARSER_FIELD)), None)
    replies = [
        Reply(c.get("index", i), raw_text(c), (c.get("message") or {}).get("tool_calls") or [])
        for i, c in enumerate(choices)
    ]
    return Reading(said, request.get("tools"), request.get("tool_choice") == "none", replies)


def _responses_reading(request: dict[str, Any], response: dict[str, Any]) -> Reading:
    message = responses.output_message(response)
    raw = responses.raw_turn(response)
    text = raw.text if raw is not None else _uncalled_text(message)
    tools = request.get("tools")
    chat_tools = responses.tool_definitions(tools) if isinstance(tools, list) else tools
    reply = Reply(0, text, message.get("tool_calls") or [])
    return Reading(response.get(sc.TOOL_CALL_PARSER_FIELD), chat_tools, request.get("tool_choice") == "none", [reply])


def _messages_reading(request: dict[str, Any], response: dict[str, Any]) -> Reading:
    message = messages.output_message(response)
    tools = request.get("tools")
    chat_tools = messages.tool_definitions(tools) if isinstance(tools, list) else tools
    choice = request.get("tool_choice")
    off = isinstance(choice, dict) and choice.get("type") == "none"
    reply = Reply(0, _uncalled_text(message), message.get("tool_calls") or [])
    return Reading(response.get(sc.TOOL_CALL_PARSER_FIELD), chat_tools, off, [reply])


_READERS = {
    sc.CHAT_COMPLETIONS_API: _chat_reading,
    sc.RESPONSES_API: _responses_reading,
    sc.MESSAGES_API: _messages_reading,
}
"""Each API whose replies can hold tool calls, read into the one shape a second parse compares."""


def _uncalled_text(message: dict[str, Any]) -> str | None:
    """A reply's text, where the upstream parsed no call out of it (else the calls' own text is not in the answer)."""
    content = message.get("content")
    return content if not message.get("tool_calls") and isinstance(content, str) else None


def _upstream(system: str, tool_parser: str | None) -> str:
    return sc.VLLM_PARSER_PREFIX + tool_parser if system == "vllm" and tool_parser else sc.UPSTREAM_PARSER


def _named(said: Any, called: bool, system: str, tool_parser: str | None) -> dict[str, Any]:
    if not called:
        return {}
    return {sc.TOOL_CALLS_PARSER: said if isinstance(said, str) and said else _upstream(system, tool_parser)}


REPLACEMENT = "\ufffd"
"""What vLLM writes for each token of a character split across tokens: it decodes every token on its own, so a
byte-level BPE token holding part of a UTF-8 character (an emoji, a rare CJK character) becomes U+FFFD, its bytes too."""


def raw_text(choice: dict[str, Any]) -> str | None:
    """What the model wrote in a chat choice: its per-token logprobs' tokens joined (bytes where given), else its
    text content when it holds no calls; None when the answer does not carry it (a call parsed without logprobs),
    or when the tokens lost a character split across them (`REPLACEMENT`) that the reply, decoded whole, has."""
    message = choice.get("message") or {}
    content = ((choice.get("logprobs") or {}) if isinstance(choice.get("logprobs"), dict) else {}).get("content")
    if isinstance(content, list) and content and all(isinstance(t, dict) for t in content):
        text = None
        if all(isinstance(t.get("bytes"), list) for t in content):
            text = bytes(b for t in content for b in t["bytes"]).decode("utf-8", "replace")
        elif all(isinstance(t.get("token"), str) for t in content):
            text = "".join(t["token"] for t in content)
        if text is not None:
            return None if REPLACEMENT in text and not _holds_replacement(message) else text
    return _uncalled_text(message)


def _holds_replacement(message: dict[str, Any]) -> bool:
    """Whether a reply as its upstream decoded it whole (text and calls) holds U+FFFD: the model wrote one itself."""
    parts: list[Any] = [message.get("content")]
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts += [function.get("name"), function.get("arguments")]
    text = "".join(p for p in parts if isinstance(p, str))
    return REPLACEMENT in text or "\\ufffd" in text.lower()  # arguments may escape it in their JSON


def _other_readings(reading: Reading) -> list[dict[str, Any]]:
    """Per reply whose raw text agentgrad's parser reads into other calls than the upstream returned: that reading."""
    try:
        tools = functions(reading.tools)
    except ValueError:
        return []  # tools the engine could not serve either: nothing to compare with
    if not tools or reading.tools_off:
        return []
    others = []
    for reply in reading.replies:
        if reply.text is None:
            continue
        ours = parse_reply(reply.text, tools)
        signature = call_signature(ours.tool_calls)
        if signature != call_signature(reply.calls):
            others.append(
                {
                    "choice": reply.index,
                    "parser": sc.ENGINE_PARSER_PREFIX + ours.parser if ours.parser else None,
                    "tool_calls": [{"name": n, "arguments": a} for n, a in signature],
                    "error": ours.error,
                }
            )
    return others
