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
    with ServerThread(app) as first:
        with pytest.raises(RuntimeError, match="failed to start"):
            ServerThread(app, port=first.port).start()
