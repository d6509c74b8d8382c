"""Every span, attribute, header and route name agentgrad writes or reads, and the readers that interpret them.

Two components that must agree on a name import it from here, so it cannot drift. LLM calls
use the OpenTelemetry GenAI semantic conventions (`gen_ai.*`) as they are; what is ours lives
under `agentgrad.`. Every attribute value is an OTel-legal value (a primitive or a list of
primitives), so structured values (messages, tool definitions, objects) are JSON strings.

Layout of the token attributes of an LLM-call span:
- `agentgrad.llm.prompt_token_ids`, `.response_token_ids`, `.response_logprobs` (and
  `.response_allowed_tokens` under a grammar): choice 0,
  the only one when n=1.
- For n>1, choice i ≥ 1 lives under `agentgrad.llm.choices.{i}.response_token_ids` and
  `.response_logprobs` (and `.prompt_token_ids` when its prompt differs from choice 0's: a
  completions call with a list of prompts). `agentgrad.llm.n` says how many choices there are.
- A value the upstream did not return is absent (never an empty list standing for "unknown").

The dashboard (`dashboard/static/dashboard.js`) cannot import this module: it spells the names
it reads, and `tests/test_semconv.py` checks that each of them is defined here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

# ----------------------------------------------------------------------------- span names

ROLLOUT_SPAN = "agentgrad.rollout"
"""The runner's span around one attempt of the agent."""
REWARD_SPAN = "agentgrad.reward"
MESSAGE_SPAN = "agentgrad.message"
OBJECT_SPAN = "agentgrad.object"
EXCEPTION_SPAN = "agentgrad.exception"
ANNOTATION_SPAN = "agentgrad.annotation"

# ----------------------------------------------------------------------------- rollout metadata keys

NO_MODEL_CALLS = "agentgrad.no_model_calls"
"""In a rollout's metadata: it reported a reward, but no model call of it reached the gateway of the model being
trained (its agent's client points elsewhere), so it has nothing to train on."""
NO_REWARD = "agentgrad.no_reward"
"""In a rollout's metadata: its agent returned no reward and emitted none (`RolloutConfig.missing_reward` says
whether the rollout then failed or counts as reward 0)."""
SAMPLING_SEED = "agentgrad.sampling_seed"
"""In a training rollout's metadata: the seed of its sampling (`algorithms.sampling.rollout_seed`, from the run's
`seed`, the step and the rollout's place in it); the gateway gives the attempt's k-th model call the seed
`SAMPLING_SEED + k`, so a run with the same seed samples the same tokens (docs/experiments.md, reproducibility)."""

RUN_ID = "agentgrad.run_id"
"""A run's id (`store.get_run`) as a tag of its tracker runs (MLflow, TensorBoard, W&B), to find its record."""

# ----------------------------------------------------------------------------- our attributes

ROLLOUT_ID = "agentgrad.rollout_id"
"""On a span from outside the runner (OTLP, or a gateway call to an unknown route): the rollout it belongs to."""
ATTEMPT_ID = "agentgrad.attempt_id"
AGENT_NAME = "agentgrad.agent.name"
"""The agent that made a model call (`with ag.agent("writer")`), or that ran the rollout (the rollout span)."""

REWARD = "agentgrad.reward"
"""The reward a reward span reports; with dimensions, `agentgrad.reward.{dimension}` each."""
REWARD_PRIMARY = "agentgrad.reward.primary"
"""Which dimension `agentgrad.reward` is."""
REWARD_AGENT = "agentgrad.reward_agent"
"""On a reward span: the agent (role) whose own reward it is (`emit_reward(agent=...)`); never the rollout's reward.
Not `agentgrad.reward.agent`, which would be a reward dimension named "agent"."""
MESSAGE_BODY = "agentgrad.message.body"
OBJECT_JSON = "agentgrad.object.json"
ANNOTATION_PREFIX = "agentgrad.annotation."
OPERATION_NAME = "agentgrad.operation.name"
OPERATION_INPUT = "agentgrad.operation.input"
OPERATION_OUTPUT = "agentgrad.operation.output"

