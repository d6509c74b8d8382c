"""LLM-call spans: OpenAI requests and responses as OpenTelemetry GenAI attributes, and back.

The gateway writes one span per call; adapters read token ids and logprobs back with
`recorded_choices`. Every attribute value is an OTel-legal value (a primitive or a list of
primitives), so structured values (messages, tool definitions) are JSON strings, as the
emitters write them. Messages keep the OpenAI shape (role, content, tool_calls), so they
replay straight into a chat template.

Layout of the `agentgrad.llm.*` attributes (`ATTR` below):
- `prompt_token_ids`, `response_token_ids`, `response_logprobs`: choice 0, the only one when n=1.
- For n>1, choice i ≥ 1 lives under `agentgrad.llm.choices.{i}.response_token_ids` and
  `.response_logprobs` (and `.prompt_token_ids` when its prompt differs from choice 0's: a
  completions call with a list of prompts). `agentgrad.llm.n` says how many choices there are.
- A value the upstream did not return is absent (never an empty list standing for "unknown").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from agentgrad.types import Span

CHAT = "chat"
TEXT_COMPLETION = "text_completion"

PROMPT_TOKEN_IDS = "agentgrad.llm.prompt_token_ids"
RESPONSE_TOKEN_IDS = "agentgrad.llm.response_token_ids"
RESPONSE_LOGPROBS = "agentgrad.llm.response_logprobs"
CHOICE_COUNT = "agentgrad.llm.n"
CHOICE_PREFIX = "agentgrad.llm.choices."
LATENCY_MS = "agentgrad.llm.latency_ms"
TIME_TO_FIRST_TOKEN_MS = "agentgrad.llm.time_to_first_token_ms"
RESOURCES_VERSION = "agentgrad.resources.version"

MODEL_VERSION_HEADER = "x-agentgrad-model-version"
_FINGERPRINT_VERSION = re.compile(r"agentgrad-weights-v(\d+)")

# request field -> GenAI attribute; recorded when the client set it
_REQUEST_PARAMS = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "n": "gen_ai.request.choice.count",
    "seed": "gen_ai.request.seed",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}


def _json(value: Any) -> str:
    return orjson.dumps(value, default=repr).decode()


def request_attributes(operation: str, request: dict[str, Any], system: str) -> dict[str, Any]:
    """What the client asked for (its own request, before the gateway added anything)."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.system": system,
        "gen_ai.request.model": request.get("model"),
        "agentgrad.llm.stream": bool(request.get("stream")),
    }
    for field, name in _REQUEST_PARAMS.items():
        value = request.get(field)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attributes[name] = value
    stop = request.get("stop")
    if stop:
        attributes["gen_ai.request.stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if operation == CHAT:
        attributes["gen_ai.input.messages"] = _json(request.get("messages"))
        if request.get("tools"):
            attributes["gen_ai.tool.definitions"] = _json(request["tools"])
    else:
        prompt = request.get("prompt")
        attributes["agentgrad.llm.prompt"] = prompt if isinstance(prompt, str) else _json(prompt)
    return attributes


def _logprobs(operation: str, logprobs: Any) -> list[float] | None:
    if not isinstance(logprobs, dict):
        return None
    if operation == CHAT:
        content = logprobs.get("content")
        return None if content is None else [entry.get("logprob") for entry in content]
    values = logprobs.get("token_logprobs")
    return None if values is None else list(values)


def response_attributes(operation: str, response: dict[str, Any], version_header: str | None) -> dict[str, Any]:
    """What the upstream answered, in the layout the module docstring describes."""
    attributes: dict[str, Any] = {}
    if response.get("id") is not None:
        attributes["gen_ai.response.id"] = response["id"]
    if response.get("model") is not None:
        attributes["gen_ai.response.model"] = response["model"]
    usage = response.get("usage")
    if isinstance(usage, dict):
        if usage.get("prompt_tokens") is not None:
            attributes["gen_ai.usage.input_tokens"] = usage["prompt_tokens"]
        if usage.get("completion_tokens") is not None:
            attributes["gen_ai.usage.output_tokens"] = usage["completion_tokens"]
    version = model_version(version_header, response.get("system_fingerprint"))
    if version is not None:
        attributes[RESOURCES_VERSION] = version

    choices = sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))
    attributes[CHOICE_COUNT] = len(choices)
    attributes["gen_ai.response.finish_reasons"] = [c.get("finish_reason") or "" for c in choices]
    if operation == CHAT:
        messages = [c.get("message") or {} for c in choices]
    else:
        messages = [{"role": "assistant", "content": c.get("text")} for c in choices]
    attributes["gen_ai.output.messages"] = _json(messages)

    prompt_ids = response.get("prompt_token_ids")
    if prompt_ids is None and choices:
        prompt_ids = choices[0].get("prompt_token_ids")
    if prompt_ids is not None:
        attributes[PROMPT_TOKEN_IDS] = prompt_ids
    for i, choice in enumerate(choices):
        prefix = "agentgrad.llm." if i == 0 else f"{CHOICE_PREFIX}{i}."
        if choice.get("token_ids") is not None:
            attributes[prefix + "response_token_ids"] = choice["token_ids"]
        logprobs = _logprobs(operation, choice.get("logprobs"))
        if logprobs is not None:
            attributes[prefix + "response_logprobs"] = logprobs
        own_prompt = choice.get("prompt_token_ids")
        if i > 0 and own_prompt is not None and own_prompt != prompt_ids:
            attributes[prefix + "prompt_token_ids"] = own_prompt
    return attributes


