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
from agentgrad.semconv import ALLOWED_TOKENS_FIELD, CHAT_COMPLETIONS_API, COMPLETIONS_API, RESPONSES_API

log = logging.getLogger(__name__)

MAX_RETRIES = 3
"""Retries of an upstream 408/429/5xx or connection error, after the first try."""
RETRY_BACKOFF_SECONDS = 0.25
"""First pause between tries; doubles each time, with jitter; an upstream `Retry-After` is honoured."""
MAX_RETRY_WAIT_SECONDS = 20.0
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
UPSTREAM_TIMEOUT_SECONDS = 600.0
"""Longest silence from an upstream (between two stream chunks, or before an answer)."""
TOKEN_ID_SYSTEMS = frozenset({"agentgrad", "vllm"})
"""Upstreams that return token ids when asked (`return_token_ids`): the local engine and vLLM."""


@dataclass
class Backend:
    """An OpenAI-compatible upstream: the local engine, a vLLM server, or a hosted API.

    `url` is its base URL (ending in `/v1`). `api_key_env` names an environment variable read
    when the gateway is built, so the key lives only in the gateway's process. `model` renames
    the model upstream (`agentgrad engine serve` answers only to its own model's name).
    `system` says what serves it: "agentgrad" (the local engine) and "vllm" are asked for token
    ids, logprobs and stream usage; any other ("openai", the default) gets the client's request
    unchanged, and its spans say the token ids are absent. `token_ids` / `logprobs` set to True
    or False override what `system` implies.
    """

    url: str
    api_key: str | None = field(default=None, repr=False)
    api_key_env: str | None = None
    model: str | None = None
    system: str = "openai"
    token_ids: bool | None = None
    logprobs: bool | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    timeout_s: float = UPSTREAM_TIMEOUT_SECONDS

    @property
    def asks_token_ids(self) -> bool:
        return self.system in TOKEN_ID_SYSTEMS if self.token_ids is None else self.token_ids

    @property
    def asks_logprobs(self) -> bool:
        return self.system in TOKEN_ID_SYSTEMS if self.logprobs is None else self.logprobs


def parse_backend(spec: str) -> tuple[str, Backend]:
    """`NAME=URL[,key_env=VAR][,model=M][,system=S][,token_ids=BOOL][,logprobs=BOOL]` (the CLI's `--backend`)."""
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
        elif key in ("key_env", "model", "system"):
            setattr(backend, "api_key_env" if key == "key_env" else key, value)
        else:
            raise ValueError(f"--backend {name}: unknown option {key!r} (key_env, model, system, token_ids, logprobs)")
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
        if key:
            headers["authorization"] = f"Bearer {key}"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        urls = {api: f"{base}/{api.replace('.', '/')}" for api in (CHAT_COMPLETIONS_API, COMPLETIONS_API, RESPONSES_API)}
        return cls(name, backend, urls, headers, parts.hostname, port)

    def prepare(self, request: dict[str, Any], api: str) -> tuple[bytes, Added]:
        """The body sent upstream: the client's request, asking also for token ids, logprobs and usage
        where this upstream can give them (the Responses API: token ids, which carry their logprobs)."""
        outgoing = dict(request)
        backend = self.backend
        add_ids = backend.asks_token_ids and not request.get("return_token_ids")
        asked_logprobs = request.get("logprobs")
        add_logprobs = (api != RESPONSES_API and backend.asks_logprobs
                        and (asked_logprobs is None or asked_logprobs is False))
        add_usage = False
        if add_ids:
            outgoing["return_token_ids"] = True
        if add_logprobs:  # completions take a count of top logprobs; 0 means only the sampled token's
            outgoing["logprobs"] = True if api == CHAT_COMPLETIONS_API else 0
        if request.get("stream") and api != RESPONSES_API and (backend.asks_token_ids or backend.asks_logprobs):
            options = request.get("stream_options")
            if not (isinstance(options, dict) and options.get("include_usage")):
                outgoing["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
                add_usage = True
        if backend.model:
            outgoing["model"] = backend.model
        if not (add_ids or add_logprobs or add_usage or backend.model):
            return orjson.dumps(request), Added(False, False, False, asked=bool(request.get("return_token_ids")))
        return orjson.dumps(outgoing), Added(add_ids, add_logprobs, add_usage, asked=True)


@dataclass(frozen=True)
class Added:
    """What the gateway asked for that the client did not: stripped from what goes back."""

    token_ids: bool
    logprobs: bool
    usage: bool
    asked: bool = True
    """Whether the upstream was asked for token ids at all (by the gateway or by the client)."""

    def __bool__(self) -> bool:
        return self.token_ids or self.logprobs or self.usage

    def strip(self, answer: dict[str, Any]) -> bool:
        """Remove the added fields in place; False for a stream chunk that only carries added usage."""
        if self.usage:
            if not answer.get("choices") and answer.get("usage") is not None:
                return False
            answer.pop("usage", None)
        if self.token_ids:
            for key in ("prompt_token_ids", "token_ids", "token_logprobs", ALLOWED_TOKENS_FIELD):  # the last three: a Responses body
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


async def post_with_retries(
    session: Any, upstream: Upstream, api: str, body: bytes, *, max_retries: int, backoff_s: float
) -> tuple[Any, int]:
    """POST `body` with retries on 408/429/5xx and connection errors: (the last response, retries taken).

    The last response is returned whatever its status; the caller relays it. When no response
    came at all, an `GatewayError` (502 unreachable, 504 timeout) is raised.
    """
    import aiohttp

    url = upstream.urls[api]
    timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_read=upstream.backend.timeout_s)
    for attempt in range(max_retries + 1):
        retry_after = None
        try:
            response = await session.post(url, data=body, headers=upstream.headers, timeout=timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            if isinstance(exc, asyncio.TimeoutError):
                error = GatewayError(
                    504,
                    f"upstream {upstream.name!r} at {url} did not answer within {upstream.backend.timeout_s:g} s",
                    "upstream_error",
                    "upstream_timeout",
                )
            else:
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
            error = GatewayError.from_response(upstream, response.status, await response.read())
            response.release()
        if attempt == max_retries:
            error.retries = attempt
            raise error
        log.info("retrying %s (try %d of %d): %s", redact(url), attempt + 2, max_retries + 1, error.message)
        await asyncio.sleep(retry_wait(attempt, retry_after, backoff_s))
    raise AssertionError("unreachable")


def retry_wait(attempt: int, retry_after: str | None, backoff_s: float) -> float:
    """The upstream's `Retry-After` (capped), else exponential backoff with jitter."""
    if retry_after is not None:
        try:
            return min(max(float(retry_after), 0.0), MAX_RETRY_WAIT_SECONDS)
        except ValueError:
            pass  # an HTTP date: fall back to our own backoff
    return min(backoff_s * 2**attempt * (0.5 + random.random()), MAX_RETRY_WAIT_SECONDS)