LLM_PREFIX = "agentgrad.llm."
PROMPT_TOKEN_IDS = "agentgrad.llm.prompt_token_ids"
RESPONSE_TOKEN_IDS = "agentgrad.llm.response_token_ids"
RESPONSE_LOGPROBS = "agentgrad.llm.response_logprobs"
RESPONSE_ALLOWED_TOKENS = "agentgrad.llm.response_allowed_tokens"
"""Per response token of a call decoded under a grammar (JSON schema, forced tool call), how many tokens the
grammar allowed there: 1 is a forced token, not the policy's choice (RL leaves it out of the loss). Absent
for an unconstrained call. The logprobs of such a call are the model's before the mask (docs/constrained-decoding.md)."""
ALLOWED_TOKENS_FIELD = "allowed_tokens"
"""The engine's answer field carrying `RESPONSE_ALLOWED_TOKENS`, next to `token_ids` (with `return_token_ids`)."""
CHOICE_COUNT = "agentgrad.llm.n"
CHOICE_PREFIX = "agentgrad.llm.choices."
LLM_PROMPT = "agentgrad.llm.prompt"
"""The prompt of a text-completion call (a string, or JSON for a list of prompts)."""
LLM_STREAM = "agentgrad.llm.stream"
LATENCY_MS = "agentgrad.llm.latency_ms"
TIME_TO_FIRST_TOKEN_MS = "agentgrad.llm.time_to_first_token_ms"
RETRIES = "agentgrad.llm.retries"
UNRECORDED_REQUEST = "agentgrad.llm.unrecorded_request"
"""Why a request body could not be recorded (nested too deep, say); the call is recorded without it."""
WEIGHTS_VERSION = "agentgrad.llm.weights_version"
"""The version of the model weights that served the call (the engine's `x-agentgrad-model-version`)."""
AB_ARM = "agentgrad.ab.arm"
"""The arm of an A/B split (`agentgrad.gateway.ab.ABSplit`) that served the call."""
ROUTE_TABLE = "agentgrad.gateway.route_table"
"""The id of the gateway's route table that routed the call (`agentgrad.gateway.table.RouteTable.id`): a table
swapped while the call ran does not change it."""
ADAPTER_NAME = "agentgrad.adapter.name"
"""The LoRA adapter that served the call (`agentgrad.engine.adapters`), or `BASE_ADAPTER` when no adapter
matched its agent; absent when the engine serves one set of weights."""
BASE_ADAPTER = "base"
"""`ADAPTER_NAME` of a call the base model served (its agent matched no adapter); no adapter may take this name."""
AGENT_REQUEST_PARAMS = {
    "temperature": "agentgrad.llm.agent_request.temperature",
    "top_p": "agentgrad.llm.agent_request.top_p",
    "max_tokens": "agentgrad.llm.agent_request.max_tokens",
    "seed": "agentgrad.llm.agent_request.seed",
}
"""Sampling setting → what the agent's own request asked for, recorded where the gateway applied the trainer's
sampling instead (`gen_ai.request.*` then holds what was used); absent when the agent set none."""
SAMPLING_SOURCE = "agentgrad.llm.sampling"
"""Whose sampling settings the call ran with: `trainer` (the agent's were overridden) or `agent` (the trainer's
filled only what the agent left unset); absent when the gateway applied none."""
LLM_API = "agentgrad.llm.api"
"""Which API the call used: `CHAT_COMPLETIONS_API`, `COMPLETIONS_API`, `RESPONSES_API` or `MESSAGES_API` (Anthropic's;
Responses and Messages calls are `chat` operations too: their input and output are recorded as chat messages)."""
CHAT_COMPLETIONS_API = "chat.completions"
COMPLETIONS_API = "completions"
RESPONSES_API = "responses"
MESSAGES_API = "messages"
"""Anthropic's Messages API (`/v1/messages`)."""
CACHE_HIT = "agentgrad.llm.cache_hit"
"""On a call answered from the gateway's response cache (an upstream with `cache=True`, never the policy)."""
NOT_TRAINED = "agentgrad.llm.not_trained"
"""On a call that is not training data (`NOT_TRAINED_HEADER`): why (`judge`, ...); adapters skip it."""
TOKEN_IDS_ABSENT = "agentgrad.llm.token_ids_absent"
"""On a call recorded without token ids, why: `TOKEN_IDS_NOT_REQUESTED` (the upstream cannot return them, so
the gateway sent the client's request as it was) or `TOKEN_IDS_NOT_RETURNED` (asked for, not in the answer)."""
TOKEN_IDS_NOT_REQUESTED = "not_requested"
TOKEN_IDS_NOT_RETURNED = "not_returned"
TOOL_CALLS_PARSER = "agentgrad.tool_calls.parser"
"""On a call whose reply held tool calls: what read them out of the model's text. `engine:hermes` or `engine:pythonic`
(the built-in engine, in that shape: `ENGINE_PARSER_PREFIX`), `vllm:<parser>` (a vLLM server's `--tool-call-parser`:
`VLLM_PARSER_PREFIX`), or `upstream` (`UPSTREAM_PARSER`: any other upstream, in its own way)."""
TOOL_CALLS_PARSER_DISAGREES = "agentgrad.tool_calls.parser_disagrees"
"""True on a call where agentgrad's parser, run on the reply's raw text, reads other calls than the upstream returned
(the raw text: the upstream's per-token logprobs, or its text content); absent where they agree or it cannot tell."""
TOOL_CALLS_OTHER_PARSE = "agentgrad.tool_calls.other_parse"
"""With `TOOL_CALLS_PARSER_DISAGREES`: agentgrad's reading, JSON, one entry per disagreeing choice:
`{"choice": i, "parser": "engine:hermes" | null, "tool_calls": [{"name", "arguments"}], "error": str | null}`."""
ENGINE_PARSER_PREFIX = "engine:"
VLLM_PARSER_PREFIX = "vllm:"
UPSTREAM_PARSER = "upstream"
TOOL_CALL_PARSER_FIELD = "tool_call_parser"
"""The engine's answer field (on a chat choice, or a Responses / Messages body, next to `tool_call_parse_error`)
naming the parser that read its calls: `TOOL_CALLS_PARSER`'s value."""

