"""Recording spans: OpenAI requests and responses as OpenTelemetry GenAI attributes, written in batches.

The gateway builds one span per call after the last byte went to the client, and the sink
writes them to the store in background batches. Attribute names and the layout of token ids
and logprobs are `agentgrad.semconv`'s; `semconv.recorded_choices` reads them back. Messages
keep the OpenAI shape (role, content, tool_calls), so they replay straight into a chat template.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

import agentgrad.gateway.messages as messages
import agentgrad.gateway.responses as responses
from agentgrad import semconv as sc
from agentgrad.gateway.tool_parsers import parser_attributes
from agentgrad.redact import redact_known
from agentgrad.semconv import CHAT, CHAT_COMPLETIONS_API, COMPLETIONS_API, MESSAGES_API, RESPONSES_API
from agentgrad.store import NotFoundError, Store
from agentgrad.store.sink import SpanSink
from agentgrad.types import Span, SpanStatus

if TYPE_CHECKING:
    from agentgrad.gateway.upstreams import GatewayError, Upstream

log = logging.getLogger(__name__)

SPAN_LINGER_SECONDS = 0.005
"""How long the span writer waits to gather a batch: one store write per few calls, not one per call."""


def _json(value: Any) -> str:
    return orjson.dumps(value, default=repr).decode()


OPERATIONS = {CHAT_COMPLETIONS_API: CHAT, COMPLETIONS_API: sc.TEXT_COMPLETION, RESPONSES_API: CHAT, MESSAGES_API: CHAT}
"""The GenAI operation of each API: a Responses or Messages call is a chat."""


def request_attributes(api: str, request: dict[str, Any], system: str) -> dict[str, Any]:
    """What the client asked for (its own request, before the gateway added anything)."""
    operation = OPERATIONS[api]
    attributes: dict[str, Any] = {
        sc.GEN_AI_OPERATION: operation,
        sc.LLM_API: api,
        sc.GEN_AI_SYSTEM: system,
        sc.GEN_AI_REQUEST_MODEL: request.get("model"),
        sc.LLM_STREAM: bool(request.get("stream")),
    }
    for key, name in sc.GEN_AI_REQUEST_PARAMS.items():
        value = request.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attributes[name] = value
    stop = request.get("stop_sequences" if api == MESSAGES_API else "stop")
    if stop:
        attributes[sc.GEN_AI_REQUEST_STOP] = [stop] if isinstance(stop, str) else list(stop)
    if api == RESPONSES_API:
        attributes[sc.GEN_AI_INPUT_MESSAGES] = _json(responses.input_messages(request))
        if request.get("tools"):
            attributes[sc.GEN_AI_TOOL_DEFINITIONS] = _json(request["tools"])
    elif api == MESSAGES_API:
        attributes[sc.GEN_AI_INPUT_MESSAGES] = _json(messages.input_messages(request))
        if request.get("tools"):
            attributes[sc.GEN_AI_TOOL_DEFINITIONS] = _json(messages.tool_definitions(request["tools"]))
    elif operation == CHAT:
        attributes[sc.GEN_AI_INPUT_MESSAGES] = _json(request.get("messages"))
        if request.get("tools"):
            attributes[sc.GEN_AI_TOOL_DEFINITIONS] = _json(request["tools"])
    else:
        prompt = request.get("prompt")
        attributes[sc.LLM_PROMPT] = prompt if isinstance(prompt, str) else _json(prompt)
    return attributes


def _logprobs(operation: str, logprobs: Any) -> list[float] | None:
    if not isinstance(logprobs, dict):
        return None
    if operation == CHAT:
        content = logprobs.get("content")
        return None if content is None else [entry.get("logprob") for entry in content]
    values = logprobs.get("token_logprobs")
    return None if values is None else list(values)


USAGE_KEYS = {
    CHAT_COMPLETIONS_API: ("prompt_tokens", "completion_tokens"),
    COMPLETIONS_API: ("prompt_tokens", "completion_tokens"),
    RESPONSES_API: ("input_tokens", "output_tokens"),
    MESSAGES_API: ("input_tokens", "output_tokens"),
}
"""The names each API gives its input and output token counts in `usage`."""


def response_attributes(
    api: str, response: dict[str, Any], version_header: str | None, call: Call | None = None
) -> dict[str, Any]:
    """What the upstream answered, in the layout `agentgrad.semconv` describes; with the `call` it answers, which
    parser read its tool calls (`tool_parsers`)."""
    attributes: dict[str, Any] = {}
    if response.get("id") is not None:
        attributes[sc.GEN_AI_RESPONSE_ID] = response["id"]
    if response.get("model") is not None:
        attributes[sc.GEN_AI_RESPONSE_MODEL] = response["model"]
    usage = response.get("usage")
    if isinstance(usage, dict):
        input_key, output_key = USAGE_KEYS[api]
        if usage.get(input_key) is not None:
            attributes[sc.GEN_AI_INPUT_TOKENS] = usage[input_key]
        if usage.get(output_key) is not None:
            attributes[sc.GEN_AI_OUTPUT_TOKENS] = usage[output_key]
    version = sc.model_version(version_header, response.get("system_fingerprint"))
    if version is not None:
        attributes[sc.WEIGHTS_VERSION] = version
    if api == RESPONSES_API:
        attributes.update(responses.output_attributes(response))
    elif api == MESSAGES_API:
        attributes.update(messages.output_attributes(response))
    else:
        attributes.update(_choice_attributes(OPERATIONS[api], response))
    if call is not None:
        backend = call.upstream.backend if call.upstream is not None else None
        system, parser = (backend.system, backend.tool_parser) if backend is not None else ("openai", None)
        attributes.update(parser_attributes(api, call.request, response, system, parser))
    return attributes


def _choice_attributes(operation: str, response: dict[str, Any]) -> dict[str, Any]:
    """A chat or text completion's choices: messages, finish reasons, token ids and logprobs of each."""
    attributes: dict[str, Any] = {}
    choices = sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))
    attributes[sc.CHOICE_COUNT] = len(choices)
    attributes[sc.GEN_AI_FINISH_REASONS] = [c.get("finish_reason") or "" for c in choices]
    if operation == CHAT:
        messages = [c.get("message") or {} for c in choices]
    else:
        messages = [{"role": "assistant", "content": c.get("text")} for c in choices]
    attributes[sc.GEN_AI_OUTPUT_MESSAGES] = _json(messages)

    prompt_ids = response.get("prompt_token_ids")
    if prompt_ids is None and choices:
        prompt_ids = choices[0].get("prompt_token_ids")
    if prompt_ids is not None:
        attributes[sc.PROMPT_TOKEN_IDS] = prompt_ids
    for i, choice in enumerate(choices):
        prefix = sc.choice_prefix(i)
        if choice.get("token_ids") is not None:
            attributes[prefix + "response_token_ids"] = choice["token_ids"]
        if isinstance(choice.get(sc.ALLOWED_TOKENS_FIELD), list):
            attributes[prefix + "response_allowed_tokens"] = choice[sc.ALLOWED_TOKENS_FIELD]
        logprobs = _logprobs(operation, choice.get("logprobs"))
        if logprobs is not None:
            attributes[prefix + "response_logprobs"] = logprobs
        own_prompt = choice.get("prompt_token_ids")
        if i > 0 and own_prompt is not None and own_prompt != prompt_ids:
            attributes[prefix + "prompt_token_ids"] = own_prompt
    return attributes


