"""The engine's request schemas and what it does with every OpenAI parameter: honour it or refuse it.

A parameter the engine cannot honour is refused with a 400 that names it, never ignored;
`SUPPORT` is the table (also in the README). Bodies are checked here, before anything reaches
the engine's batch: JSON, nesting depth, roles, content types, seeds, token ids.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from agentgrad.engine.params import MAX_SEED, MAX_TOP_LOGPROBS, SamplingParams

MAX_JSON_DEPTH = 64
"""Deeper request bodies are refused (tool schemas nest a few levels; 1,000 levels crashed the parser)."""

REFUSED: dict[str, str] = {
    "functions": "the deprecated `functions` API is not served; pass `tools`",
    "function_call": "the deprecated `function_call` is not served; pass `tool_choice`",
    "audio": "this engine generates text only",
    "prediction": "predicted outputs are not implemented",
    "reasoning_effort": "this model does not reason in a separate channel",
    "verbosity": "this model has no verbosity control",
    "web_search_options": "this engine has no web search",
    "top_k": "top_k is not an OpenAI parameter; use top_p",
    "best_of": "best_of is not implemented; use n",
    "suffix": "insertion (suffix) is not implemented",
}
"""Known parameters the engine refuses, with the reason given in the 400."""

SUPPORT: list[tuple[str, str]] = [
    ("messages (system, developer, user, assistant with tool_calls, tool; text content parts)", "supported"),
    (
        "max_tokens, max_completion_tokens (absent: up to the context left), temperature, top_p, n, stop, seed",
        "supported",
    ),
    ("presence_penalty, frequency_penalty (over the tokens generated so far), logit_bias", "supported"),
    ("logprobs, top_logprobs (of the distribution actually sampled)", "supported"),
    ("return_token_ids, ignore_eos (vLLM's extensions)", "supported"),
    ("tools, tool_choice auto / none / required / named (the last two by constrained decoding)", "supported"),
    (
        "parallel_tool_calls",
        "supported: false ends the reply after one call; tool_choice required makes one call unless it is true",
    ),
    ("response_format text / json_object / json_schema (constrained decoding)", "supported"),
    ("stream, stream_options.include_usage", "supported"),
    ("user, metadata, prompt_cache_key, safety_identifier", "accepted, not used (no effect on the output)"),
    ("store", "false or absent only (the engine stores nothing)"),
    ("service_tier", "auto / default only"),
    ("modalities", '["text"] only'),
    ("image / audio / file content parts", "refused"),
    *[(name, f"refused: {why}") for name, why in REFUSED.items()],
    ("any other parameter", "refused with a 400 naming it"),
]


class RequestError(Exception):
    """A request the engine refuses: answered as an OpenAI-shaped error."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def response(self) -> JSONResponse:
        return error(self.status, self.message, self.kind, self.param)


def error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow")


class ToolCallIn(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: dict[str, Any]


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class Sampling(_Strict):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool = False
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens whatever the model writes (benchmarks)
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: Literal[False] | None = None
    service_tier: Literal["auto", "default"] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    def params(self, **extra: Any) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            if not key.lstrip("-").isdigit():
                raise RequestError(f"logit_bias keys must be token ids, got {key!r}", "logit_bias")
            bias[int(key)] = value
        return SamplingParams(
            # without a limit, up to the context left over (OpenAI's convention); never a silent default cut
            max_tokens=getattr(self, "max_completion_tokens", None) or self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            stop=stop,
            n=self.n,
            seed=self.seed,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=bias,
            ignore_eos=self.ignore_eos,
            **extra,
        )


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    modalities: list[Literal["text"]] | None = None


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: Literal[False] = False


def depth(value: Any) -> int:
    """How deeply a parsed JSON value nests (iteratively: the value may be deeper than Python's stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level > MAX_JSON_DEPTH:
                return level
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


async def read_json(request: Request) -> Any:
    """The body as JSON; RequestError for bytes that are not JSON or nest too deeply."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError(f"the request body nests more than {MAX_JSON_DEPTH} levels deep") from None
    if depth(body) > MAX_JSON_DEPTH:
        raise RequestError(f"the request body nests more than {MAX_JSON_DEPTH} levels deep")
    return body


def validate(body: Any, schema: type[BaseModel], names: list[str]) -> Any:
    """`body` as `schema`, refusing unknown or unsupported parameters by name, and models not served."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        parsed = schema.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise RequestError(f"{where}: {first['msg']}", where) from None
    for name in parsed.model_extra or {}:
        if name in REFUSED:
            raise RequestError(f"unsupported parameter {name!r}: {REFUSED[name]}", name)
        raise RequestError(f"unsupported parameter {name!r}: this engine does not implement it", name)
    if body["model"] not in names:  # every request schema has a `model: str`, so it is the parsed one
        raise RequestError(
            f"model {body['model']!r} is not served here; this engine serves {names}", "model", 404, "not_found_error"
        )
    return parsed


def text_of(content: Any, where: str) -> str:
    """Message content as text: a string, or its text parts; other parts are refused."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind not in ("text", "input_text", "output_text") or not isinstance(part.get("text"), str):
            raise RequestError(
                f"{where}.content[{i}]: content parts of type {kind!r} are not supported (text only)",
                f"{where}.content",
            )
        parts.append(part["text"])
    return "".join(parts)
