"""Reading tool calls out of what a model wrote: pythonic lists (SmolLM2) and `<tool_call>` blocks (Hermes/Qwen).

The built-in engine parses its replies with `parse_reply`; the gateway runs the same parser on the
raw text of a reply another upstream (vLLM) parsed, to say on the span where the two disagree. Plain
Python with no torch, so the gateway imports it without the `train` extra. How each model is shown its
tools and constrained to call is `agentgrad.engine.tools`.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)

PYTHONIC_PARSER, HERMES_PARSER = "pythonic", "hermes"
"""`ParsedReply.parser`: which shape the calls were read in."""


def functions(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """name -> function spec of OpenAI `tools`; ValueError naming a malformed tool."""
    specs: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise ValueError(
                f"tools[{i}]: only function tools are supported, as {{'type': 'function', 'function': {{...}}}}"
            )
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}].function.name must be a non-empty string")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        specs[name] = function
    return specs


@dataclass
class ParsedReply:
    """A reply split into its text and its calls; `parser` names the shape the calls were read in."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI shape: id, type, function{name, arguments}
    error: str | None = None  # set when the reply looked like a call but did not parse; it then stays text
    parser: str | None = None  # PYTHONIC_PARSER or HERMES_PARSER when it called


def _openai_calls(calls: list[Any], tools: dict[str, dict[str, Any]], first: int = 1) -> list[dict[str, Any]] | str:
    """{"name", "arguments"} dicts as OpenAI tool calls, or why one is not a call of these tools."""
    out = []
    for number, call in enumerate(calls, first):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return f"tool call {number} has no string 'name'"
        if call["name"] not in tools:
            return f"tool call {number} names {call['name']!r}, which is not among the tools {sorted(tools)}"
        arguments = call.get("arguments", call.get("parameters", {}))
        if not isinstance(arguments, dict):
            return f"tool call {number}: arguments must be a JSON object, got {arguments!r}"
        out.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        )
    return out


_JSON_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values) if k is not None}
    return ast.literal_eval(node)


def _python_calls(text: str) -> list[dict[str, Any]] | str:
    """`[f(a=1), g()]` as {"name", "arguments"} dicts, or why it is not such a list."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        return f"the calls are not a Python list: {exc.msg}"
    if not isinstance(tree, ast.List) or not all(
        isinstance(c, ast.Call) and isinstance(c.func, ast.Name) for c in tree.elts
    ):
        return "the calls are not a Python list of name(key=value, ...) calls"
    calls = []
    for call in tree.elts:
        assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
        if call.args or any(k.arg is None for k in call.keywords):
            return f"the call to {call.func.id} passes its arguments by position; name them (key=value)"
        try:
            calls.append({"name": call.func.id, "arguments": {k.arg: _value(k.value) for k in call.keywords}})
        except (ValueError, TypeError, SyntaxError):
            return f"an argument of {call.func.id} is not a literal value"
    return calls


def _parse_pythonic(text: str, tools: dict[str, dict[str, Any]]) -> ParsedReply | None:
    """A reply that starts `[known_tool(`: its calls (and any text after them); None when it does not."""
    stripped = text.lstrip()
    match = re.match(r"\[\s*([A-Za-z_][\w.-]*)\s*\(", stripped)
    if match is None or match.group(1) not in tools:
        return None
    error = "the calls are not a Python list closed by ']'"
    for end in [i + 1 for i, ch in enumerate(stripped) if ch == "]"]:
        calls = _python_calls(stripped[:end])
        if isinstance(calls, str):
            error = calls
            continue
        converted = _openai_calls(calls, tools)
        if isinstance(converted, str):
            return ParsedReply(text, error=converted)
        rest = stripped[end:]
        return ParsedReply(rest if rest.strip() else None, converted, parser=PYTHONIC_PARSER)
    return ParsedReply(text, error=error)


_FENCED = re.compile(r"^```[\w-]*\s*\n(.*?)\n?```$", re.DOTALL)


def _call_in_another_shape(text: str, tools: dict[str, dict[str, Any]]) -> str | None:
    """Why a reply that is one JSON object naming a tool, bare or in a code block, is not a call.

    Qwen2.5-Coder-0.5B calls this way when not forced; it stays text (a call is parsed only in the
    model's own format), and this says why, so a user sees the shape instead of a silent miss."""
    stripped = text.strip()
    fenced = _FENCED.match(stripped)
    body = fenced.group(1).strip() if fenced else stripped
    if not body.startswith("{"):
        return None
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or call.get("name") not in tools:
        return None
    where = "in a code block" if fenced else "bare"
    return f"the reply calls {call['name']!r} as a JSON object {where}, not in {OPEN}{CLOSE} tags: it stays text"


def parse_reply(text: str, tools: dict[str, dict[str, Any]]) -> ParsedReply:
    """Split what the model wrote into text and OpenAI `tool_calls`; all or nothing.

    A pythonic list of calls at the start of the reply, or `<tool_call>` blocks, each holding
    one call (a JSON object) or a turn's calls (a JSON list, empty for none)."""
    if not tools:
        return ParsedReply(text)
    pythonic = _parse_pythonic(text, tools)
    if pythonic is not None:
        return pythonic
    if OPEN not in text:
        return ParsedReply(text, error=_call_in_another_shape(text, tools))
    calls: list[dict[str, Any]] = []
    for number, match in enumerate(_BLOCK.finditer(text)):
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError as exc:
            return ParsedReply(text, error=f"tool call {number + 1} is not JSON: {exc}")
        converted = _openai_calls(body if isinstance(body, list) else [body], tools, len(calls) + 1)
        if isinstance(converted, str):
            return ParsedReply(text, error=converted)
        calls += converted
    rest = _BLOCK.sub("", text)
    if OPEN[:-1] in rest or CLOSE in rest:
        return ParsedReply(text, error=f"a {OPEN} is not closed by {CLOSE} (or the other way round)")
    return ParsedReply(rest if rest.strip() else None, calls, parser=HERMES_PARSER if calls else None)


def call_signature(calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """OpenAI tool calls as (name, decoded arguments) pairs: two parses of one reply compare equal by these
    (their ids are random, their argument JSON may be spaced differently)."""
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        function = function if isinstance(function, dict) else {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                pass  # compared as the text it is
        out.append((str(function.get("name")), arguments))
    return out