# ----------------------------------------------------------------------------- streaming


class StreamAssembler:
    """Rebuilds the non-streaming response from SSE chunks: content, tool calls, token ids, logprobs."""

    def __init__(self, api: str) -> None:
        self.operation = OPERATIONS[api]
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
            for key in ("token_ids", sc.ALLOWED_TOKENS_FIELD):
                if delta_choice.get(key) is not None:
                    choice.setdefault(key, []).extend(delta_choice[key])
            for key in ("prompt_token_ids", sc.TOOL_CALL_PARSER_FIELD):
                if delta_choice.get(key) is not None:
                    choice[key] = delta_choice[key]
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


# ----------------------------------------------------------------------------- the span of a call


@dataclass
class Call:
    """One proxied call, from the request to its span."""

    api: str
    request: dict[str, Any]
    upstream: Upstream | None
    rollout_id: str | None
    attempt_id: str | None
    agent: str | None
    traceparent: bytes | None
    started: float = field(default_factory=time.perf_counter)
    start_time: float = field(default_factory=time.time)
    first_token: float | None = None
    token_ids_asked: bool = True
    """Whether the upstream was asked for token ids (by the gateway or the client): says why they may be absent."""
    recorded: bool = False
    """Whether its span was queued (a call the agent hung up on is recorded once, by whoever gets there first)."""
    relayed_headers: dict[str, str] = field(default_factory=dict)
    """The agent's headers passed upstream with the call (`messages.RELAYED_HEADERS`)."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """Where the gateway applied the trainer's sampling: whose values won and what the agent asked for; and
    `NOT_TRAINED`, on a call the agent marked as no training data."""
    arm: str | None = None
    """The A/B arm that served it (`agentgrad.gateway.ab`), when its model is split."""
    route_table: str | None = None
    """The id of the route table that routed it (`gateway.table.RouteTable`): it keeps that table to its end."""
    adapter: str | None = None
    """The LoRA adapter that served it: as an engine holding several says (`agentgrad.engine.adapters`), or as the
    replica pool chose it for the agent (vLLM, which names none)."""
    tool_runs_traced: bool = False
    """Whether the agent's process records its tool runs itself (`semconv.TOOL_RUNS_TRACED_HEADER`)."""

    @property
    def operation(self) -> str:
        return OPERATIONS[self.api]


def upstream_headers(call: Call) -> dict[str, str]:
    """The headers sent upstream with `call`: the agent's relayed ones and, to the local engine (which serves
    each agent by its LoRA adapter), the agent's name, percent-encoded (a header is latin-1)."""
    system = call.upstream.backend.system if call.upstream else None
    if not call.agent or system != "agentgrad":
        return call.relayed_headers
    return {**call.relayed_headers, sc.AGENT_HEADER: quote(call.agent, safe="")}