# ----------------------------------------------------------------------------- OpenTelemetry names

GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_STOP = "gen_ai.request.stop_sequences"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_TOOL_DEFINITIONS = "gen_ai.tool.definitions"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_REQUEST_PARAMS = {
    "temperature": GEN_AI_REQUEST_TEMPERATURE,
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "max_output_tokens": "gen_ai.request.max_tokens",
    "n": "gen_ai.request.choice.count",
    "seed": "gen_ai.request.seed",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
}
"""OpenAI request field → GenAI attribute; recorded when the client set it."""
CHAT = "chat"
TEXT_COMPLETION = "text_completion"
"""Values of `gen_ai.operation.name` for the two kinds of model call."""
EXECUTE_TOOL = "execute_tool"
INVOKE_AGENT = "invoke_agent"
"""Values of `gen_ai.operation.name` for a tool's run and an agent's step (the span of a framework, or one
`agentgrad.rollout.frameworks` writes from a framework's callbacks)."""
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
TOOL_RUN_SOURCE = "agentgrad.tool.source"
"""On a tool run the gateway read from the conversation (`gateway.tool_runs`): `conversation`. Its span runs from
the reply that asked for the call to the request that carried its result, so its duration includes the agent's
own time between the two."""
TOOL_RUN_FROM_CONVERSATION = "conversation"


