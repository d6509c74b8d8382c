"""The commands that serve or join: `agentgrad serve` (a store, with a gateway when given backends), `gateway`,
`engine serve`, `runner` and `store migrate`, with the address and backend options they share."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, Literal

from agentgrad.cli.common import UsageError
from agentgrad.redact import RedactingConsole
from agentgrad.serving.guard import check_exposure
from agentgrad.store import Store, open_store

console = RedactingConsole()


DEFAULT_PORT = 4780
"""Where `agentgrad serve` listens unless told otherwise."""


def serve_engine_command(args: argparse.Namespace) -> None:
    try:
        check_exposure(args.host, args.token, "the model")  # before torch is imported: a bad flag fails at once
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from agentgrad.engine import Engine
    from agentgrad.engine.server import create_engine_app
    from agentgrad.serving import run
    from agentgrad.serving.guard import Guard

    model = args.model
    if args.checkpoint:
        if args.model:
            raise UsageError("--checkpoint and --model both name the weights to serve: give one")
        from agentgrad.policy.export import servable

        try:
            model = servable(args.checkpoint, base=args.base)
        except (ValueError, FileNotFoundError) as exc:
            raise UsageError(str(exc)) from None
    folders = adapter_folders(args.adapter)
    if folders and args.dtype not in (None, "float32"):
        raise UsageError("--adapter serves every version from the engine's float32 weights: drop --dtype")
    dtype = "float32" if folders else args.dtype  # adapters run on the fp32 weights: no sampling copy to make
    # it only serves: on a GPU its weights are held once, in the sampling dtype
    engine = Engine(
        model,
        device=args.device,
        sampling_dtype=dtype,
        max_batch_size=args.max_batch_size,
        frozen_base=True,
        threads=args.threads,
    )
    if folders:
        from agentgrad.engine.adapters import load_adapters

        try:
            load_adapters(engine, folders)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    adapters = f"; adapters (request model = name): {', '.join(folders)}" if folders else ""
    console.print(
        f"serving {engine.name} ({engine.sampling_dtype}, {engine.device}) on {advertised_url(args)}/v1" + adapters
    )
    run(Guard(create_engine_app(engine), token=args.token), host=args.host, port=args.port)


def advertised_url(args: argparse.Namespace) -> str:
    """Where other hosts reach a server started with `--host`, `--port` and `--advertise` (the URL to give them)."""
    from agentgrad.serving import WILDCARDS, http_url, outward_address

    host = args.advertise or (outward_address() if args.host in WILDCARDS else args.host)
    return http_url(host, args.port)


def add_address_arguments(parser: argparse.ArgumentParser, port: int) -> None:
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (0.0.0.0: every interface); beyond loopback a token is required",
    )
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument(
        "--advertise",
        metavar="HOST",
        help="the address other hosts reach this server by, in the URL it prints (default: --host, or this "
        "machine's outward address for 0.0.0.0)",
    )


def adapter_folders(specs: Sequence[str]) -> dict[str, str]:
    """`--adapter NAME=PATH` options as {name: path}; a malformed or repeated one is a UsageError."""
    folders: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--adapter {spec!r}: write NAME=PATH (a PEFT adapter folder or a LoRA step-N checkpoint)")
        if name in folders:
            raise UsageError(f"--adapter {name!r} is given twice: each adapter needs its own name")
        folders[name] = path
    return folders


def gateway_from_args(args: argparse.Namespace, store: Store, token: str | None, close_store: bool) -> Any:
    """The gateway that `--backend` / `--default` describe (`agentgrad gateway` and `agentgrad serve`)."""
    from agentgrad.gateway import Gateway, load_routes, parse_backend

    try:
        backends = load_routes(args.routes) if args.routes else {}
        for model, backend in (parse_backend(spec) for spec in args.backend):
            if model in backends:
                raise ValueError(f"model {model!r} is routed by both --routes {args.routes} and --backend; keep one")
            backends[model] = backend
        default = parse_backend(f"default={args.default}")[1] if args.default else None
        return Gateway(
            store,
            backends,
            default=default,
            token=token,
            close_store=close_store,
            connect_timeout_s=args.connect_timeout,
            first_byte_timeout_s=args.first_byte_timeout,
            timeout_s=args.timeout,
            max_retries=args.retries,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run_gateway(args: argparse.Namespace) -> None:
    """`agentgrad gateway`: serve the gateway until interrupted; buffered spans are written on the way out."""
    from agentgrad.serving import run

    if not args.store:
        raise UsageError("agentgrad gateway needs --store: a SQLite path, 'memory', or a store server URL")
    try:
        check_exposure(args.host, args.token, "the gateway")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    gateway = gateway_from_args(args, open_store(args.store), args.token, close_store=True)
    served = ", ".join(gateway.models) + (" and any other model" if args.default else "")
    console.print(f"agentgrad gateway on {advertised_url(args)}/v1 serving {served}; store: {args.store}")
    from agentgrad.gateway.admin import is_public
    from agentgrad.serving.guard import Guard

    # The guard learns of the token too: with one, a host name other than loopback's is fine (see agentgrad.serving.guard).
    run(
        Guard(gateway, token=args.token, public=is_public),
        host=args.host,
        port=args.port,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        date_header=False,
    )


def serve(args: argparse.Namespace) -> None:
    """Serve a store (API, dashboard, OTLP, and the gateway when backends are given) until Ctrl+C."""
    from agentgrad.serving import run
    from agentgrad.store.server import UVICORN_OPTIONS, create_app

    try:
        check_exposure(args.host, args.token)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    store = open_store(args.store)
    extra: list[Any] = []
    closing: list[Any] = []
    metrics = None
    if args.backend or args.default or args.routes:
        gateway = gateway_from_args(args, store, None, close_store=False)  # the server's token guards it
        extra, closing, metrics = gateway.routes(), [gateway.aclose], gateway.metrics  # one /metrics for both
    shown = advertised_url(args)
    console.print(
        f"agentgrad store server on {shown}/api/ (store: {args.store}{', token required' if args.token else ''})"
    )
    console.print(f"  dashboard: {shown}/" + (f"\n  gateway: {shown}/v1" if extra else "") + "\nCtrl+C stops it")
    run(
        create_app(store, token=args.token, extra_routes=extra, on_shutdown=closing, metrics=metrics),
        host=args.host,
        port=args.port,
        **UVICORN_OPTIONS,
    )


def migrate_store(args: argparse.Namespace) -> None:
    """`agentgrad store migrate`: bring a PostgreSQL store's schema to this agentgrad's version, keeping every row."""
    from agentgrad.store import POSTGRES_SCHEMES
    from agentgrad.store.postgres import PostgresStore
    from agentgrad.store.postgres_pool import run_in_thread

    if not args.store.startswith(POSTGRES_SCHEMES):
        raise UsageError("only a PostgreSQL store has a schema to migrate: --store postgresql://user@host:5432/dbname")
    store = PostgresStore(args.store, sweep_seconds=None, migrate=True)
    run_in_thread(store.close())
    found, now = store.schema_found, store.schema_version
    change = f"migrated from version {found} to {now}" if found != now else f"already at version {now}"
    console.print(f"{store.address.shown}: {change}", highlight=False, markup=False)


def runner(
    store_spec: str,
    agent_spec: str,
    workers: int,
    token: str | None,
    gateway: str | None = None,
    isolation: Literal["thread", "process"] = "thread",
    runner_name: str | None = None,
) -> None:
    """Join a store as `workers` runners executing the agent `module:object`, until Ctrl+C: `workers`
    attempts at once, sync agents too. `isolation="process"` runs each attempt in a process of its own.

    With `gateway`, agents that build `OpenAI()` without arguments are routed through it (the
    runner sets OPENAI_BASE_URL / OPENAI_API_KEY for each attempt)."""
    import importlib
    import os
    import socket

    from agentgrad.rollout.agent import load_agent
    from agentgrad.rollout.workers import RunnerSpec, run_workers, worker_of

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
    runner_name = runner_name or f"{socket.gethostname()}-{os.getpid()}"
    worker_ids = [worker_of(runner_name, i, workers) for i in range(workers)]
    console.print(f"{workers} runner(s) of {agent.name} joining {store_spec}; Ctrl+C stops them")
    spec = RunnerSpec(agent, isolation=isolation, gateway=gateway, gateway_key=token or "agentgrad")
    run_workers(store_spec, token, spec, worker_ids)


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    from agentgrad.gateway.upstreams import (
        CONNECT_TIMEOUT_SECONDS,
        FIRST_BYTE_TIMEOUT_SECONDS,
        MAX_RETRIES,
        TIMEOUT_SECONDS,
    )

    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="MODEL=URL[,OPTION=VALUE...]",
        help="gateway: serve MODEL from the OpenAI-compatible URL (repeatable); options: key_env=VAR "
        "(API key from that variable), model=NAME (upstream's name: the engine answers only to "
        "its own, smollm2-135m by default), system=NAME (agentgrad or vllm: asked for token ids "
        "and logprobs; others get the request as sent), token_ids=BOOL, logprobs=BOOL",
    )
    parser.add_argument("--default", metavar="URL[,OPTION=VALUE...]", help="gateway: upstream for any other model")
    parser.add_argument(
        "--routes",
        metavar="FILE",
        help="gateway: model names and patterns -> upstreams, each with its key variable, deadlines, retries, "
        "rate limit and cache, from a TOML routing file (docs/routing.md); --backend adds to it",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=None,  # unset: each upstream's own (a routing file's, else CONNECT_TIMEOUT_SECONDS)
        metavar="S",
        help=f"gateway: seconds to connect to an upstream (default: each upstream's own, {CONNECT_TIMEOUT_SECONDS:g} unless a routing file says)",
    )
    parser.add_argument(
        "--first-byte-timeout",
        type=float,
        default=None,  # unset: each upstream's own (a routing file's, else FIRST_BYTE_TIMEOUT_SECONDS)
        metavar="S",
        help="gateway: longest silence from an upstream, before its answer starts or between stream "
        f"chunks (default: each upstream's own, {FIRST_BYTE_TIMEOUT_SECONDS:g} unless a routing file says; a non-streamed answer starts when complete)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,  # unset: each upstream's own (a routing file's, else TIMEOUT_SECONDS)
        metavar="S",
        help=f"gateway: longest a call may take in all, retries included; then a 504 and the upstream "
        f"request is cancelled (default: each upstream's own, {TIMEOUT_SECONDS:g} unless a routing file says)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=MAX_RETRIES,
        metavar="N",
        help=f"gateway: retries of a connection failure or an upstream 429/502/503, within --timeout "
        f"(default: {MAX_RETRIES})",
    )