def call_span(call: Call, response_attributes: dict[str, Any], error: GatewayError | None, retries: int) -> Span:
    """The span recording `call`: the client's request, the upstream's answer (or the error), timings."""
    elapsed = time.perf_counter() - call.started
    system = call.upstream.backend.system if call.upstream else "openai"
    try:
        attributes = request_attributes(call.api, call.request, system)
    except Exception as exc:  # a request the record cannot hold is still recorded, without its body
        attributes = {
            sc.GEN_AI_OPERATION: call.operation,
            sc.GEN_AI_SYSTEM: system,
            sc.GEN_AI_REQUEST_MODEL: str(call.request.get("model")),
            sc.UNRECORDED_REQUEST: f"{type(exc).__name__}: {exc}",
        }
    if call.agent:
        attributes[sc.AGENT_NAME] = call.agent
    if call.arm is not None:
        attributes[sc.AB_ARM] = call.arm
    if call.route_table is not None:
        attributes[sc.ROUTE_TABLE] = call.route_table
    if call.adapter:
        attributes[sc.ADAPTER_NAME] = call.adapter
    attributes.update(call.sampling)
    if call.upstream is not None:
        attributes[sc.SERVER_ADDRESS], attributes[sc.SERVER_PORT] = call.upstream.address, call.upstream.port
    attributes.update(response_attributes)
    if error is None and sc.RESPONSE_TOKEN_IDS not in attributes:
        attributes[sc.TOKEN_IDS_ABSENT] = (
            sc.TOKEN_IDS_NOT_RETURNED if call.token_ids_asked else sc.TOKEN_IDS_NOT_REQUESTED
        )
    attributes[sc.LATENCY_MS] = round(elapsed * 1000, 3)
    if call.first_token is not None:
        attributes[sc.TIME_TO_FIRST_TOKEN_MS] = round((call.first_token - call.started) * 1000, 3)
    if retries:
        attributes[sc.RETRIES] = retries
    status = SpanStatus(code="OK")
    if error is not None:
        attributes[sc.ERROR_TYPE] = error.code or str(error.status)
        attributes[sc.HTTP_STATUS] = error.status
        status = SpanStatus(code="ERROR", description=error.message)
    trace_id, parent_id = parse_traceparent(call.traceparent)
    attributes = {key: _without_secrets(value) for key, value in attributes.items()}  # both directions
    return Span.model_construct(  # every field is built here, of the right type: no validation pass
        rollout_id=call.rollout_id,
        attempt_id=call.attempt_id,
        sequence_id=0,
        trace_id=trace_id or f"{random.getrandbits(128):032x}",
        span_id=f"{random.getrandbits(64):016x}",
        parent_id=parent_id,
        name=f"{call.operation} {call.request.get('model')}",
        start_time=call.start_time,
        end_time=call.start_time + elapsed,
        attributes=attributes,
        events=[],
        status=status,
    )


def _without_secrets(value: Any) -> Any:
    """A recorded value without the secrets this process knows (`redact.remember_secret`): the upstream's
    key, echoed in an answer or pasted into a request, is stored nowhere."""
    if isinstance(value, str):
        return redact_known(value)
    if isinstance(value, list) and value and isinstance(value[0], str):
        return [redact_known(item) if isinstance(item, str) else item for item in value]
    return value


def parse_traceparent(value: bytes | None) -> tuple[str | None, str | None]:
    """W3C `traceparent` (00-<trace id>-<parent span id>-<flags>): nests the call under the agent's span."""
    if value is None:
        return None, None
    parts = value.decode("latin-1").split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
        return parts[1], parts[2]
    return None, None


class GatewaySink(SpanSink):
    """Batches gateway spans; a span naming an unknown rollout or attempt is kept outside any rollout."""

    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(store, loop)
        self._warned: set[tuple[str | None, str | None]] = set()

    async def _drain(self) -> None:
        await asyncio.sleep(SPAN_LINGER_SECONDS)
        await super()._drain()

    async def write(self, batch: list[Span]) -> None:
        try:
            await self.store.add_spans(batch)
            return
        except NotFoundError:
            pass
        except Exception:
            log.exception("gateway could not write %d span(s) to the store", len(batch))
            return
        for span in batch:  # one bad route must not cost the other spans of its batch
            try:
                await self.store.add_span(span)
            except NotFoundError as exc:
                if (span.rollout_id, span.attempt_id) not in self._warned:
                    self._warned.add((span.rollout_id, span.attempt_id))
                    log.warning(
                        "calls routed to %s/%s are recorded outside any rollout: %s",
                        span.rollout_id,
                        span.attempt_id,
                        exc,
                    )
                span.attributes.update({sc.ROLLOUT_ID: span.rollout_id, sc.ATTEMPT_ID: span.attempt_id})
                await super().write([span.model_copy(update={"rollout_id": None, "attempt_id": None})])
            except Exception:
                log.exception("gateway could not write span %r to the store", span.name)
