"""Running our servers: uvicorn in a thread, and the rules every server follows about who may call it.

Servers bind to loopback by default; bound to any other address they need a bearer token
(`check_exposure`), and `TokenGuard` / `bearer_ok` check it.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

STARTUP_SECONDS = 15.0


class ServerThread:
    """uvicorn serving `app` from a daemon thread. `port=0` takes a free port; `url` says which.

        with ServerThread(app) as server:
            httpx.get(server.url + "/health")
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, **uvicorn_options: Any) -> None:
        import uvicorn

        options = {"log_level": "warning", "lifespan": "on", **uvicorn_options}
        self.host = host
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **options))
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # not the main thread
        self._thread = threading.Thread(target=self._run, name=f"uvicorn-{host}:{port}", daemon=True)
        self.port = port

    def _run(self) -> None:
        try:
            self._server.run()
        except BaseException:  # uvicorn exits the thread when it cannot bind; start() reports it
            pass

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + STARTUP_SECONDS
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on {self.host}:{self.port} failed to start (is the port taken?)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on {self.host}:{self.port} did not start within {STARTUP_SECONDS} s")
            time.sleep(0.005)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(STARTUP_SECONDS)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a server whose address must be known before it starts."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None, what: str = "the store") -> None:
    """Refuse to serve beyond this machine without a token: anyone reaching the server could use it."""
    if token is None and not is_loopback(host):
        raise ValueError(
            f"refusing to serve {what} on {host!r} without a token: anyone who can reach it could use it. "
            "Pass --token (or set AGENTGRAD_TOKEN), or bind to 127.0.0.1"
        )


def expected_authorization(token: str | None) -> bytes | None:
    return None if token is None else f"Bearer {token}".encode()


def bearer_ok(headers: Mapping[bytes, bytes], expected: bytes | None) -> bool:
    """Whether a request's headers carry the expected `Authorization` (always, when none is expected)."""
    return expected is None or hmac.compare_digest(headers.get(b"authorization", b""), expected)


class TokenGuard:
    """An ASGI app that answers 401 (OpenAI error shape) unless the request carries the bearer token."""

    def __init__(self, app: Any, token: str | None, public: tuple[str, ...] = ("/health",)) -> None:
        self.app, self.expected, self.public = app, expected_authorization(token), public

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in self.public and not bearer_ok(dict(scope["headers"]), self.expected):
            from starlette.responses import JSONResponse

            error = {"message": "this server needs 'Authorization: Bearer <token>' with the token it was started with",
                     "type": "authentication_error", "param": None, "code": None}
            await JSONResponse({"error": error}, status_code=401, headers={"www-authenticate": "Bearer"})(scope, receive, send)
            return
        await self.app(scope, receive, send)
