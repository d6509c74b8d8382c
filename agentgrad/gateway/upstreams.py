"""Upstreams and retries: where the gateway sends calls, what it asks of them, and their errors.

A `Backend` is configuration (URL, where its API key comes from, what it can return); an
`Upstream` is a backend ready to call. The gateway asks an upstream that can return them
(`system` "agentgrad" or "vllm", or `token_ids=True`) for token ids, logprobs and stream usage
the client did not ask for (`Added` remembers which, to strip them from the answer); a hosted
or strict OpenAI-compatible API gets exactly the request the client sent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from agentgrad.redact import redact, remember_secret
from agentgrad.semconv import ALLOWED_TOKENS_FIELD, CHAT_COMPLETIONS_API, COMPLETIONS_API, MESSAGES_API, RESPONSES_API

log = logging.getLogger(__name__)

MAX_RETRIES = 3
"""Retries after the first try, of failures that are safe to repeat: a connection that could not be made,
or a 429/502/503/529 answered before any byte of a body (the upstream did not run the request)."""
RETRY_BACKOFF_SECONDS = 0.25
"""First pause between tries; doubles each time, with jitter; an upstream `Retry-After` is honoured."""
MAX_RETRY_WAIT_SECONDS = 20.0
"""The longest `Retry-After` honoured; a longer one (or one past the call's deadline) is relayed instead."""
RETRY_STATUSES = frozenset({429, 502, 503, 529})  # 529: Anthropic's "overloaded"
CONNECT_TIMEOUT_SECONDS = 10.0
"""Longest wait for a connection to an upstream: a live server on a network accepts in milliseconds."""
FIRST_BYTE_TIMEOUT_SECONDS = 120.0
"""Longest silence from an upstream: before its response headers, and between two chunks of a stream. A
non-streamed answer's headers come only once the whole answer is written: a CPU engine answering a full
batch takes a minute or two, a hosted API seconds."""
TIMEOUT_SECONDS = 300.0
"""Longest a call may take as a whole (connecting, retries, waiting and the relayed body): past it the
agent gets a 504 and the upstream request is cancelled. Agents' own clients wait 600 s (openai's default)."""
TRAINED_ENGINE_TIMEOUT_SECONDS = 600.0
"""First-byte and total deadline of the engine a training run serves (local or vLLM): its calls queue behind a
weight sync and a full CPU batch, and a hung engine stops the run anyway."""
ANTHROPIC_SYSTEM = "anthropic"
"""An Anthropic-compatible upstream: its key goes in `x-api-key`, with an `anthropic-version`."""
ANTHROPIC_VERSION = "2023-06-01"
TOKEN_ID_SYSTEMS = frozenset({"agentgrad", "vllm"})
"""Upstreams that return token ids when asked (`return_token_ids`): the local engine and vLLM."""
RAW_TURN_FIELDS = ("input_messages", "output_messages")
"""Where vLLM puts a Responses call's raw prompt and reply, text and token ids, asked `enable_response_messages`."""


@dataclass(frozen=True)
class RateLimit:
    """Requests and tokens per minute for one upstream; calls past them queue, up to `max_queued`, then get a 429."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_queued: int = 64

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"RateLimit.{name} is a number above 0 (or None for no limit), not {value!r}")
        if self.max_queued < 0:
            raise ValueError(f"RateLimit.max_queued is 0 or more, not {self.max_queued}")


@dataclass
class Backend:
    """An OpenAI-compatible upstream: the local engine, a vLLM server, or a hosted API.

    `url` is its base URL (ending in `/v1`). `api_key_env` names an environment variable read
    when the gateway is built, so the key lives only in the gateway's process. `model` renames
    the model upstream (`agentgrad engine serve` answers only to its own model's name).
    `system` says what serves it: "agentgrad" (the local engine) and "vllm" are asked for token
    ids, logprobs and stream usage; any other ("openai", the default) gets the client's request
    unchanged, and its spans say the token ids are absent; "anthropic" is sent its key as `x-api-key` (Anthropic's
    Messages API at `url` + `/messages`, `url` ending in `/v1` as for the others). `token_ids` / `logprobs` set to True
    or False override what `system` implies. `connect_timeout_s`, `first_byte_timeout_s` and
    `timeout_s` bound each call (`Deadline`; a gateway's own options override them).
    """

    url: str
    api_key: str | None = field(default=None, repr=False)
    api_key_env: str | None = None
    model: str | None = None
    system: str = "openai"
    token_ids: bool | None = None
    logprobs: bool | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    connect_timeout_s: float = CONNECT_TIMEOUT_SECONDS
    first_byte_timeout_s: float = FIRST_BYTE_TIMEOUT_SECONDS
    timeout_s: float = TIMEOUT_SECONDS
    """The call's overall deadline; see `Deadline`."""
    max_retries: int | None = None
    """Retries of this upstream's safe-to-repeat failures; None: the gateway's."""
    rate_limit: RateLimit | None = None
    """Requests and tokens per minute, queued then refused past a bound (`routing.Limiter`); None: no limit."""
    cache: bool = False
    """Answer repeated non-streamed requests from the gateway's cache: for judges and critics, never the policy."""
    tool_parser: str | None = None
    """The tool-call parser a vLLM upstream runs (its `--tool-call-parser`): spans of calls it parsed say
    `vllm:<parser>` (`semconv.TOOL_CALLS_PARSER`); None: `upstream`."""

    @property
    def asks_token_ids(self) -> bool:
        return self.system in TOKEN_ID_SYSTEMS if self.token_ids is None else self.token_ids

    @property
    def asks_logprobs(self) -> bool:
        return self.system in TOKEN_ID_SYSTEMS if self.logprobs is None else self.logprobs


def parse_backend(spec: str) -> tuple[str, Backend]:
    """`NAME=URL[,key_env=VAR][,model=M][,system=S][,token_ids=BOOL][,logprobs=BOOL][,tool_parser=P]` (the CLI's
    `--backend`)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"--backend {spec!r}: expected NAME=URL[,key_env=VAR,...]")
    url, *options = rest.split(",")
    backend = Backend(url=url)
    for option in options:
        key, _, value = option.partition("=")
        if key in ("token_ids", "logprobs"):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--backend {name}: {key} is true or false, not {value!r}")
            setattr(backend, key, value.lower() in ("true", "1"))
        elif key in ("key_env", "model", "system", "tool_parser"):
            setattr(backend, "api_key_env" if key == "key_env" else key, value)
        else:
            raise ValueError(
                f"--backend {name}: unknown option {key!r} (key_env, model, system, token_ids, logprobs, tool_parser)"
            )
    return name, backend


@dataclass(frozen=True)
class Upstream:
    """A backend ready to call: its URL per operation and its headers (the key stays in here)."""

    name: str
    backend: Backend
    urls: dict[str, str]
    headers: dict[str, str] = field(repr=False)
    address: str = ""
    port: int = 0

    @classmethod
    def of(cls, name: str, backend: Backend) -> Upstream:
        key = backend.api_key
        if backend.api_key_env:
            key = os.environ.get(backend.api_key_env)
            if not key:
                raise ValueError(
                    f"backend {name!r} reads its API key from ${backend.api_key_env}, "
                    "which is not set in the gateway's environment"
                )
        remember_secret(key)
        remember_secret(urlsplit(backend.url).password)
        parts = urlsplit(backend.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"backend {name!r}: {backend.url!r} is not an http(s) URL like http://127.0.0.1:8000/v1")
        base = backend.url.rstrip("/")
        headers = {"content-type": "application/json", **backend.headers}
        if backend.system == ANTHROPIC_SYSTEM:
            headers.setdefault("anthropic-version", ANTHROPIC_VERSION)
            if key:
                headers["x-api-key"] = key
        elif key:
            headers["authorization"] = f"Bearer {key}"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        urls = {
            api: f"{base}/{api.replace('.', '/')}"
            for api in (CHAT_COMPLETIONS_API, COMPLETIONS_API, RESPONSES_API, MESSAGES_API)
        }
        return cls(name, backend, urls, headers, parts.hostname, port)

    def prepare(self, request: dict[str, Any], api: str) -> tuple[bytes, Added]:
        """The body sent upstream: the client's request, asking also for token ids, logprobs and usage
        where this upstream can give them (the Responses API: token ids, which carry their logprobs; from vLLM,
        its raw turn, `enable_response_messages`, which holds the token ids and the text the model wrote)."""
        outgoing = dict(request)
        backend = self.backend
        add_ids = backend.asks_token_ids and not request.get("return_token_ids")
        asked_logprobs = request.get("logprobs")
        add_logprobs = (
            api not in (RESPONSES_API, MESSAGES_API)
            and backend.asks_logprobs
            and (asked_logprobs is None or asked_logprobs is False)
        )
        add_raw = (
            api == RESPONSES_API
            and backend.system == "vllm"
            and backend.asks_token_ids
            and not request.get("enable_response_messages")
            and not request.get("background")  # vLLM returns its raw turn for foreground calls only
        )
        add_usage = False
        if add_ids:
            outgoing["return_token_ids"] = True
        if add_logprobs:  # completions take a count of top logprobs; 0 means only the sampled token's
            outgoing["logprobs"] = True if api == CHAT_COMPLETIONS_API else 0
        if add_raw:
            outgoing["enable_response_messages"] = True
        if (
            request.get("stream")
            and api not in (RESPONSES_API, MESSAGES_API)
            and (backend.asks_token_ids or backend.asks_logprobs)
        ):
            options = request.get("stream_options")
            if not (isinstance(options, dict) and options.get("include_usage")):
                outgoing["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
                add_usage = True
        if backend.model:
            outgoing["model"] = backend.model
        if not (add_ids or add_logprobs or add_usage or add_raw or backend.model):
            return orjson.dumps(request), Added(False, False, False, asked=bool(request.get("return_token_ids")))
        return orjson.dumps(outgoing), Added(add_ids, add_logprobs, add_usage, asked=True, raw_turn=add_raw)


@dataclass(frozen=True)
class Added:
    """What the gateway asked for that the client did not: stripped from what goes back."""

    token_ids: bool
    logprobs: bool
    usage: bool
    asked: bool = True
    """Whether the upstream was asked for token ids at all (by the gateway or by the client)."""
    raw_turn: bool = False
    """vLLM's raw prompt and reply of a Responses call (`enable_response_messages`: `RAW_TURN_FIELDS`)."""

    def __bool__(self) -> bool:
        return self.token_ids or self.logprobs or self.usage or self.raw_turn

    def strip(self, answer: dict[str, Any]) -> bool:
        """Remove the added fields in place; False for a stream chunk that only carries added usage."""
        if self.usage:
            if not answer.get("choices") and answer.get("usage") is not None:
                return False
            answer.pop("usage", None)
        if self.token_ids:
            for key in (
                "prompt_token_ids",
                "token_ids",
                "token_logprobs",
                ALLOWED_TOKENS_FIELD,
            ):  # the last three: a Responses body
                answer.pop(key, None)
        if self.raw_turn:
            for key in RAW_TURN_FIELDS:
                answer.pop(key, None)
        for choice in answer.get("choices") or ():
            if self.token_ids:
                choice.pop("token_ids", None)
                choice.pop(ALLOWED_TOKENS_FIELD, None)
                choice.pop("prompt_token_ids", None)
            if self.logprobs and "logprobs" in choice:
                choice["logprobs"] = None
        return True


class GatewayError(Exception):
    """A call that cannot succeed: the status and the OpenAI-shaped error the agent gets back.

    The message is redacted (`agentgrad.redact`): it goes to the client, the span and the log."""

    def __init__(self, status: int, message: str, type: str, code: str | None = None, retries: int = 0) -> None:
        message = redact(message)
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.retries = status, message, type, code, retries

    def body(self) -> bytes:
        return orjson.dumps({"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}})

    @classmethod
    def from_response(cls, upstream: Upstream, status: int, payload: bytes) -> GatewayError:
        """The upstream's own reason when it sent an OpenAI-shaped error, its raw body otherwise."""
        try:
            error = orjson.loads(payload)["error"]
            message, type, code = (
                str(error.get("message")),
                str(error.get("type") or "upstream_error"),
                error.get("code"),
            )
        except Exception:
            text = payload[:500].decode("utf-8", "replace").strip()
            message, type, code = text or "(empty body)", "upstream_error", None
        if status in (401, 403):
            message = f"upstream {upstream.name!r} rejected the gateway's credentials ({status}): {message}"
        else:
            message = f"upstream {upstream.name!r} answered {status}: {message}"
        return cls(status, message, type, None if code is None else str(code))


@dataclass(frozen=True)
class Deadline:
    """One call's time limits: `connect_s` per connection, `first_byte_s` of silence (before the headers
    and between chunks), `total_s` for the whole call, which ends at `ends` (the event loop's clock)."""

    connect_s: float
    first_byte_s: float
    total_s: float
    ends: float

    @classmethod
    def start(cls, connect_s: float, first_byte_s: float, total_s: float) -> Deadline:
        return cls(connect_s, first_byte_s, total_s, asyncio.get_running_loop().time() + total_s)

    def remaining(self) -> float:
        return self.ends - asyncio.get_running_loop().time()

    def error(self, upstream: Upstream, url: str, exc: BaseException, retries: int = 0) -> GatewayError:
        """The 504 the agent gets when `exc` (a timeout) cut the call; which limit it hit, and how to raise it."""
        import aiohttp

        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            what = f"accepted no connection within {self.connect_s:g} s (connect timeout)"
        elif isinstance(exc, aiohttp.SocketTimeoutError):
            what = f"sent nothing for {self.first_byte_s:g} s (first-byte timeout)"
        else:
            what = f"did not finish the call within {self.total_s:g} s (total timeout)"
        message = (
            f"upstream {upstream.name!r} at {url} {what}; the request was cancelled "
            "(raise the gateway's --connect-timeout / --first-byte-timeout / --timeout if it is just slow)"
        )
        return GatewayError(504, message, "upstream_error", "upstream_timeout", retries)


async def post_with_retries(
    session: Any,
    upstream: Upstream,
    api: str,
    body: bytes,
    *,
    deadline: Deadline,
    max_retries: int,
    backoff_s: float,
    headers: dict[str, str] | None = None,
) -> tuple[Any, int]:
    """POST `body` within `deadline`, retrying what is safe to repeat: (the last response, retries taken).

    Retried, since no byte of an answer exists yet: a connection refused, reset or timed out while
    connecting, or closed before the response headers (a pooled connection the upstream had just closed),
    and a 429/502/503 status, as long as the pause (`Retry-After` up to `MAX_RETRY_WAIT_SECONDS`, else a
    backoff) ends before the deadline. Not retried: silence past the first-byte timeout (a hung upstream
    gets a 504 at once, not one per try), and anything once the response began. The last response
    is returned whatever its status; the caller relays it. `headers` are the agent's own to pass on (`messages.RELAYED_HEADERS`:
    never a key). When no response came, a `GatewayError`
    (502 unreachable, 504 timeout) is raised. The caller bounds the whole call by `deadline.ends`.
    """
    import aiohttp

    url = upstream.urls[api]
    sent = upstream.headers if not headers else {**upstream.headers, **headers}
    for attempt in range(max_retries + 1):
        retry_after: str | None = None
        remaining = deadline.remaining()
        timeout = aiohttp.ClientTimeout(
            total=None, connect=min(deadline.connect_s, remaining), sock_read=min(deadline.first_byte_s, remaining)
        )
        try:
            response = await session.post(url, data=body, headers=sent, timeout=timeout)
        except aiohttp.ConnectionTimeoutError as exc:  # nothing reached the upstream
            error = deadline.error(upstream, url, exc)
        except TimeoutError as exc:  # it has the request and says nothing: a hung upstream
            raise deadline.error(upstream, url, exc, attempt) from None
        except (
            aiohttp.ClientError
        ) as exc:  # refused, reset, or closed before a byte of answer (a stale pooled connection)
            error = GatewayError(
                502,
                f"upstream {upstream.name!r} at {url} is unreachable: {type(exc).__name__}: {exc}",
                "upstream_error",
                "upstream_unreachable",
            )
        else:
            if response.status not in RETRY_STATUSES or attempt == max_retries:
                return response, attempt
            retry_after = response.headers.get("retry-after")
            wait = retry_wait(attempt, retry_after, backoff_s)
            if retry_after_too_long(retry_after) or wait >= deadline.remaining():
                return response, attempt  # the agent hears the upstream's own answer, and its Retry-After
            error = GatewayError.from_response(upstream, response.status, await response.read())
            response.release()
        if retry_after is None:
            wait = retry_wait(attempt, None, backoff_s)
        if attempt == max_retries or wait >= deadline.remaining():
            error.retries = attempt
            raise error
        log.info(
            "retrying %s in %.2f s (try %d of %d): %s", redact(url), wait, attempt + 2, max_retries + 1, error.message
        )
        await asyncio.sleep(wait)
    raise AssertionError("unreachable")


def retry_after_too_long(retry_after: str | None) -> bool:
    try:
        return retry_after is not None and float(retry_after) > MAX_RETRY_WAIT_SECONDS
    except ValueError:
        return False


def retry_wait(attempt: int, retry_after: str | None, backoff_s: float) -> float:
    """The upstream's `Retry-After` (capped), else exponential backoff with jitter."""
    if retry_after is not None:
        try:
            return min(max(float(retry_after), 0.0), MAX_RETRY_WAIT_SECONDS)
        except ValueError:
            pass  # an HTTP date: fall back to our own backoff
    return min(backoff_s * 2**attempt * (0.5 + random.random()), MAX_RETRY_WAIT_SECONDS)