def model_version(header: str | None, fingerprint: Any) -> int | None:
    """The weights version that served a call: the engine's header, else its system fingerprint."""
    if header is not None and header.strip().isdigit():
        return int(header)
    if isinstance(fingerprint, str):
        match = _FINGERPRINT_VERSION.fullmatch(fingerprint)
        if match:
            return int(match.group(1))
    return None


# ----------------------------------------------------------------------------- streaming


class StreamAssembler:
    """Rebuilds the non-streaming response from SSE chunks: content, tool calls, token ids, logprobs."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.response: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "model", "created", "system_fingerprint", "usage", "prompt_token_ids"):
            if chunk.get(key) is not None:
                self.response[key] = chunk[key]
        for delta_choice in chunk.get("choices") or ():
            index = delta_choice.get("index", 0)
            choice = self._choices.get(index)
            if choice is None:
                choice = self._choices[index] = {"index": index, "finish_reason": None}
                if self.operation == CHAT:
                    choice["message"] = {"role": "assistant", "content": None}
                else:
                    choice["text"] = ""
            if delta_choice.get("finish_reason") is not None:
                choice["finish_reason"] = delta_choice["finish_reason"]
            for key in ("token_ids",):
                if delta_choice.get(key) is not None:
                    choice.setdefault(key, []).extend(delta_choice[key])
            if delta_choice.get("prompt_token_ids") is not None:
                choice["prompt_token_ids"] = delta_choice["prompt_token_ids"]
            self._add_logprobs(choice, delta_choice.get("logprobs"))
            if self.operation == CHAT:
                self._add_delta(choice["message"], delta_choice.get("delta") or {})
            elif delta_choice.get("text"):
                choice["text"] += delta_choice["text"]

    def _add_logprobs(self, choice: dict[str, Any], logprobs: Any) -> None:
        if not isinstance(logprobs, dict):
            return
        merged = choice.setdefault("logprobs", {})
        for key, value in logprobs.items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)

    @staticmethod
    def _add_delta(message: dict[str, Any], delta: dict[str, Any]) -> None:
        for key, value in delta.items():
            if value is None:
                continue
            if key == "role":
                message["role"] = value
            elif key == "tool_calls":
                calls = message.setdefault("tool_calls", [])
                for part in value:
                    index = part.get("index", len(calls))
                    while len(calls) <= index:
                        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                    call = calls[index]
                    if part.get("id"):
                        call["id"] = part["id"]
                    if part.get("type"):
                        call["type"] = part["type"]
                    function = part.get("function") or {}
                    call["function"]["name"] += function.get("name") or ""
                    call["function"]["arguments"] += function.get("arguments") or ""
            elif isinstance(value, str):  # content, reasoning_content, refusal
                message[key] = (message.get(key) or "") + value

    def result(self) -> dict[str, Any]:
        return {**self.response, "choices": [self._choices[i] for i in sorted(self._choices)]}


# ----------------------------------------------------------------------------- reading back


@dataclass(frozen=True)
class RecordedChoice:
    """One sampled choice of a recorded call: what adapters turn into a training triplet."""

    index: int
    prompt_token_ids: list[int] | None
    response_token_ids: list[int] | None
    response_logprobs: list[float] | None
    finish_reason: str | None
    message: dict[str, Any] | None


def is_llm_call(span: Span) -> bool:
    return span.attributes.get("gen_ai.operation.name") in (CHAT, TEXT_COMPLETION)


def recorded_choices(span: Span) -> list[RecordedChoice]:
    """Every choice of an LLM-call span, with its token ids and logprobs where they were returned."""
    attributes = span.attributes
    count = attributes.get(CHOICE_COUNT, 1 if RESPONSE_TOKEN_IDS in attributes else 0)
    reasons = attributes.get("gen_ai.response.finish_reasons") or []
    try:
        messages = json.loads(attributes.get("gen_ai.output.messages") or "[]")
    except ValueError:
        messages = []
    prompt = attributes.get(PROMPT_TOKEN_IDS)
    choices = []
    for i in range(count):
        prefix = "agentgrad.llm." if i == 0 else f"{CHOICE_PREFIX}{i}."
        choices.append(
            RecordedChoice(
                index=i,
                prompt_token_ids=attributes.get(prefix + "prompt_token_ids", prompt),
                response_token_ids=attributes.get(prefix + "response_token_ids"),
                response_logprobs=attributes.get(prefix + "response_logprobs"),
                finish_reason=(reasons[i] or None) if i < len(reasons) else None,
                message=messages[i] if i < len(messages) else None,
            )
        )
    return choices
