"""Which parser read a call's tool calls, and whether agentgrad's parser reads the same text the same way.

Training learns from the token ids a model wrote; the calls an agent ran were read out of those
tokens by whoever served it: the built-in engine (it names its parser in the answer,
`semconv.TOOL_CALL_PARSER_FIELD`), a vLLM server (its `--tool-call-parser`, which the gateway knows
from `Backend.tool_parser`), or any other upstream. Where the answer carries the reply's raw text
(a chat choice's per-token logprobs, which the gateway asks vLLM for; or the text itself, when the
upstream parsed no call), agentgrad's own parser (`agentgrad.tool_calls`) reads it too, and a
difference is recorded: a reward may then be about calls the engine would not have made.
"""

from __future__ import annotations

import json
from typing import Any

from agentgrad import semconv as sc
from agentgrad.tool_calls import call_signature, functions, parse_reply


def parser_attributes(
    api: str, request: dict[str, Any], response: dict[str, Any], system: str, tool_parser: str | None
) -> dict[str, Any]:
    """The span attributes naming the parser of the reply's calls (`semconv.TOOL_CALLS_PARSER`), and agentgrad's
    reading where it differs; none for a reply without calls that agentgrad reads as none either."""
    if api == sc.RESPONSES_API:
        said = response.get(sc.TOOL_CALL_PARSER_FIELD)
        called = any(isinstance(i, dict) and i.get("type") == "function_call" for i in response.get("output") or ())
        return _named(said, called, system, tool_parser)
    if api == sc.MESSAGES_API:
        said = response.get(sc.TOOL_CALL_PARSER_FIELD)
        called = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in response.get("content") or ())
        return _named(said, called, system, tool_parser)
    if api != sc.CHAT_COMPLETIONS_API:
        return {}
    choices = [c for c in response.get("choices") or () if isinstance(c, dict)]
    said = next((c[sc.TOOL_CALL_PARSER_FIELD] for c in choices if c.get(sc.TOOL_CALL_PARSER_FIELD)), None)
    called = any((c.get("message") or {}).get("tool_calls") for c in choices)
    attributes = _named(said, called, system, tool_parser)
    if said is not None or system == "agentgrad":
        return attributes  # the engine's own parser read it: there is no second reading
    others = _other_readings(request, choices)
    if others:
        attributes[sc.TOOL_CALLS_PARSER] = attributes.get(sc.TOOL_CALLS_PARSER) or _upstream(system, tool_parser)
        attributes[sc.TOOL_CALLS_PARSER_DISAGREES] = True
        attributes[sc.TOOL_CALLS_OTHER_PARSE] = json.dumps(others, ensure_ascii=False)
    return attributes


def _upstream(system: str, tool_parser: str | None) -> str:
    return sc.VLLM_PARSER_PREFIX + tool_parser if system == "vllm" and tool_parser else sc.UPSTREAM_PARSER


def _named(said: Any, called: bool, system: str, tool_parser: str | None) -> dict[str, Any]:
    if not called:
        return {}
    return {sc.TOOL_CALLS_PARSER: said if isinstance(said, str) and said else _upstream(system, tool_parser)}


def raw_text(choice: dict[str, Any]) -> str | None:
    """What the model wrote in a chat choice: its per-token logprobs' tokens joined (bytes where given), else its
    text content when it holds no calls; None when the answer does not carry it (a call parsed without logprobs)."""
    content = ((choice.get("logprobs") or {}) if isinstance(choice.get("logprobs"), dict) else {}).get("content")
    if isinstance(content, list) and content and all(isinstance(t, dict) for t in content):
        if all(isinstance(t.get("bytes"), list) for t in content):
            return bytes(b for t in content for b in t["bytes"]).decode("utf-8", "replace")
        if all(isinstance(t.get("token"), str) for t in content):
            return "".join(t["token"] for t in content)
    message = choice.get("message") or {}
    if not message.get("tool_calls") and isinstance(message.get("content"), str):
        return str(message["content"])
    return None


def _other_readings(request: dict[str, Any], choices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per choice whose raw text agentgrad's parser reads into other calls than the upstream returned: that reading."""
    try:
        tools = functions(request.get("tools"))
    except ValueError:
        return []  # tools the engine could not serve either: nothing to compare with
    if not tools or request.get("tool_choice") == "none":
        return []
    others = []
    for index, choice in enumerate(choices):
        text = raw_text(choice)
        if text is None:
            continue
        ours = parse_reply(text, tools)
        theirs = (choice.get("message") or {}).get("tool_calls") or []
        signature = call_signature(ours.tool_calls)
        if signature != call_signature(theirs):
            others.append(
                {
                    "choice": choice.get("index", index),
                    "parser": sc.ENGINE_PARSER_PREFIX + ours.parser if ours.parser else None,
                    "tool_calls": [{"name": n, "arguments": a} for n, a in signature],
                    "error": ours.error,
                }
            )
    return others
