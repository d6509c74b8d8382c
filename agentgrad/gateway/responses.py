"""The Responses API (`/v1/responses`) in the gateway: recorded in the shape chat completions are.

A Responses call is recorded like a chat completion (`gen_ai.operation.name` "chat",
`agentgrad.llm.api` "responses"), so adapters, SFT and APO read both APIs alike:
`instructions` and the `input` items become chat messages (`function_call` items joined to
their assistant turn as `tool_calls`, `function_call_output` items as `tool` messages; other
item types are kept as they came), and the output items one assistant message. Token ids come
from an upstream that returns them with `return_token_ids`: the agentgrad engine puts
`prompt_token_ids`, `token_ids` and `token_logprobs` in the body (and in the response of the
`response.completed` event, when streamed); vLLM, asked for its raw turn (`enable_response_messages`, see
`upstreams.Upstream.prepare`), returns the rendered prompt and the reply as text and token ids (`raw_turn`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentgrad import semconv as sc

FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
"""Stream events that carry the whole response: the last one of a stream."""


def _text(content: Any) -> Any:
    """A content field as text: a string as is, a list of text parts joined; anything else unchanged."""
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return content


def input_messages(request: dict[str, Any]) -> list[Any]:
    """`instructions` and the `input` items as chat messages."""
    messages: list[Any] = []
    if isinstance(request.get("instructions"), str) and request["instructions"]:
        messages.append({"role": "system", "content": request["instructions"]})
    items = request.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""},
            }
            last = messages[-1] if messages else None
            if isinstance(last, dict) and last.get("role") == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output)
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": text if isinstance(text, str) else json.dumps(text),
                }
            )
        else:
            messages.append(item)
    return messages


def tool_definitions(tools: list[Any]) -> list[Any]:
    """Responses function tools (flat: `name`, `parameters` beside `type`) as OpenAI chat function definitions;
    other tools as given (`messages.tool_definitions` does the same for Anthropic tools)."""
    return [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
        if isinstance(t, dict) and t.get("type") == "function" and "function" not in t
        else t
        for t in tools
    ]


def output_message(response: dict[str, Any]) -> dict[str, Any]:
    """The output items as one assistant message: the text of its message items, its function calls."""
    texts, calls = [], []
    for item in response.get("output") or ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    texts.append(part["text"])
        elif item.get("type") == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""},
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def finish_reason(response: dict[str, Any], message: dict[str, Any]) -> str:
    """The chat-completions finish reason the response's status amounts to."""
    status = response.get("status")
    if status == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "length" if reason in (None, "max_output_tokens") else str(reason)
    if status == "failed":
        return "error"
    return "tool_calls" if message.get("tool_calls") else "stop"


@dataclass(frozen=True)
class RawTurn:
    """vLLM's raw turn of a Responses call: the prompt's token ids (None if not given), what the model wrote."""

    prompt_ids: list[int] | None
    token_ids: list[int]
    text: str


def _raw_messages(response: dict[str, Any], key: str) -> list[dict[str, Any]] | None:
    entries = response.get(key)
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("message"), str) and isinstance(e.get("tokens"), list) for e in entries
    ):
        return None
    return entries


def raw_turn(response: dict[str, Any]) -> RawTurn | None:
    """The prompt and reply of a one-turn Responses call as vLLM rendered and sampled them (`input_messages`,
    `output_messages`: one each for a model vLLM does not run tools for itself); None when absent or multi-turn."""
    outputs = _raw_messages(response, "output_messages")
    if outputs is None or len(outputs) != 1:
        return None
    inputs = _raw_messages(response, "input_messages")
    prompt = inputs[0]["tokens"] if inputs is not None and len(inputs) == 1 else None
    return RawTurn(prompt, outputs[0]["tokens"], outputs[0]["message"])


def output_attributes(response: dict[str, Any]) -> dict[str, Any]:
    """The answer's own attributes (one choice); `recording.response_attributes` adds the id, model, usage, version."""
    attributes: dict[str, Any] = {}
    message = output_message(response)
    attributes[sc.CHOICE_COUNT] = 1
    attributes[sc.GEN_AI_FINISH_REASONS] = [finish_reason(response, message)]
    attributes[sc.GEN_AI_OUTPUT_MESSAGES] = json.dumps([message])
    if isinstance(response.get("prompt_token_ids"), list):
        attributes[sc.PROMPT_TOKEN_IDS] = response["prompt_token_ids"]
    if isinstance(response.get("token_ids"), list):
        attributes[sc.RESPONSE_TOKEN_IDS] = response["token_ids"]
    elif (raw := raw_turn(response)) is not None:  # vLLM's
        attributes[sc.RESPONSE_TOKEN_IDS] = raw.token_ids
        if raw.prompt_ids is not None:
            attributes[sc.PROMPT_TOKEN_IDS] = raw.prompt_ids
    if isinstance(response.get(sc.ALLOWED_TOKENS_FIELD), list):
        attributes[sc.RESPONSE_ALLOWED_TOKENS] = response[sc.ALLOWED_TOKENS_FIELD]
    logprobs = response.get("token_logprobs")
    if not isinstance(logprobs, list):  # else the sampled tokens' logprobs of the text, when `include` asked
        parts = [
            p
            for item in response.get("output") or ()
            if isinstance(item, dict) and item.get("type") == "message"
            for p in item.get("content") or ()
            if isinstance(p, dict) and isinstance(p.get("logprobs"), list)
        ]
        logprobs = [entry.get("logprob") for p in parts for entry in p["logprobs"]] if parts else None
    if logprobs is not None:
        attributes[sc.RESPONSE_LOGPROBS] = logprobs
    return attributes


class ResponsesStream:
    """Rebuilds the response from a stream's events: the final event's, else what came before the stream broke."""

    def __init__(self) -> None:
        self.started: dict[str, Any] = {}
        self.final: dict[str, Any] | None = None
        self.text = ""
        self.items: list[dict[str, Any]] = []

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind in FINAL_EVENTS and isinstance(event.get("response"), dict):
            self.final = dict(event["response"])  # a copy: the gateway strips what it added from the one relayed
        elif kind == "response.created" and isinstance(event.get("response"), dict):
            self.started = event["response"]
        elif kind == "response.output_text.delta" and isinstance(event.get("delta"), str):
            self.text += event["delta"]
        elif (
            kind == "response.output_item.done"
            and isinstance(event.get("item"), dict)
            and event["item"].get("type") == "function_call"
        ):
            self.items.append(event["item"])

    def result(self) -> dict[str, Any]:
        if self.final is not None:
            return self.final
        text = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": self.text}]}]
        return {**self.started, "status": "incomplete", "output": (text if self.text else []) + self.items}
