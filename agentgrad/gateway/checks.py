"""What the gateway checks of a call before it relays it: shapes an upstream may let through but the
client or the span record cannot hold.

A request field of the wrong type (`stop: 5`) is refused with a 400 naming it, before it reaches
an upstream that might ignore it; an answer or stream chunk whose `choices` are not objects is a
502 naming the upstream. Either way the call is still recorded, as a failed span. Only what the
gateway itself reads is checked: the rest is the upstream's to judge.
"""

from __future__ import annotations

from typing import Any

from agentgrad.semconv import CHAT_COMPLETIONS_API, RESPONSES_API


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def request_problem(api: str, request: dict[str, Any]) -> str | None:
    """Why the gateway cannot relay this request as it stands, or None."""
    stop = request.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        return f"'stop' must be a string or a list of strings, not {_kind(stop)} {stop!r:.40}"
    if api == CHAT_COMPLETIONS_API:
        messages = request.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return f"'messages' must be a list of message objects, not {_kind(messages)}"
    for name in ("stream_options", "tools") if api in (CHAT_COMPLETIONS_API, RESPONSES_API) else ("stream_options",):
        value = request.get(name)
        expected = dict if name == "stream_options" else list
        if value is not None and not isinstance(value, expected):
            return f"'{name}' must be {'an object' if expected is dict else 'a list'}, not {_kind(value)}"
    return None


def answer_problem(api: str, answer: dict[str, Any], *, chunk: bool = False) -> str | None:
    """Why an upstream's answer (or one stream chunk of it) cannot be relayed and recorded, or None."""
    choices = answer.get("choices")
    if choices is not None and not isinstance(choices, list):
        return f"'choices' is {_kind(choices)}, not a list"
    part = "delta" if chunk else ("message" if api == CHAT_COMPLETIONS_API else None)
    for i, choice in enumerate(choices or ()):
        if not isinstance(choice, dict):
            return f"choices[{i}] is {_kind(choice)}, not an object"
        if not isinstance(choice.get("index", 0), int):
            return f"choices[{i}].index is {_kind(choice.get('index'))}, not an integer"
        for name, expected in ((part, dict), ("logprobs", dict), ("token_ids", list)):
            value = choice.get(name) if name else None
            if value is not None and not isinstance(value, expected):
                return f"choices[{i}].{name} is {_kind(value)}, not {'an object' if expected is dict else 'a list'}"
        logprobs = choice.get("logprobs") or {}
        content = logprobs.get("content")
        if content is not None and not (isinstance(content, list) and all(isinstance(e, dict) for e in content)):
            return f"choices[{i}].logprobs.content is not a list of objects"
    for name in ("usage",):
        value = answer.get(name)
        if value is not None and not isinstance(value, dict):
            return f"'{name}' is {_kind(value)}, not an object"
    return None