def tool_attributes(name: str, arguments: Any = None, result: Any = None, call_id: str | None = None) -> dict[str, Any]:
    """A tool run's attributes in the GenAI shape (arguments and result as JSON text unless already text)."""
    attributes: dict[str, Any] = {GEN_AI_OPERATION: EXECUTE_TOOL, GEN_AI_TOOL_NAME: name}
    if call_id:
        attributes[GEN_AI_TOOL_CALL_ID] = str(call_id)
    if arguments is not None:
        attributes[GEN_AI_TOOL_CALL_ARGUMENTS] = (
            arguments if isinstance(arguments, str) else json.dumps(arguments, default=repr)
        )
    if result is not None:
        attributes[GEN_AI_TOOL_CALL_RESULT] = result if isinstance(result, str) else json.dumps(result, default=repr)
    return attributes


FRAMEWORK_OPERATION = "agentgrad.framework.operation"
"""On a framework's own span of a model call (Agent Framework's `chat`, AgentScope's): its `gen_ai.operation.name`,
moved here, so the span stays in the tree but is not read as a model call (the gateway's span of the same call
is the one with token ids)."""

SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
HTTP_STATUS = "http.response.status_code"
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"
EXCEPTION_STACKTRACE = "exception.stacktrace"

# ----------------------------------------------------------------------------- HTTP headers and routes

ROLLOUT_HEADER = "x-agentgrad-rollout-id"
ATTEMPT_HEADER = "x-agentgrad-attempt-id"
AGENT_HEADER = "x-agentgrad-agent"
"""Names the agent making a model call; wins over the `/agents/{name}` route segment."""
NOT_TRAINED_HEADER = "x-agentgrad-not-trained"
"""Sent with a call that must never be trained on (a judge's, a critic's): its value says why; the span gets
`NOT_TRAINED` and the adapters leave it out."""
TOOL_RUNS_TRACED_HEADER = "x-agentgrad-tool-runs-traced"
"""Sent by `instrument_openai` once the attempt has recorded a tool run itself (a framework's hook, `emit_tool_call`,
an `execute_tool` OpenTelemetry span): the gateway then reads no tool runs from that attempt's conversation."""
ADAPTER_HEADER = "x-agentgrad-adapter"
"""Sent by an engine serving several adapters with every answer: the adapter that produced it (`ADAPTER_NAME`)."""
VERSION_HEADER = "x-agentgrad-model-version"
"""Sent by the engine with every answer: the weights version that produced it."""
WEIGHTS_FINGERPRINT = "agentgrad-weights-v{version}"
"""The engine's `system_fingerprint`, for clients that drop response headers."""
FLUSH_ENDPOINT = "agentgrad/flush"
"""`POST {gateway route}/agentgrad/flush` returns once every call answered so far is in the store."""

_FINGERPRINT = re.compile(re.escape(WEIGHTS_FINGERPRINT).replace(r"\{version\}", r"(\d+)"))


def gateway_route(
    base_url: str, rollout_id: str | None = None, attempt_id: str | None = None, agent: str | None = None
) -> str:
    """The gateway base URL (`…/v1`) that records calls into one attempt, as one named agent.

    `http://gw/v1` → `http://gw/rollouts/{r}/attempts/{a}/agents/{name}/v1`; each part is optional.
    """
    base = base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    if rollout_id is not None and attempt_id is not None:
        base += f"/rollouts/{rollout_id}/attempts/{attempt_id}"
    if agent:
        base += f"/agents/{quote(agent, safe='')}"
    return base + "/v1"


def weights_fingerprint(version: int) -> str:
    return WEIGHTS_FINGERPRINT.format(version=version)


def model_version(header: str | None, fingerprint: Any) -> int | None:
    """The weights version that served a call: the engine's header, else its system fingerprint."""
    if header is not None and header.strip().isdigit():
        return int(header)
    if isinstance(fingerprint, str):
        match = _FINGERPRINT.fullmatch(fingerprint)
        if match:
            return int(match.group(1))
    return None


# ----------------------------------------------------------------------------- readers


class _HasAttributes(Protocol):
    attributes: dict[str, Any]


