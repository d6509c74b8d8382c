"""Runners from another Python environment: agents whose framework cannot share the core's packages.

Some agent frameworks pin versions the core cannot take (CrewAI: older `openai` and `pydantic`;
AutoGen: an older `protobuf`). Their agents run in an environment of their own (`make
env-crewai` makes `.venv-crewai`), as `agentgrad runner` processes that join the store over
HTTP, while the algorithm, the engine and the gateway stay in the core environment:

    with serve_store(store) as url, RunnerProcesses(framework_python("crewai"), url, "examples...:rollout") as runner:
        await run_with_runners(algorithm, store, [runner], train, val)  # agentgrad.train.processes

A `RunnerProcesses` is a `RunnerHandle` (`rollout.workers`): `run_with_runners` watches it as the strategies watch
their runners, giving a dead one's attempts up at once.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentgrad.store import Store

ROOT = Path(__file__).resolve().parents[2]
"""The source checkout: framework environments live here as `.venv-<name>`, and runners start here
so that `examples.…` agents import."""

STOP_SECONDS = 15.0


def framework_python(name: str, root: Path = ROOT) -> str:
    """The interpreter of `.venv-<name>`; a clear error naming the `make` target when it is missing."""
    python = root / f".venv-{name}" / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"{python} does not exist: run `make env-{name}` in {root} to create it")
    return str(python)


@contextmanager
def serve_store(store: Store, token: str | None = None) -> Iterator[str]:
    """Serve `store` over HTTP on loopback for the length of the block; yields its URL."""
    from agentgrad.store.server import store_server

    server = store_server(store, token=token).start()
    try:
        yield server.url
    finally:
        server.stop()


class RunnerProcesses:
    """`workers` runners of `agent` ("module:object") in one `agentgrad runner` process of `python`, named `name`
    (default: its environment's and a random suffix; its workers' ids are `name`, or `name/0` ... with several).

    `gateway` (…/v1) routes agents that build `OpenAI()` with no arguments. The process starts in
    `cwd` (default: the checkout) with it on `PYTHONPATH`; `env` adds variables. On exit it is
    asked to finish what it runs (SIGTERM), then killed after `STOP_SECONDS`.
    """

    def __init__(
        self,
        python: str,
        store_url: str,
        agent: str,
        *,
        workers: int = 1,
        token: str | None = None,
        gateway: str | None = None,
        cwd: Path = ROOT,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        name: str | None = None,
    ) -> None:
        self.name = name or f"{Path(python).parent.parent.name.lstrip('.')}-{uuid.uuid4().hex[:6]}"
        self.command = [
            python,
            "-m",
            "agentgrad.cli",
            "runner",
            "--store",
            store_url,
            "--agent",
            agent,
            "--workers",
            str(workers),
            "--name",
            self.name,
        ]
        if gateway:
            self.command += ["--gateway", gateway]
        path = os.pathsep.join(p for p in (str(cwd), os.environ.get("PYTHONPATH", "")) if p)
        self.env = {**os.environ, "PYTHONPATH": path, **(env or {})}
        if token:
            self.env["AGENTGRAD_TOKEN"] = token
        self.cwd, self.log = cwd, log
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    def start(self) -> RunnerProcesses:
        self._log_file = open(self.log, "ab") if self.log else None  # noqa: SIM115  (closed in stop)
        self.process = subprocess.Popen(
            self.command,
            cwd=self.cwd,
            env=self.env,
            stdout=self._log_file or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        return self

    @property
    def exitcode(self) -> int | None:
        """None while the process runs (or before it starts); its exit code after (negative: killed by a signal)."""
        return self.process.poll() if self.process is not None else None

    def check(self) -> None:
        """Raise if the runner process has exited (a bad agent spec, a missing package)."""
        if self.exitcode is not None:
            shown = f"; its output is in {self.log}" if self.log else ""
            raise RuntimeError(f"runner process {' '.join(self.command)} exited with code {self.exitcode}{shown}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log_file is not None:
            self._log_file.close()

    def __enter__(self) -> RunnerProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
