"""The HTTP guard every agentgrad server runs behind: who may call it, from where, and with how much.

One pure-ASGI middleware, `Guard`, shared by the store server, the gateway and the engine. It
decides before any routing, in this order:

1. Host. Without a token, the `Host` header must name this server: a loopback name, the address
   the connection came in on, or a name in `AGENTGRAD_ALLOWED_HOSTS`. A web page whose DNS name
   was rebound to 127.0.0.1 is refused (403). With a token the check is moot, and skipped: such a
   page cannot send the token.
2. Cross-site. A request whose `Origin` is not this server's own, that a browser marks as sent
   from another site (`Sec-Fetch-Site`), or that carries a body of a type a browser sends across
   sites without asking first (text/plain, form data) is refused (403), token or not. Our APIs
   take JSON only, so no page on another origin can change anything or spend a backend's key.
3. Token. With one, every path but the public ones needs `Authorization: Bearer <token>` (401).
   An empty token is refused when the server is built: it would let `Bearer ` in.
4. Body. Larger than `max_body_bytes` (declared, or counted as it arrives): 413. JSON nested
   deeper than `max_json_depth`: 400, before any parser recurses into it.

Refusals are JSON, in the shape the server's own errors have: OpenAI's
`{"error": {"message", "type", "param", "code"}}` for the gateway and the engine, the store API's
`{"error": name, "detail": message}` under `/api/` (`store_errors`).

A request the guard lets through costs one pass over its headers; a body is buffered (every
server here reads it whole anyway) and its brackets counted in C.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

TOKEN_ENV = "AGENTGRAD_TOKEN"
"""The environment variable with the bearer token: servers default `--token` to it, clients (the store client,
the runner's LLM key) send it."""
ALLOWED_HOSTS_ENV = "AGENTGRAD_ALLOWED_HOSTS"
"""Comma-separated extra names this server answers to without a token (beyond loopback names)."""
MAX_BODY_BYTES = 32 * 2**20
"""Default request body limit (the gateway's and the engine's: larger bodies get a 413); the store server allows
more (span batches with token ids)."""
MAX_JSON_DEPTH = 100
"""Deepest JSON nesting accepted: far beyond any real request, far below where parsers fail."""

_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_CROSS_SITE_TYPES = frozenset({b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data"})
"""Body types a browser sends to another origin without a CORS preflight."""
_CROSS_SITE_FETCH = frozenset({b"cross-site", b"same-site"})
_DEFAULT_PORTS = {b"http": b"80", b"https": b"443"}
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SQUARE = bytes.maketrans(b"{}", b"[]")
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


# ----------------------------------------------------------------------------- tokens and exposure


def check_token(token: str | None) -> None:
    """Refuse an empty token: `Bearer ` (nothing after it) would then be let in."""
    if token is not None and not token.strip():
        raise ValueError(
            f"the token is empty ({token!r}): an empty token would let anyone in. Pass a real secret with "
            f"--token (or ${TOKEN_ENV}), or unset it to serve on loopback without one"
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None, what: str = "the store") -> None:
    """Refuse to serve beyond this machine without a token (anyone reaching it could use it), and an empty token."""
    check_token(token)
    if token is None and not is_loopback(host):
        raise ValueError(
            f"refusing to serve {what} on {host!r} without a token: anyone who can reach it could use it. "
            f"Pass --token (or set {TOKEN_ENV}), or bind to 127.0.0.1"
        )


def expected_authorization(token: str | None) -> bytes | None:
    """The exact `Authorization` value a request must carry, or None when no token is set."""
    check_token(token)
    return None if token is None else f"Bearer {token}".encode()


def bearer_ok(authorization: bytes | None, expected: bytes | None) -> bool:
    """Whether a request's `Authorization` is the expected one (always, when none is expected); constant-time."""
    return expected is None or hmac.compare_digest(authorization or b"", expected)


# ----------------------------------------------------------------------------- refusals


@dataclass(frozen=True)
class Refusal:
    """Why the guard turned a request away: the status and what to tell the caller."""

    status: int
    name: str  # the store API's error name
    type: str  # OpenAI's error type
    code: str
    message: str


ErrorBody = Callable[[str, Refusal], bytes]
"""(request path, refusal) → the JSON body of the answer."""


def openai_errors(path: str, refusal: Refusal) -> bytes:
    """OpenAI's error shape, as the gateway and the engine answer every error."""
    error = {"message": refusal.message, "type": refusal.type, "param": None, "code": refusal.code}
    return orjson.dumps({"error": error})


def store_errors(path: str, refusal: Refusal) -> bytes:
    """The store API's shape under `/api/` and `/v1/traces`; OpenAI's for a gateway mounted next to it."""
    if path.startswith(("/api/", "/v1/traces")) or not path.startswith(("/v1/", "/rollouts/")):
        return orjson.dumps({"error": refusal.name, "detail": refusal.message})
    return openai_errors(path, refusal)


def _unauthorized() -> Refusal:
    return Refusal(
        401,
        "Unauthorized",
        "invalid_request_error",
        "invalid_api_key",
        "this server needs 'Authorization: Bearer <token>' with the token it was started with "
        "(clients of the gateway or the engine: the token is the API key)",
    )


class BodyTooLarge(ValueError):
    """A request body past the limit it was read with (`read_body`)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than the server's limit of {limit} bytes")


async def read_body(receive: Any, max_bytes: int | None = None) -> bytes | None:
    """A request's whole body from ASGI `receive`: None when the client hung up first, `BodyTooLarge` past
    `max_bytes` (the rest is not read). Every server of agentgrad reads bodies with it."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if max_bytes is not None and size > max_bytes:
            raise BodyTooLarge(max_bytes)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large(limit: int) -> Refusal:
    return Refusal(
        413,
        "BodyTooLarge",
        "invalid_request_error",
        "request_too_large",
        f"{BodyTooLarge(limit)}; send smaller batches",
    )


# ----------------------------------------------------------------------------- the middleware


class Guard:
    """Pure ASGI: host, cross-site, token and body checks in front of `app` (see the module docstring).

    `public(path)` says which paths need no token (a health check, a static page); `errors`
    shapes refusals like the app's own errors; `allowed_hosts` adds names to the loopback ones
    (default: `$AGENTGRAD_ALLOWED_HOSTS`).
    """

    def __init__(
        self,
        app: Any,
        *,
        token: str | None = None,
        public: Callable[[str], bool] = lambda path: False,
        errors: ErrorBody = openai_errors,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_json_depth: int = MAX_JSON_DEPTH,
        allowed_hosts: Iterable[str] | None = None,
    ) -> None:
        self.app = app
        self.token = token
        self.expected = expected_authorization(token)
        self.public = public
        self.errors = errors
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        names = allowed_hosts if allowed_hosts is not None else os.environ.get(ALLOWED_HOSTS_ENV, "").split(",")
        self._hosts = {name.strip().lower().encode() for name in names if name.strip()} | {
            name.encode() for name in _LOOPBACK_NAMES
        }
        self._refused_hosts: set[bytes] = set()

    def __getattr__(self, name: str) -> Any:  # `app.state` and the like of the wrapped app
        if name == "app":
            raise AttributeError(name)
        return getattr(self.app, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])  # ASGI spells names in lower case; a repeated header counts by its last value
        host, origin, authorization = headers.get(b"host"), headers.get(b"origin"), headers.get(b"authorization")
        content_type, length = headers.get(b"content-type"), headers.get(b"content-length")
        fetch_site, chunked = headers.get(b"sec-fetch-site"), b"transfer-encoding" in headers
        method = scope["method"]
        refusal = None
        if self.expected is None and host is not None and not self._host_allowed(host, scope):
            refusal = Refusal(
                403,
                "Forbidden",
                "permission_error",
                "host_not_allowed",
                f"this server does not answer to the host {host.decode('latin-1')!r} (only loopback "
                f"names without a token: a rebound DNS name is how a web page reaches a local server); "
                f"add the name to ${ALLOWED_HOSTS_ENV}, or start the server with a token",
            )
        elif origin is not None and not _same_origin(origin, host):
            refusal = Refusal(
                403,
                "Forbidden",
                "permission_error",
                "cross_site_request",
                f"cross-site request from the page at {origin.decode('latin-1')!r} refused: only "
                "this server's own pages may call it from a browser",
            )
        elif method in _BODY_METHODS and (fetch_site in _CROSS_SITE_FETCH or _browser_body(content_type)):
            refusal = Refusal(
                403,
                "Forbidden",
                "permission_error",
                "cross_site_request",
                "this server takes JSON bodies only: send them with 'Content-Type: application/json' "
                "(a text/plain or form body is what a page on another site can send unasked)",
            )
        elif (
            self.expected is not None and not bearer_ok(authorization, self.expected) and not self.public(scope["path"])
        ):
            refusal = _unauthorized()
        elif length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            refusal = _too_large(self.max_body_bytes)
        if refusal is not None:
            await self._refuse(scope, send, refusal)
            return
        if (length is None and not chunked) or length == b"0":
            await self.app(scope, receive, send)
            return
        try:
            body = await read_body(receive, self.max_body_bytes)
        except BodyTooLarge:
            await self._refuse(scope, send, _too_large(self.max_body_bytes))
            return
        if body is None:
            return  # the client went away
        if (content_type is None or b"json" in content_type) and json_too_deep(body, self.max_json_depth):
            await self._refuse(
                scope,
                send,
                Refusal(
                    400,
                    "ValidationError",
                    "invalid_request_error",
                    "json_too_deep",
                    f"the JSON body is nested too deeply (more than {self.max_json_depth} levels); send a flatter document",
                ),
            )
            return
        await self.app(scope, _replay(body, receive), send)

    def _host_allowed(self, host: bytes, scope: Any) -> bool:
        name = _hostname(host)
        if name in self._hosts:
            return True
        if name in self._refused_hosts:
            return False
        server = scope.get("server")
        text = name.decode("latin-1")
        if (server and text == str(server[0])) or is_loopback(text):
            if len(self._hosts) < 1024:
                self._hosts.add(name)
            return True
        if len(self._refused_hosts) < 1024:
            self._refused_hosts.add(name)
        return False

    async def _refuse(self, scope: Any, send: Any, refusal: Refusal) -> None:
        body = self.errors(scope["path"], refusal)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if refusal.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if refusal.status == 413:
            headers.append((b"connection", b"close"))  # the rest of the body is not read
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def guarded(app: Any, **options: Any) -> Any:
    """`app` behind a `Guard` with `options`, unless it already is behind one."""
    return app if isinstance(app, Guard) else Guard(app, **options)


def _replay(body: bytes, receive: Any) -> Any:
    """A `receive` that hands the app the buffered body, then whatever comes next (a disconnect)."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _hostname(host: bytes) -> bytes:
    """`Host` without its port, lower-cased: `[::1]:80` → `::1`, `Example:80` → `example`."""
    host = host.strip().lower()
    if host.startswith(b"["):
        return host[1 : host.find(b"]")] if b"]" in host else host
    name, sep, port = host.rpartition(b":")
    return name if sep and port.isdigit() and b":" not in name else host


def _same_origin(origin: bytes, host: bytes | None) -> bool:
    """Whether `Origin` (scheme://host[:port]) names the host the request was sent to."""
    scheme, sep, authority = origin.strip().lower().partition(b"://")
    if not sep or host is None:
        return False  # `null` (sandboxed pages, files) or no Host to compare with
    default = _DEFAULT_PORTS.get(scheme, b"")
    return _with_port(authority, default) == _with_port(host.strip().lower(), default)


def _with_port(authority: bytes, default: bytes) -> bytes:
    if authority.endswith(b"]") or b":" not in authority.rsplit(b"]", 1)[-1]:
        return authority + b":" + default
    return authority


def _browser_body(content_type: bytes | None) -> bool:
    return content_type is not None and content_type.split(b";", 1)[0].strip().lower() in _CROSS_SITE_TYPES


def json_too_deep(body: bytes, limit: int) -> bool:
    """Whether JSON `body` nests arrays and objects more than `limit` deep, without parsing it.

    Fewer brackets than the limit settle it at once. Otherwise the brackets alone are kept (in C)
    and the innermost pairs removed `limit` times; brackets inside strings are dropped and the
    count redone only when that is not conclusive.
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    deeper = _deeper_than(body.translate(_SQUARE, _NOT_BRACKETS), limit)
    if deeper is False:
        return False
    return _deeper_than(_JSON_STRING.sub(b"", body).translate(_SQUARE, _NOT_BRACKETS), limit) is True


def _deeper_than(shape: bytes, limit: int) -> bool | None:
    """For a string of `[` and `]`: True deeper than `limit`, False not, None unbalanced (strings, or bad JSON)."""
    for _ in range(limit):
        if not shape:
            return False
        inner = shape.replace(b"[]", b"")
        if len(inner) == len(shape):
            return None
        shape = inner
    return bool(shape)
