from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentgrad.serving import ServerThread


async def hello(request):  # type: ignore[no-untyped-def]
    return JSONResponse({"hello": "world"})


def test_server_thread_serves_on_a_free_port_and_stops() -> None:
    app = Starlette(routes=[Route("/", hello)])
    with ServerThread(app) as server:
        assert server.port != 0
        assert httpx.get(server.url + "/").json() == {"hello": "world"}
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/", timeout=1)


def test_a_taken_port_is_a_clear_error() -> None:
    app = Starlette(routes=[Route("/", hello)])
    with ServerThread(app) as first, pytest.raises(RuntimeError, match="failed to start"):
        ServerThread(app, port=first.port).start()



async def test_writes_made_in_one_turn_of_the_loop_leave_in_one_send() -> None:
    """uvicorn writes a response's head and body separately; our servers' transport sends them as one write
    (a second segment costs the client a second read and wake-up per call), and sends what waits before closing."""
    import asyncio

    from agentgrad.serving import OneSendPerTurn

    class Recorder:
        def __init__(self) -> None:
            self.sent: list[bytes] = []
            self.closed = False

        def write(self, data: bytes) -> None:
            self.sent.append(data)

        def is_closing(self) -> bool:
            return self.closed

        def close(self) -> None:
            self.closed = True

        def get_extra_info(self, name: str) -> str:
            return f"extra {name}"

    recorder = Recorder()
    transport = OneSendPerTurn(recorder, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"{}")
    assert recorder.sent == []
    await asyncio.sleep(0)  # the end of this turn of the loop
    assert recorder.sent == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    transport.write(b"last")
    transport.close()
    assert recorder.sent[-1] == b"last" and recorder.closed
    assert transport.get_extra_info("peername") == "extra peername"  # the rest is the wrapped transport's


def test_answers_on_a_kept_alive_connection_arrive_whole() -> None:
    import socket

    app = Starlette(routes=[Route("/", hello)])
    with ServerThread(app) as server, socket.create_connection(("127.0.0.1", server.port)) as sock:
        for _ in range(3):
            sock.sendall(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"hello":"world"}')
