"""Tool calling for models whose chat template knows no tools: rendering, parsing, constraining.

A model whose chat template mentions `tools` (Qwen2.5, Llama 3.1, ...) gets the tools and the
history from its own template. Any other gets a built-in format, chosen per model
(`format_for`), because a small model only samples a call in a format it finds natural:

- `PYTHONIC` (SmolLM2, recognised by its template's default system prompt): the schemas go in
  the system turn as a JSON list after "You have access to the following functions:"; a turn's
  calls are one Python list of keyword calls, `[calculate(expression="123 + 456")]` (values
  written as JSON), and nothing else; a `tool` message renders as a `tool` turn holding the
  result alone. Measured with `benchmarks/tool_format_probe.py` (the demo's history, a tool
  demonstration between two direct answers): SmolLM2-135M samples a call in this format about
  as often as with the text protocol `calculate: <expr>` (first-token probability ~0.1), where it
  never samples a `<tool_call>` block, whether Hermes' object or SmolLM2's model-card list
  (it writes `<tool_response>` instead).
- `HERMES` (every other model): the Hermes/Qwen format, which is also what Qwen's own template
  writes. Schemas one JSON object per line between `<tools></tools>`; each call its own block
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; `tool` messages render as one
  user turn of `<tool_response>\\n...\\n</tool_response>` blocks.

Either way, an assistant turn with `tool_calls` in the history renders as exactly the text the
model writes (JSON as `json.dumps` writes it, which is also what the constrained grammar emits),
so a call the model wrote re-renders to the same tokens and the two calls of a tool round merge
into one trajectory. The parser reads what the model's format writes, and `<tool_call>` blocks
(an object, or SmolLM2's model-card list, empty for none) from any model. A reply that looks
like a call but does not parse stays text, and `ParsedReply.error` says why.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from agentgrad.engine.constraints import json_lark, lark_grammar

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolFormat:
    """How one family of models is shown its tools, writes its calls and reads their results."""

    name: str  # "pythonic" or "hermes"
    prompt: str  # the tools' part of the system turn; `{tools}` is replaced by the schemas
    result_role: str  # the role a tool result is rendered in: "tool" (alone) or "user" (in <tool_response>)
    open: str  # how a reply that calls starts (streaming holds the text back from here)
    close: str  # how a call ends (`parallel_tool_calls: false` stops there)
    tokens: tuple[int, int] | None = None
    """Ids of `open` and `close` where the tokenizer has each as one token of its own (Qwen2.5's
    `<tool_call>` 151657 and `</tool_call>` 151658): the model writes those tokens, never the
    characters, so a forced call's grammar names the tokens (llguidance refuses the one token
    where the grammar spells the characters)."""


HERMES = ToolFormat(
    "hermes",
    """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>""",
    result_role="user",
    open=OPEN,
    close=CLOSE,
)

PYTHONIC = ToolFormat(
    "pythonic",
    """You have access to the following functions:
{tools}

To call functions, reply with only the calls as a Python list, such as [func_name1(param1="value1", param2=2)].""",
    result_role="tool",
    open="[",
    close=")]",
)


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the model's own chat template renders `tools` (else a built-in format is used)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def format_for(tokenizer: Any) -> ToolFormat:
    """The format this model calls in: pythonic calls for SmolLM2, Hermes blocks for any other,
    with the tokenizer's own `<tool_call>` tokens where it has them."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, str) and "named SmolLM" in template:
        return PYTHONIC
    encode = getattr(tokenizer, "encode", None)
    open_ids, close_ids = (encode(marker, add_special_tokens=False) if encode else [] for marker in (OPEN, CLOSE))
    if len(open_ids) == 1 and len(close_ids) == 1:
        return replace(HERMES, tokens=(open_ids[0], close_ids[0]))
    return HERMES


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


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            pass  # rendered as the string it is
    return arguments


