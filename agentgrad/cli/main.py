"""The `agentgrad` command: train (demo, apo), serve (store, gateway, engine), join (runner), inspect (rollouts, metrics)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from rich.markup import escape

from agentgrad.cli import experiments, gateway_routes, views
from agentgrad.cli.apo import EXAMPLE_AGENT_FILE, apo_command
from agentgrad.cli.common import UsageError, with_store
from agentgrad.cli.options import add_report_to
from agentgrad.cli.servers import (
    DEFAULT_PORT,
    add_address_arguments,
    add_backend_arguments,
    migrate_store,
    run_gateway,
    runner,
    serve,
    serve_engine_command,
)
from agentgrad.redact import RedactingConsole, redact, redact_logs
from agentgrad.serving.guard import TOKEN_ENV
from agentgrad.store import StoreError
from agentgrad.store.client import StoreUnreachable

console = RedactingConsole()


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
