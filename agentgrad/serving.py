"""Run an ASGI app (store server, gateway, engine, a test's fake upstream) with uvicorn in a thread."""

from __future__ import annotations

import threading
import time
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
