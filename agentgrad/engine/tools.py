"""Tool calling for models whose chat template knows no tools: rendering, parsing, constraining.

A model whose chat template mentions `tools` (Qwen2.5, Llama 3.1, ...) gets the tools and the
history from its own template. Any other (SmolLM2) gets the built-in Hermes/Qwen-style format,
which is also what Qwen's own template writes, so one parser serves both:

- the tool schemas go in the system turn (after the system message, or as one), between
  `<tools></tools>`, one JSON object per line;
- a call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several calls one
  after another; an assistant turn with `tool_calls` in the history renders as exactly that
  text (JSON as `json.dumps` writes it, which is also what the constrained grammar emits, so a
  call the model wrote re-renders to the same tokens);
- a `tool` message renders as a user turn `<tool_response>\\n...\\n</tool_response>`
  (consecutive results in one turn), as Qwen's template does.

A reply that looks like a call but does not parse stays text, and `ParsedReply.error` says why.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentgrad.engine.constraints import json_lark, lark_grammar

OPEN, CLOSE = "<tool_call>", "</tool_call>"
TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the model's own chat template renders `tools` (else the built-in format is used)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def functions(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """name -> function spec of OpenAI `tools`; ValueError naming a malformed tool."""
    specs: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise ValueError(f"tools[{i}]: only function tools are supported, as {{'type': 'function', 'function': {{...}}}}")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}].function.name must be a non-empty string")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        specs[name] = function
    return specs


def call_text(name: str, arguments: Any) -> str:
    """One call as the model writes it; `arguments` a dict or its JSON text."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass  # rendered as the string it is
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CLOSE}"


def render_history(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Messages with only `role` and text `content`, tools and calls written in the built-in format."""
    out: list[dict[str, Any]] = []
    if tools:
        listing = TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if messages and messages[0]["role"] in ("system", "developer"):
            out.append({"role": "system", "content": f"{messages[0]['content']}\n\n{listing}"})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": listing})
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "developer":
            role = "system"
        if role == "assistant" and message.get("tool_calls"):
            calls = [call_text(c["function"]["name"], c["function"].get("arguments", {})) for c in message["tool_calls"]]
            content = "\n".join(([content] if content else []) + calls)
        if role == "tool":
            result = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + result
                continue
            out.append({"role": "user", "content": result, "_tool_results": True})
            continue
        out.append({"role": role, "content": content})
    return [{"role": m["role"], "content": m["content"]} for m in out]


@dataclass
class ParsedReply:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI shape: id, type, function{name, arguments}
    error: str | None = None  # set when the reply looked like a call but did not parse; it then stays text


def parse_reply(text: str, tools: dict[str, dict[str, Any]]) -> ParsedReply:
    """Split what the model wrote into text and OpenAI `tool_calls`; all or nothing."""
    if not tools or OPEN not in text:
        return ParsedReply(text)
    calls: list[dict[str, Any]] = []
    for number, match in enumerate(_BLOCK.finditer(text)):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError as exc:
            return ParsedReply(text, error=f"tool call {number + 1} is not JSON: {exc}")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ParsedReply(text, error=f"tool call {number + 1} has no string 'name'")
        if call["name"] not in tools:
            return ParsedReply(text, error=f"tool call {number + 1} names {call['name']!r}, which is not among the tools {sorted(tools)}")
        arguments = call.get("arguments", call.get("parameters", {}))
        if not isinstance(arguments, dict):
            return ParsedReply(text, error=f"tool call {number + 1}: arguments must be a JSON object, got {arguments!r}")
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}})
    rest = _BLOCK.sub("", text)
    if OPEN[:-1] in rest or CLOSE in rest:
        return ParsedReply(text, error=f"a {OPEN} is not closed by {CLOSE} (or the other way round)")
    return ParsedReply(rest if rest.strip() else None, calls)


def call_grammar(tools: dict[str, dict[str, Any]], only: str | None = None, parallel: bool = True) -> str:
    """An llguidance grammar for a reply that is only tool calls (`tool_choice` required, or `only` that one)."""
    names = [only] if only else list(tools)
    options = []
    for name in names:
        parameters = tools[name].get("parameters") or {"type": "object", "properties": {}}
        options.append({"type": "object", "properties": {"name": {"const": name}, "arguments": parameters},
                        "required": ["name", "arguments"], "additionalProperties": False})
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    repeat = ' ("\\n" call)*' if parallel else ""
    return lark_grammar(f'start: call{repeat}\ncall: "{OPEN}\\n" body "\\n{CLOSE}"\nbody: {json_lark(schema)}\n')
