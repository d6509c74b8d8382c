"""`agentgrad gateway routes show|set`: read a live gateway's route table, or swap it for a routing file's.

The gateway checks the new table whole and keeps the old one serving when it refuses it; calls in flight finish
on the table they started with (`agentgrad.gateway.table`). docs/operations.md shows a rollback and an A/B move.
"""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from pathlib import Path
from typing import Any

from agentgrad.cli.common import UsageError
from agentgrad.redact import RedactingConsole
from agentgrad.serving.guard import TOKEN_ENV

console = RedactingConsole()

DEFAULT_GATEWAY = "http://127.0.0.1:8090"
"""Where `agentgrad gateway` listens unless told otherwise."""


def read_routing_file(path: str) -> dict[str, Any]:
    """A routing file, TOML (`routes.toml`) or the same tables as JSON (what `routes show` prints under `routes`),
    checked here first so a typo is named with its file."""
    from agentgrad.gateway.routing import parse_routes

    try:
        text = Path(path).read_text()
        table = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the routing file {path}: {exc}") from None
    if path.endswith(".json") and isinstance(table, dict) and isinstance(table.get("routes"), dict):
        table = table["routes"]  # `routes show`'s whole answer, edited
    try:
        parse_routes(table, path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return table


def show_command(args: argparse.Namespace) -> None:
    from agentgrad.gateway.admin import show_routes

    try:
        summary = show_routes(args.gateway, args.token)
    except (RuntimeError, OSError) as exc:
        raise UsageError(f"{args.gateway}: {exc}") from None
    console.print_json(data=summary)


def set_command(args: argparse.Namespace) -> None:
    from agentgrad.gateway.admin import set_routes

    routes = read_routing_file(args.file)
    try:
        summary = set_routes(args.gateway, routes, args.token, if_id=args.if_id)
    except (RuntimeError, OSError) as exc:
        raise UsageError(f"{args.gateway}: {exc}") from None
    console.print(
        f"route table {summary['id']} (generation {summary['generation']}) serves {args.gateway} from now on; "
        "calls in flight finish on the table they started with",
        highlight=False,
    )


def add_commands(gateway: argparse.ArgumentParser) -> None:
    """Add `routes show` and `routes set` under `agentgrad gateway`."""
    commands = gateway.add_subparsers(dest="gateway_command", metavar="{routes}")
    routes = commands.add_parser("routes", help="read or swap a live gateway's route table")
    routes_commands = routes.add_subparsers(dest="routes_command", required=True)
    for name, help, handler in (
        ("show", "the table serving: id, generation, routing file (no secrets)", show_command),
        ("set", "swap the table for a routing file's, whole (refused whole, with the reason)", set_command),
    ):
        command = routes_commands.add_parser(name, help=help)
        if name == "set":
            command.add_argument("file", help="a routing file: TOML (docs/routing.md) or JSON")
            command.add_argument("--if-id", help="only if the table serving is this one (the id `routes show` printed)")
        command.add_argument(
            "--gateway", default=DEFAULT_GATEWAY, help=f"the gateway's URL (default: {DEFAULT_GATEWAY})"
        )
        command.add_argument(
            "--token", default=os.environ.get(TOKEN_ENV), help=f"the gateway's token (default: ${TOKEN_ENV})"
        )
        command.set_defaults(handler=handler)
