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
like a call but does not parse stays text, and `ParsedReply.error` says why. Reading calls out of
text lives in `agentgrad.tool_calls` (no torch), because the gateway reads them too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from agentgrad.engine.constraints import json_lark, lark_grammar
from agentgrad.tool_calls import CLOSE, OPEN, ParsedReply, functions, parse_reply

__all__ = ["CLOSE", "OPEN", "ParsedReply", "functions", "parse_reply"]  # the parser is `agentgrad.tool_calls`


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
