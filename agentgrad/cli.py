"""The `agentgrad` command: run the demo, serve a store, join one as a runner, inspect rollouts."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from agentgrad.store import NotFoundError, Store, StoreError, open_store
from agentgrad.store.client import TOKEN_ENV, StoreUnreachable
from agentgrad.types import Rollout, Span

console = Console()

DEFAULT_PORT = 4780

SHOWN_ATTRIBUTES = (
    "agentgrad.reward",
    "gen_ai.request.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.response.finish_reasons",
    "agentgrad.resources.version",
    "agentgrad.llm.latency_ms",
    "agentgrad.message.body",
    "agentgrad.operation.input",
    "agentgrad.operation.output",
    "exception.type",
    "exception.message",
)
"""Attributes `rollouts show` prints under each span; the rest stay in the store."""


def _duration(rollout: Rollout) -> str:
    if rollout.start_time is None:
        return "-"
    end = rollout.end_time or datetime.datetime.now().timestamp()
    return f"{end - rollout.start_time:.2f}s"


def _short(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= width else text[: width - 1] + "…"


async def rollouts_ls(store: Store, status: list[str] | None, mode: str | None, limit: int, offset: int) -> None:
    rollouts = await store.query_rollouts(status=status, mode=mode, limit=limit, offset=offset)
    table = Table(title=f"Rollouts ({len(rollouts)} shown)")
    for column in ("id", "status", "mode", "attempts", "reward", "duration"):
        table.add_column(column, justify="right" if column in ("attempts", "reward", "duration") else "left", no_wrap=True)
    table.add_column("input", overflow="ellipsis", no_wrap=True, max_width=40)
    for r in rollouts:
        reward = "-" if r.reward is None else f"{r.reward:.3f}"
        table.add_row(r.rollout_id, r.status.value, r.mode or "-", str(r.num_attempts), reward, _duration(r), _short(r.input, 40))
    console.print(table)
    stats = await store.stats()
    console.print("by status: " + ", ".join(f"{k} {v}" for k, v in sorted(stats.rollouts.items())))


def span_tree(spans: Sequence[Span], title: str) -> Tree:
    """Spans nested by parent id; spans whose parent is not among them are roots."""
    tree = Tree(title)
    by_id = {s.span_id: s for s in spans if s.span_id}
    children: dict[str | None, list[Span]] = {}
    for s in spans:
        parent = s.parent_id if s.parent_id in by_id else None
        children.setdefault(parent, []).append(s)

    def add(node: Tree, span: Span) -> None:
        duration = f" {1000 * (span.end_time - span.start_time):.1f} ms" if span.end_time else ""
        error = " [red]ERROR[/red]" if span.status.code == "ERROR" else ""
        branch = node.add(f"[bold]{span.name}[/bold] #{span.sequence_id}{duration}{error}")
        for key in SHOWN_ATTRIBUTES:
            if key in span.attributes:
                branch.add(f"[dim]{key}[/dim] = {_short(span.attributes[key])}")
        for child in sorted(children.get(span.span_id, []), key=lambda s: s.sequence_id):
            add(branch, child)

    for root in sorted(children.get(None, []), key=lambda s: s.sequence_id):
        add(tree, root)
    return tree


async def rollouts_show(store: Store, rollout_id: str) -> None:
    rollout = await store.get_rollout(rollout_id)
    console.print(f"[bold]{rollout.rollout_id}[/bold]  status={rollout.status.value}  mode={rollout.mode}  "
                  f"reward={rollout.reward}  resources={rollout.resources_id}")
    console.print(f"input: {_short(rollout.input, 400)}")
    table = Table(title="Attempts")
    for column in ("#", "attempt", "worker", "status", "reward", "duration", "error"):
        table.add_column(column)
    attempts = await store.query_attempts(rollout_id)
    for a in attempts:
        duration = f"{a.end_time - a.start_time:.2f}s" if a.end_time else "-"
        table.add_row(str(a.sequence), a.attempt_id, a.worker_id or "-", a.status.value,
                      "-" if a.reward is None else f"{a.reward:.3f}", duration, _short(a.error or "", 60))
    console.print(table)
    for a in attempts:
        console.print(span_tree(await store.query_spans(rollout_id, a.attempt_id), f"spans of attempt {a.sequence} ({a.attempt_id})"))


def _with_store(spec: str, work: Callable[[Store], Any]) -> None:
    if spec not in ("memory", ":memory:") and not spec.startswith(("http://", "https://")) and not Path(spec).exists():
        raise NotFoundError(f"no store file at {spec}; pass the path that a run printed, or a store server URL")

    async def run() -> None:
        store = open_store(spec)
        try:
            await work(store)
        finally:
            await store.close()

    asyncio.run(run())


def serve(store_spec: str, host: str, port: int, token: str | None) -> None:
    """Serve a store file until Ctrl+C; refuses an address beyond loopback without a token."""
    import uvicorn

    from agentgrad.store.server import UVICORN_OPTIONS, check_exposure, create_app

    try:
        check_exposure(host, token)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    store = open_store(store_spec)
    shown = f"[{host}]" if ":" in host else host
    console.print(f"agentgrad store server on http://{shown}:{port}/api/ (store: {store_spec}"
                  f"{', token required' if token else ''}); Ctrl+C stops it")
    uvicorn.run(create_app(store, token=token), host=host, port=port, log_level="warning", **UVICORN_OPTIONS)


def runner(store_spec: str, agent_spec: str, workers: int, token: str | None) -> None:
    """Join a store as `workers` runners executing the agent `module:object`, until Ctrl+C."""
    import importlib
    import os
    import socket

    from agentgrad.agent import load_agent
    from agentgrad.strategies import run_workers

    module, _, name = agent_spec.partition(":")
    if not module or not name:
        raise UsageError(f"--agent takes module:object (my_agents:calc_agent), not {agent_spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise UsageError(f"cannot import the agent's module {module!r} from {os.getcwd()}: {exc}") from None
    try:
        agent = load_agent(module, name)
    except AttributeError:
        raise UsageError(f"module {module!r} has no agent named {name!r}") from None
    prefix = f"{socket.gethostname()}-{os.getpid()}"
    worker_ids = [f"{prefix}-{i}" for i in range(workers)]
    console.print(f"{workers} runner(s) of {agent.name} joining {store_spec}; Ctrl+C stops them")
    run_workers(store_spec, token, agent, worker_ids)


class UsageError(Exception):
    """A command-line mistake; the message says how to fix it."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgrad", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="train the example calculator agent on this machine")
    demo.add_argument("--store", help="SQLite file for the run (default: a new file under .agentgrad/)")
    demo.set_defaults(handler=lambda args: __import__("agentgrad.demo", fromlist=["main"]).main(args))

    rollouts = commands.add_parser("rollouts", help="list and inspect rollouts in a store")
    rollout_commands = rollouts.add_subparsers(dest="rollouts_command", required=True)
    ls = rollout_commands.add_parser("ls", help="a table of rollouts")
    ls.add_argument("--store", required=True, help="SQLite path or store server URL")
    ls.add_argument("--status", action="append", help="only this status (repeatable)")
    ls.add_argument("--mode", help="only this mode (train, val, ...)")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--offset", type=int, default=0)
    ls.set_defaults(handler=lambda a: _with_store(a.store, lambda s: rollouts_ls(s, a.status, a.mode, a.limit, a.offset)))
    show = rollout_commands.add_parser("show", help="one rollout: its attempts and span tree")
    show.add_argument("rollout_id")
    show.add_argument("--store", required=True, help="SQLite path or store server URL")
    show.set_defaults(handler=lambda a: _with_store(a.store, lambda s: rollouts_show(s, a.rollout_id)))

    server = commands.add_parser("serve", help="serve a store over HTTP (runners and algorithms anywhere can use it)")
    server.add_argument("--store", required=True, help="SQLite file (created if missing), or 'memory'")
    server.add_argument("--host", default="127.0.0.1", help="address to bind; beyond loopback a token is required")
    server.add_argument("--port", type=int, default=DEFAULT_PORT)
    server.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"bearer token clients must send "
                        f"(default: ${TOKEN_ENV})")
    server.set_defaults(handler=lambda a: serve(a.store, a.host, a.port, a.token))

    join = commands.add_parser("runner", help="join a store as runner(s) executing an agent")
    join.add_argument("--store", required=True, help="store server URL (or a SQLite path on a shared disk)")
    join.add_argument("--agent", required=True, help="the agent as module:object, importable from here")
    join.add_argument("--workers", type=int, default=1, help="concurrent runners in this process")
    join.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"the server's token (default: ${TOKEN_ENV})")
    join.set_defaults(handler=lambda a: runner(a.store, a.agent, a.workers, a.token))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except (StoreError, StoreUnreachable, UsageError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
