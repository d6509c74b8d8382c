"""Tool runs read from the conversation: an agent that runs its own functions gets a span per tool run, unchanged.

A plain `openai` agent has no framework to hook: the gateway sees only the reply that asked for a tool call and,
in a later request of the same attempt, the `tool` message that carries the call's result. `ToolRuns` remembers
the calls each reply asked for (their id, name, arguments and when the reply ended) and, when a request answers
one, records an `execute_tool <name>` span from the end of that reply to the arrival of the request, with its
arguments and result, beside that request's span (its trace and parent). Only calls this gateway handed out
count, so a worked example's made-up calls in a prompt never become runs; and only the results after the
request's last assistant message, so each run is recorded once, though later requests repeat it. An attempt that
traces its tool runs itself (`semconv.TOOL_RUNS_TRACED_HEADER`) gets none from here. Chat Completions only: the
other APIs' agents (the Agents SDK, Anthropic's) come with frameworks that trace, or use `ag.emit_span`.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from agentgrad import semconv as sc
from agentgrad.gateway.recording import Call
from agentgrad.redact import redact_known
from agentgrad.types import Span, SpanStatus

REMEMBERED_CALLS = 50_000
"""Tool calls awaiting their result, across attempts; past this the oldest are forgotten (their runs go unrecorded)."""


@dataclass(frozen=True)
class AskedCall:
    """A tool call a reply asked for: what the run's span needs from that reply."""

    name: str
    arguments: str
    asked_at: float  # the reply's end, seconds since the epoch


class ToolRuns:
    """The tool calls the gateway's replies asked for, by attempt and call id, until a request carries each result."""

    def __init__(self, capacity: int = REMEMBERED_CALLS) -> None:
        self.capacity = capacity
        self._asked: OrderedDict[tuple[str, str], AskedCall] = OrderedDict()

    def observe(self, call: Call, span: Span) -> list[Span]:
        """Called with each recorded call: the spans of the tool runs its request answers; then remembers the
        calls its reply asks for."""
        if call.attempt_id is None or call.api != sc.CHAT_COMPLETIONS_API:
            return []
        runs = [] if call.tool_runs_traced else self._answered(call, span)
        if span.status.code != "ERROR":
            self._remember(call.attempt_id, span)
        return runs

    def _remember(self, attempt_id: str, span: Span) -> None:
        output = span.attributes.get(sc.GEN_AI_OUTPUT_MESSAGES)
        if not isinstance(output, str) or '"tool_calls"' not in output:
            return
        for message in orjson.loads(output):
            for tool_call in (message or {}).get("tool_calls") or ():
                function = tool_call.get("function") or {}
                if tool_call.get("id") and function.get("name"):
                    key = (attempt_id, str(tool_call["id"]))
                    self._asked[key] = AskedCall(
                        str(function["name"]), str(function.get("arguments") or ""), span.end_time or span.start_time
                    )
                    self._asked.move_to_end(key)
        while len(self._asked) > self.capacity:
            self._asked.popitem(last=False)

    def _answered(self, call: Call, span: Span) -> list[Span]:
        runs = []
        for message in _since_last_reply(call.request.get("messages")):
            if message.get("role") != "tool":
                continue
            asked = self._asked.pop((call.attempt_id or "", str(message.get("tool_call_id"))), None)
            if asked is None:
                continue
            attributes = sc.tool_attributes(
                asked.name, asked.arguments, _text(message.get("content")), str(message["tool_call_id"])
            )
            attributes[sc.TOOL_RUN_SOURCE] = sc.TOOL_RUN_FROM_CONVERSATION
            if call.agent:
                attributes[sc.AGENT_NAME] = call.agent
            runs.append(
                Span.model_construct(
                    rollout_id=call.rollout_id,
                    attempt_id=call.attempt_id,
                    sequence_id=0,
                    trace_id=span.trace_id,  # beside the call that carried its result
                    span_id=f"{random.getrandbits(64):016x}",
                    parent_id=span.parent_id,
                    name=f"{sc.EXECUTE_TOOL} {asked.name}",
                    start_time=asked.asked_at,
                    end_time=max(asked.asked_at, call.start_time),
                    attributes={
                        key: redact_known(value) if isinstance(value, str) else value
                        for key, value in attributes.items()
                    },
                    events=[],
                    status=SpanStatus(code="OK"),
                )
            )
        return runs


def _since_last_reply(messages: Any) -> list[dict[str, Any]]:
    """The messages after the request's last assistant message: the results that request is the first to carry
    (earlier ones were answered before; this also keeps a server that reuses call ids from pairing them wrongly)."""
    if not isinstance(messages, list):
        return []
    last = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"), default=-1)
    return [m for m in messages[last + 1 :] if isinstance(m, dict)]


def _text(content: Any) -> str:
    """A tool message's content as text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else orjson.dumps(content, default=repr).decode()