def call_text(name: str, arguments: Any) -> str:
    """One call as a Hermes block; `arguments` a dict or its JSON text."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': _arguments(arguments)}, ensure_ascii=False)}\n{CLOSE}"


def python_call_text(name: str, arguments: Any) -> str:
    """One call as a pythonic keyword call, values as JSON: `calculate(expression="1 + 2")`."""
    arguments = _arguments(arguments)
    if not isinstance(arguments, dict):
        return f"{name}({json.dumps(arguments, ensure_ascii=False)})"
    return f"{name}({', '.join(f'{k}={json.dumps(v, ensure_ascii=False)}' for k, v in arguments.items())})"


def calls_text(calls: list[tuple[str, Any]], fmt: ToolFormat = HERMES) -> str:
    """A turn's calls, (name, arguments) each, as the model writes them in `fmt`."""
    if fmt.name == "pythonic":
        return "[" + ", ".join(python_call_text(n, a) for n, a in calls) + "]"
    return "\n".join(call_text(n, a) for n, a in calls)


def tools_prompt(tools: list[dict[str, Any]], fmt: ToolFormat = HERMES) -> str:
    """The tools' part of the system turn in `fmt`."""
    if fmt.name == "pythonic":
        return fmt.prompt.format(tools=json.dumps([t.get("function", t) for t in tools], ensure_ascii=False))
    return fmt.prompt.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def template_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a chat template that renders tools itself: each call's `arguments` (JSON text on
    the OpenAI wire) as the object it encodes, which is what templates expect (Qwen's writes
    `arguments | tojson`; given the text, it would write a quoted string the model never wrote)."""
    out = []
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            calls = [
                {
                    **call,
                    "function": {**call["function"], "arguments": _arguments(call["function"].get("arguments", {}))},
                }
                if isinstance(call, dict) and isinstance(call.get("function"), dict)
                else call
                for call in message["tool_calls"]
            ]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def render_history(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, fmt: ToolFormat = HERMES
) -> list[dict[str, Any]]:
    """Messages with only `role` and text `content`, tools and calls written in `fmt`."""
    out: list[dict[str, Any]] = []
    if tools:
        listing = tools_prompt(tools, fmt)
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
            calls = calls_text(
                [(c["function"]["name"], c["function"].get("arguments", {})) for c in message["tool_calls"]], fmt
            )
            content = "\n".join(([content] if content else []) + [calls])
        if role == "tool" and fmt.result_role == "tool":
            out.append({"role": "tool", "content": content})
            continue
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
        return ParsedReply(rest if rest.strip() else None, converted)
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
    return ParsedReply(rest if rest.strip() else None, calls)


def call_grammar(
    tools: dict[str, dict[str, Any]], only: str | None = None, parallel: bool = True, fmt: ToolFormat = HERMES
) -> str:
    """An llguidance grammar for a reply that is only tool calls (`tool_choice` required, or `only` that one), in `fmt`.

    Pythonic calls pass the required parameters, in the schema's order (optional ones are left out)."""
    names = [only] if only else list(tools)
    if fmt.name == "pythonic":
        rules = []
        for name in names:
            parameters = tools[name].get("parameters") or {}
            properties = parameters.get("properties") or {}
            keywords = [f'"{key}=" {json_lark(properties.get(key) or {})}' for key in parameters.get("required") or []]
            rules.append(f'"{name}(" ' + ' ", " '.join(keywords) + ' ")"' if keywords else f'"{name}()"')
        call = "call: " + " | ".join(f"({rule})" for rule in rules)
        repeat = ' (", " call)*' if parallel else ""
        return lark_grammar(f'start: "[" call{repeat} "]"\n{call}\n')
    options = []
    for name in names:
        parameters = tools[name].get("parameters") or {"type": "object", "properties": {}}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    repeat = ' ("\\n" call)*' if parallel else ""
    open_, close = (f"<[{fmt.tokens[0]}]>", f"<[{fmt.tokens[1]}]>") if fmt.tokens else (f'"{OPEN}"', f'"{CLOSE}"')
    return lark_grammar(f'start: call{repeat}\ncall: {open_} "\\n" body "\\n" {close}\nbody: {json_lark(schema)}\n')
