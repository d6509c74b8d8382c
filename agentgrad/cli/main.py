"""The `agentgrad` command: train (demo, apo), serve (store, gateway, engine), join (runner), inspect (rollouts, metrics)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from rich.markup import escape
from rich.table import Table

from agentgrad.cli import experiments, gateway_routes, views
from agentgrad.cli.common import UsageError, with_store
from agentgrad.cli.options import add_report_to
from agentgrad.redact import RedactingConsole, redact, redact_logs
from agentgrad.serving.guard import TOKEN_ENV, check_exposure
from agentgrad.store import Store, StoreError, open_store
from agentgrad.store.client import StoreUnreachable

console = RedactingConsole()

EXAMPLE_AGENT_FILE = Path(__file__).resolve().parents[2] / "examples" / "ticket_routing.py"
"""What `agentgrad apo` optimizes by default (there in a source checkout)."""
AGENT_FILE_NAMES = ("agent", "seed_prompt", "train_data", "val_data")


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


def load_agent_file(path: Path) -> Any:
    """The module at `path`, which must define `agent`, `seed_prompt`, `train_data` and `val_data`."""
    if not path.is_file():
        raise UsageError(
            f"no agent file at {path}; pass --agent-file PATH, a Python file defining {', '.join(AGENT_FILE_NAMES)}"
        )
    spec = importlib.util.spec_from_file_location(f"agentgrad_agent_file_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    missing = [name for name in AGENT_FILE_NAMES if not hasattr(module, name)]
    if missing:
        raise UsageError(
            f"agent file {path} does not define {', '.join(missing)} (it needs {', '.join(AGENT_FILE_NAMES)})"
        )
    return module


def apo_command(args: argparse.Namespace) -> None:
    """Optimize the prompt of the agent in `--agent-file` with APO against an OpenAI-compatible endpoint."""
    import agentgrad as ag
    from agentgrad.algorithms.apo import APOError

    api_key = os.environ.get("OPENAI_API_KEY")
    if not api_key:
        raise UsageError("set OPENAI_API_KEY to the endpoint's key (any non-empty value for a server that takes none)")
    module = load_agent_file(Path(args.agent_file))
    try:
        algorithm = ag.APO(
            steps=args.steps,
            beam_width=args.beam_width,
            branch_factor=args.branch_factor,
            prompts_per_step=args.train_batch_size,
            val_size=args.val_batch_size,
            critic_model=args.critic_model or args.model,
            editor_model=args.editor_model,
            seed=args.seed,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from agentgrad.gateway import Backend, Gateway
    from agentgrad.serving import ServerThread
    from agentgrad.train.trainer import default_store_path

    # The agent, critic and editor call the endpoint through a gateway in this process: the key
    # stays here (the store keeps resources, and never sees it) and every call is recorded.
    store = open_store(args.store or default_store_path())
    upstream = Backend(url=args.base_url, api_key=api_key, token_ids=False, logprobs=False)
    with ServerThread(Gateway(store, default=upstream)) as gateway:
        llm = ag.LLM(
            base_url=gateway.url + "/v1",
            model=args.model,
            proxied=True,
            sampling_parameters={"temperature": args.temperature},
        )
        trainer = ag.Trainer(
            algorithm,
            n_runners=args.runners,
            store=store,
            resources={"prompt": module.seed_prompt, "llm": llm},
            report_to=args.report_to,
        )
        try:
            result = trainer.fit(module.agent, module.train_data, module.val_data)
        except APOError as exc:
            raise UsageError(str(exc)) from None

    table = Table(title="APO: validation score by round")
    for column in ("round", "best candidate", "best so far"):
        table.add_column(column, justify="right")
    so_far = float("-inf")
    for round_, score in enumerate(result.round_best):
        so_far = max(so_far, score if score is not None else so_far)
        table.add_row(
            "0 (seed)" if round_ == 0 else str(round_), "-" if score is None else f"{score:.3f}", f"{so_far:.3f}"
        )
    console.print(table)
    console.print(
        f"best prompt (printed above): score {result.score:.3f} (seed {result.seed_score:.3f}), "
        f"snapshot {result.source_id}, published as {result.resources_id}"
    )
    store_path = getattr(trainer.store, "path", args.store)
    console.print(
        f"store: {store_path}  (the search: each resources snapshot's metadata; "
        f"rollouts: agentgrad rollouts ls --store {store_path})"
    )


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


def run_demo(args: argparse.Namespace) -> None:
    """The calculator demo, or the text-to-SQL one (`--task sql`, its own module)."""
    if args.task == "sql":
        from agentgrad.cli import sql_demo

        sql_demo.main(args)
    else:
        from agentgrad.cli import demo

        demo.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgrad", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    from agentgrad.cli import demo as demo_module

    demo = commands.add_parser("demo", help="train an example agent on this machine (calculator, or --task sql)")
    demo_module.add_arguments(demo)
    demo.set_defaults(handler=run_demo)

    engine = commands.add_parser("engine", help="the local model: fetch it, serve it")
    engine_commands = engine.add_subparsers(dest="engine_command", required=True)
    fetch = engine_commands.add_parser("fetch", help="download and convert a built-in model once; print its path")
    fetch.add_argument("name", nargs="?", help="smollm2-135m (the default) or qwen2.5-coder-0.5b")
    fetch.add_argument("--model", help="the same as NAME, or a Hugging Face path or id")
    fetch.set_defaults(handler=fetch_model)
    serve_engine = engine_commands.add_parser("serve", help="serve the model as an OpenAI-compatible API")
    serve_engine.add_argument("--model", help="a Hugging Face path or id (default: SmolLM2-135M-Instruct)")
    serve_engine.add_argument(
        "--checkpoint",
        help="a training checkpoint (step-N folder): full weights, or a LoRA adapter merged into its base",
    )
    serve_engine.add_argument(
        "--base", help="--checkpoint of a LoRA adapter: its base model (default: the one it names)"
    )
    serve_engine.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also serve a saved LoRA adapter (a PEFT folder or a LoRA step-N checkpoint of this base) to requests "
        "whose model is NAME, as vLLM's --lora-modules (repeatable: two checkpoints of one run on one engine)",
    )
    add_address_arguments(serve_engine, 8000)
    serve_engine.add_argument("--max-batch-size", type=int, default=64)
    serve_engine.add_argument(
        "--threads",
        help="threads the generation loop computes with on a CPU: a number, or auto (measured; for a machine shared "
        "with other jobs, where two threads that wait on each other's barrier can decode several times slower than "
        "one); default $AGENTGRAD_ENGINE_THREADS, else every core",
    )
    serve_engine.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], help="sampling precision (default: bf16 where fast)"
    )
    serve_engine.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    serve_engine.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"bearer token callers must send (default: ${TOKEN_ENV}; required off loopback)",
    )
    serve_engine.set_defaults(handler=serve_engine_command)

    apo = commands.add_parser(
        "apo",
        help="improve an agent's prompt with any OpenAI-compatible model (key: OPENAI_API_KEY)",
        description="Beam search over the agent's prompt with textual gradients (APO); prints each round's "
        "validation score and the best prompt. The API key is read from OPENAI_API_KEY.",
    )
    apo.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint, e.g. https://api.openai.com/v1")
    apo.add_argument("--model", required=True, help="the agent's model")
    apo.add_argument("--critic-model", help="model that criticizes the prompt (default: --model)")
    apo.add_argument("--editor-model", help="model that rewrites the prompt (default: the critic model)")
    apo.add_argument("--steps", "--rounds", type=int, default=3, help="search rounds (steps; default: 3)")
    apo.add_argument("--beam-width", type=int, default=2, help="prompts kept after each round (default: 2)")
    apo.add_argument("--branch-factor", type=int, default=3, help="rewrites per prompt and round (default: 3)")
    apo.add_argument(
        "--train-batch-size", type=int, default=8, help="training rollouts per prompt and round (default: 8)"
    )
    apo.add_argument("--val-batch-size", type=int, help="validation tasks each prompt is scored on (default: all)")
    apo.add_argument("--temperature", type=float, default=0.0, help="the agent's sampling temperature (default: 0)")
    apo.add_argument("--runners", type=int, default=4, help="rollouts run at once (default: 4)")
    apo.add_argument("--seed", type=int, default=0, help="seed of the task order (default: 0)")
    apo.add_argument(
        "--agent-file",
        default=str(EXAMPLE_AGENT_FILE),
        help="Python file defining agent, seed_prompt, train_data and val_data (default: the ticket router example)",
    )
    apo.add_argument("--store", help="SQLite file for the run (default: a new file under .agentgrad/)")
    add_report_to(apo)
    apo.set_defaults(handler=apo_command)

    rollouts = commands.add_parser("rollouts", help="list and inspect rollouts in a store")
    rollout_commands = rollouts.add_subparsers(dest="rollouts_command", required=True)
    ls = rollout_commands.add_parser("ls", help="a table of rollouts")
    ls.add_argument("--store", required=True, help="SQLite path, store server URL or postgresql:// URL")
    ls.add_argument("--status", action="append", help="only this status (repeatable)")
    ls.add_argument("--mode", help="only this mode (train, val, ...)")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--offset", type=int, default=0)
    ls.set_defaults(
        handler=lambda a: with_store(
            a.store, lambda s: views.print_rollouts(console, s, a.status, a.mode, a.limit, a.offset)
        )
    )
    show = rollout_commands.add_parser("show", help="one rollout: its attempts and span tree")
    show.add_argument("rollout_id")
    show.add_argument("--store", required=True, help="SQLite path, store server URL or postgresql:// URL")
    show.set_defaults(handler=lambda a: with_store(a.store, lambda s: views.print_rollout(console, s, a.rollout_id)))

    experiments.add_commands(commands)

    metrics = commands.add_parser("metrics", help="the training curves in a store, a line each")
    metrics.add_argument("--store", required=True, help="SQLite path, store server URL or postgresql:// URL")
    metrics.add_argument("--prefix", help="only names starting with this (train/, val/, perf/, apo/)")
    metrics.set_defaults(handler=lambda a: with_store(a.store, lambda s: views.print_metrics(console, s, a.prefix)))

    gateway = commands.add_parser(
        "gateway",
        help="serve the OpenAI-compatible gateway that records model calls into a store; `gateway routes`: its table",
    )
    gateway.add_argument("--store", help="serving: SQLite path, 'memory', or store server URL (required)")
    add_backend_arguments(gateway)
    add_address_arguments(gateway, 8090)
    gateway.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"bearer token callers must send as their API key (default: ${TOKEN_ENV}; required off loopback)",
    )
    gateway.set_defaults(handler=run_gateway)
    gateway_routes.add_commands(gateway)

    server = commands.add_parser("serve", help="serve a store over HTTP (runners and algorithms anywhere can use it)")
    server.add_argument(
        "--store",
        required=True,
        help="SQLite file (created if missing), 'memory', or postgresql://user@host:5432/dbname (several servers "
        "may serve one PostgreSQL database)",
    )
    add_address_arguments(server, DEFAULT_PORT)
    server.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV), help=f"bearer token clients must send (default: ${TOKEN_ENV})"
    )
    add_backend_arguments(server)
    server.set_defaults(handler=serve)

    store_command = commands.add_parser("store", help="look after a store")
    store_commands = store_command.add_subparsers(dest="store_command", required=True)
    migrate = store_commands.add_parser(
        "migrate", help="bring a PostgreSQL store's schema up to this agentgrad's version (every row kept)"
    )
    migrate.add_argument("--store", required=True, help="postgresql://user[:password]@host:5432/dbname")
    migrate.set_defaults(handler=migrate_store)

    join = commands.add_parser("runner", help="join a store as runner(s) executing an agent")
    join.add_argument("--store", required=True, help="store server URL (or a SQLite path on a shared disk)")
    join.add_argument("--agent", required=True, help="the agent as module:object, importable from here")
    join.add_argument("--workers", type=int, default=1, help="attempts run at once in this process (one runner each)")
    join.add_argument(
        "--isolation",
        choices=("thread", "process"),
        default="thread",
        help="thread: agents run in this process, and whatever they raise fails only their attempt; "
        "process: each attempt in a process of its own, so an agent that exits or crashes the "
        "interpreter (os._exit, a segfault) fails its attempt with the exit code",
    )
    join.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"the server's token (default: ${TOKEN_ENV})")
    join.add_argument(
        "--gateway",
        help="gateway URL (…/v1) that agents building OpenAI() without arguments should "
        "call: set as OPENAI_BASE_URL, routed to each attempt",
    )
    join.add_argument(
        "--name",
        help="the runner's worker id (with --workers N: NAME/0 ... NAME/N-1); default: host-pid. A new runner "
        "process of a name first gives up the attempts its dead predecessor of that name left running",
    )
    join.set_defaults(handler=lambda a: runner(a.store, a.agent, a.workers, a.token, a.gateway, a.isolation, a.name))
    return parser


def fetch_model(args: argparse.Namespace) -> None:
    """`agentgrad engine fetch [NAME]`: fetch and convert a built-in model once, print its folder."""
    from agentgrad.engine.model import ModelNotFoundError, resolve_model

    try:
        print(resolve_model(args.name or args.model))
    except ModelNotFoundError as exc:
        raise UsageError(str(exc)) from exc


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    redact_logs()  # warnings from any component (APO's unusable replies, the gateway) say no key
    try:
        args.handler(args)
    except (StoreError, StoreUnreachable, UsageError) as exc:
        console.print(f"[red]error:[/red] {escape(redact(str(exc)))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
