"""Running our servers: uvicorn in a thread (`ServerThread`) or in the foreground (`run`), always
behind the guard and with a read timeout.

Every app is served behind `agentgrad.serving.guard.Guard` (host, cross-site, token and body checks)
unless it brings its own; and every connection must deliver each request, headers and body, within
`READ_TIMEOUT_SECONDS` of its first byte (or of the connection opening): a slow or half-sent
request is cut, so it holds no file descriptor or slot for long. uvicorn itself only times out
idle keep-alive connections.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agentgrad.serving.guard import check_exposure, guarded

STARTUP_SECONDS = 15.0
READ_TIMEOUT_SECONDS = 30.0
"""Longest time a client may take to send one request; a 64 MiB span batch needs ~2 MB/s."""
KEEP_ALIVE_SECONDS = 75
"""How long an idle connection stays open. Longer than clients keep theirs (httpx and the openai SDK
5 s, the store client 30 s), so the client always closes first: a server closing at the moment a
client reuses the connection would cut a request (`Server disconnected without sending a response`)."""


class OneSendPerTurn:
    """A transport whose writes made in one turn of the event loop leave in one send.

    uvicorn writes a response's head and its body separately: on loopback that is two segments,
    two wake-ups of the client and a second read for every small answer, a fifth of a store call's
    CPU on both sides. Everything else is the wrapped transport's; closing sends what waits first.
    """

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._waiting: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._waiting:
            self._loop.call_soon(self.flush)
        self._waiting.append(data)

    def flush(self) -> None:
        if self._waiting:
            data = b"".join(self._waiting)
            self._waiting.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class ReadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request does not arrive in `read_timeout` s,
    and sending each answer in one piece (`OneSendPerTurn`)."""

    def __init__(self, *args: Any, read_timeout: float = READ_TIMEOUT_SECONDS, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout = read_timeout
        self._read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.transport = OneSendPerTurn(transport, self.loop)  # type: ignore[assignment]
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._read_deadline is None:  # the first byte of the next request on a kept-alive connection
            self._arm()
        super().data_received(data)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._read_deadline = self.loop.call_later(self.read_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _timed_out(self) -> None:
        self._read_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def uvicorn_config(app: Any, host: str, port: int, read_timeout: float = READ_TIMEOUT_SECONDS, **options: Any) -> Any:
    """The uvicorn configuration every agentgrad server runs with: guarded app, read timeout, quiet logs."""
    import uvicorn

    options = {"log_level": "warning", "lifespan": "on", "timeout_keep_alive": KEEP_ALIVE_SECONDS, **options}
    protocol = functools.partial(ReadTimeoutProtocol, read_timeout=read_timeout)
    return uvicorn.Config(guarded(app), host=host, port=port, http=protocol, **options)  # type: ignore[arg-type]


def run(app: Any, host: str, port: int, **options: Any) -> None:
    """Serve `app` in the foreground until Ctrl+C (the CLI's servers)."""
    import uvicorn

    server = uvicorn.Server(uvicorn_config(app, host, port, **options))
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl+C it already shut down on, as uvicorn.run swallows it
        pass
    if not server.started:
        raise SystemExit(3)  # it could not bind; uvicorn has said why


WILDCARDS = frozenset({"0.0.0.0", "::", ""})
"""Bind addresses that mean every interface: no other host can reach a server by them."""


def outward_address() -> str:
    """This machine's address on the interface its default route leaves by (what another host most likely
    reaches it at); no packet is sent. Falls back to what the host name resolves to."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.254.254.254", 1))
            return str(probe.getsockname()[0])
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class Listen:
    """Where the servers a run starts listen (`host`: the policy's gateway, the store server of the processes and
    ray strategies) and the address other hosts reach them by (`advertise`; by default `host`, or this machine's
    outward address when `host` is every interface): the URLs handed to runners and published as resources
    name it. Off loopback a `token` is required; runners elsewhere send it (`AGENTGRAD_TOKEN`)."""

    host: str = "127.0.0.1"
    advertise: str | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        check_exposure(self.host, self.token, "the run's gateway and store")

    @property
    def advertised(self) -> str:
        return self.advertise or (outward_address() if self.host in WILDCARDS else self.host)

    def url(self, port: int) -> str:
        return http_url(self.advertised, port)


class ServerThread:
    """uvicorn serving `app` (guarded, see above) from a daemon thread. `port=0` takes a free port; `url` says which,
    at `advertise` (the address other hosts reach it by) when given, else at `host` (or, when `host` is every
    interface, at this machine's outward address).

    with ServerThread(app) as server:
        httpx.get(server.url + "/health")
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, *, advertise: str | None = None, **uvicorn_options: Any
    ) -> None:
        import uvicorn

        self.host = host
        self.advertise = advertise
        self._server = uvicorn.Server(uvicorn_config(app, host, port, **uvicorn_options))
        self._server.install_signal_handlers = lambda: None  # type: ignore[attr-defined]  # uvicorn<0.29; not main thread
        self._thread = threading.Thread(target=self._run, name=f"uvicorn-{host}:{port}", daemon=True)
        self.port = port

    def _run(self) -> None:
        try:
            self._server.run()
        except BaseException:  # uvicorn exits the thread when it cannot bind; start() reports it
            pass

    @property
    def url(self) -> str:
        return http_url(self.advertise or (outward_address() if self.host in WILDCARDS else self.host), self.port)

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