def choice_prefix(index: int) -> str:
    """Where choice `index`'s token attributes live (`agentgrad.llm.` for choice 0)."""
    return LLM_PREFIX if index == 0 else f"{CHOICE_PREFIX}{index}."


def is_llm_call(span: _HasAttributes) -> bool:
    return span.attributes.get(GEN_AI_OPERATION) in (CHAT, TEXT_COMPLETION)


def is_trainable(span: _HasAttributes) -> bool:
    """Whether a model call may be training data: not one marked `NOT_TRAINED` (a judge's call)."""
    return not span.attributes.get(NOT_TRAINED)


def agent_name(span: _HasAttributes) -> str | None:
    """The name of the agent that made this call, if it named itself."""
    name = span.attributes.get(AGENT_NAME)
    return str(name) if name else None


def weights_version(span: _HasAttributes) -> int | None:
    """The weights version that served this call, where the upstream said."""
    value = span.attributes.get(WEIGHTS_VERSION)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def reward(span: _HasAttributes) -> float | None:
    """The reward this span reports, or None."""
    value = span.attributes.get(REWARD)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def reward_dimension(span: _HasAttributes, dimension: str) -> float | None:
    """The value of one named dimension of a multi-dimensional reward (`emit_reward({...}, primary=)`), or None."""
    value = span.attributes.get(f"{REWARD}.{dimension}")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def reward_agent(span: _HasAttributes) -> str | None:
    """The agent (role) a reward span is for, when the agent named one; None: the rollout's reward."""
    name = span.attributes.get(REWARD_AGENT)
    return str(name) if name else None


def json_list(value: Any) -> list[dict[str, Any]]:
    """A JSON-string attribute holding a list (messages), parsed; [] when absent or malformed."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return []
    return list(value) if isinstance(value, list) else []


def input_messages(span: _HasAttributes) -> list[dict[str, Any]]:
    return json_list(span.attributes.get(GEN_AI_INPUT_MESSAGES))


def output_messages(span: _HasAttributes) -> list[dict[str, Any]]:
    return json_list(span.attributes.get(GEN_AI_OUTPUT_MESSAGES))


def temperature(span: _HasAttributes) -> float:
    """The sampling temperature the call asked for (1.0, the OpenAI default, when unset)."""
    value = span.attributes.get(GEN_AI_REQUEST_TEMPERATURE)
    return 1.0 if value is None else float(value)


@dataclass(frozen=True)
class RecordedChoice:
    """One sampled choice of a recorded call: what adapters turn into a training triplet."""

    index: int
    prompt_token_ids: list[int] | None
    response_token_ids: list[int] | None
    response_logprobs: list[float] | None
    finish_reason: str | None
    message: dict[str, Any] | None
    response_allowed_tokens: list[int] | None = None  # per token, how many the grammar allowed (1: forced); None: none


def recorded_choices(span: _HasAttributes) -> list[RecordedChoice]:
    """Every choice of an LLM-call span, with its token ids and logprobs where they were returned."""
    attributes = span.attributes
    count = attributes.get(CHOICE_COUNT, 1 if RESPONSE_TOKEN_IDS in attributes else 0)
    reasons = attributes.get(GEN_AI_FINISH_REASONS) or []
    messages = output_messages(span)
    prompt = attributes.get(PROMPT_TOKEN_IDS)
    choices = []
    for i in range(count):
        prefix = choice_prefix(i)
        choices.append(
            RecordedChoice(
                index=i,
                prompt_token_ids=attributes.get(prefix + "prompt_token_ids", prompt),
                response_token_ids=attributes.get(prefix + "response_token_ids"),
                response_logprobs=attributes.get(prefix + "response_logprobs"),
                response_allowed_tokens=attributes.get(prefix + "response_allowed_tokens"),
                finish_reason=(reasons[i] or None) if i < len(reasons) else None,
                message=messages[i] if i < len(messages) else None,
            )
        )
    return choices
