"""A throwaway PostgreSQL server for tests and benchmarks: the distribution's binaries (`make postgres`), a
cluster made by `initdb` in a temporary folder, listening on a loopback port, removed when stopped.

It runs as the `postgres` user when this process is root (initdb refuses root). Host connections need a
password (scram-sha-256), so a wrong one is refused as it would be on a real server.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from agentgrad.serving import free_port

BIN = Path(os.environ.get("AGENTGRAD_PG_BIN", "/usr/lib/postgresql/15/bin"))
"""Debian 12's PostgreSQL 15 (`make postgres` installs it)."""
USER = "postgres"
PASSWORD = "pg-test-secret"
START_SECONDS = 30


class PostgresServer:
    """`with PostgresServer() as pg: pg.url("db")`; `stop()`/`start()` restart it on the same port and data.

    Commits are acknowledged before their WAL is flushed (`synchronous_commit = off`: what a crash of the
    server process cannot undo, as SQLite's WAL with `synchronous = NORMAL`); `durable=False` (tests) also
    turns fsync off altogether."""

    def __init__(self, port: int | None = None, max_connections: int = 300, durable: bool = False) -> None:
        if not (BIN / "initdb").exists():
            raise RuntimeError(f"no PostgreSQL binaries in {BIN}: run `make postgres` (apt-get install postgresql)")
        self.port = port or free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="agentgrad-pg-"))
        self.data = self.folder / "data"
        self._as_user = ["runuser", "-u", USER, "--"] if os.geteuid() == 0 else []
        if self._as_user:
            shutil.chown(self.folder, USER)
        password_file = self.folder / "password"
        password_file.write_text(PASSWORD)
        if self._as_user:
            shutil.chown(password_file, USER)
        self._run(
            BIN / "initdb",
            "-D",
            self.data,
            "-U",
            USER,
            "--pwfile",
            password_file,
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = '{self.folder}'\n"
                f"max_connections = {max_connections}\nshared_buffers = 64MB\nsynchronous_commit = off\n"
            )
            if not durable:  # tests: nothing here must survive a power cut
                conf.write("fsync = off\nfull_page_writes = off\n")

    def _run(self, *command: object) -> str:
        done = subprocess.run(
            [*self._as_user, *map(str, command)], capture_output=True, text=True, cwd=self.folder, check=False
        )
        if done.returncode:
            raise RuntimeError(f"{' '.join(map(str, command))} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def start(self) -> PostgresServer:
        log = self.folder / "server.log"
        self._run(BIN / "pg_ctl", "-D", self.data, "-l", log, "-w", "-t", START_SECONDS, "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run(BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def remove(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass  # not running
        shutil.rmtree(self.folder, ignore_errors=True)

    def pid(self) -> int:
        """The postmaster's process id (its backends are its children)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run SQL as the superuser over the Unix socket (psql), returning its unaligned output."""
        return self._run(
            BIN / "psql", "-h", self.folder, "-p", self.port, "-U", USER, "-d", database, "-XAtq", "-c", statement
        ).strip()

    def create_database(self, name: str) -> str:
        self.sql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def url(self, database: str = "postgres", password: str = PASSWORD, **options: str) -> str:
        query = "&".join(f"{key}={quote(value, safe='')}" for key, value in options.items())
        return f"postgresql://{USER}:{quote(password, safe='')}@127.0.0.1:{self.port}/{database}" + (
            f"?{query}" if query else ""
        )

    def wait_ready(self, seconds: float = START_SECONDS) -> None:
        deadline = time.monotonic() + seconds
        while subprocess.run([BIN / "pg_isready", "-h", "127.0.0.1", "-p", str(self.port)], check=False).returncode:
            if time.monotonic() > deadline:
                raise TimeoutError(f"PostgreSQL on port {self.port} is not ready after {seconds} s")
            time.sleep(0.05)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()


_shared: PostgresServer | None = None


def shared_server() -> PostgresServer:
    """The session's one server, started on first use and removed when the interpreter exits."""
    global _shared
    if _shared is None:
        _shared = PostgresServer().start()
        atexit.register(_shared.remove)
    return _shared


def fresh_schema_url(**options: str) -> str:
    """The URL of an empty schema of the shared server's database (a test's own store, in milliseconds)."""
    server = shared_server()
    name = f"t_{uuid.uuid4().hex[:12]}"
    server.sql(f"CREATE SCHEMA {name}")
    return server.url(search_path=name, **options)


async def connect_to_schema(url: str) -> Any:
    """A plain asyncpg connection to the database and schema of a store URL (to arrange what a test needs)."""
    import asyncpg

    parts = urlsplit(url)
    schema = dict(parse_qsl(parts.query)).get("search_path", "public")
    return await asyncpg.connect(urlunsplit((*parts[:3], "", "")), server_settings={"search_path": schema})
