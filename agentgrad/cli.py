"""The `agentgrad` command: run the demo, optimize a prompt, serve the engine or the gateway, inspect rollouts."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from agentgrad.store import NotFoundError, Store, StoreError, open_store
from agentgrad.store.client import TOKEN_ENV, StoreUnreachable
from agentgrad.types import Rollout, Span

console = Console()

EXAMPLE_AGENT_FILE = Path(__file__).resolve().parent.parent / "examples" / "ticket_routing.py"
"""What `agentgrad apo` optimizes by default (there in a source checkout)."""
AGENT_FILE_NAMES = ("agent", "seed_prompt", "train_data", "val_data")


class UsageError(Exception):
    """The command line asks for something that cannot be done; the message says what to change."""

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


def serve_engine_command(args: argparse.Namespace) -> None:
    import uvicorn

    from agentgrad.engine import Engine
    from agentgrad.engine.server import create_engine_app

    engine = Engine(args.model, device=args.device, sampling_dtype=args.dtype, max_batch_size=args.max_batch_size)
    console.print(f"serving {engine.name} ({engine.sampling_dtype}, {engine.device}) on http://{args.host}:{args.port}/v1")
    uvicorn.run(create_engine_app(engine), host=args.host, port=args.port, log_level="warning")


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
            rounds=args.rounds, beam_width=args.beam_width, branch_factor=args.branch_factor,
            train_batch_size=args.train_batch_size, val_batch_size=args.val_batch_size,
            critic_model=args.critic_model or args.model, editor_model=args.editor_model, seed=args.seed,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from agentgrad.gateway import Backend, Gateway
    from agentgrad.serving import ServerThread
    from agentgrad.trainer import default_store_path

    # The agent, critic and editor call the endpoint through a gateway in this process: the key
    # stays here (the store keeps resources, and never sees it) and every call is recorded.
    store = open_store(args.store or default_store_path())
    upstream = Backend(url=args.base_url, api_key=api_key, token_ids=False, logprobs=False)
    with ServerThread(Gateway(store, default=upstream)) as gateway:
        llm = ag.LLM(base_url=gateway.url + "/v1", model=args.model, proxied=True,
                     sampling_parameters={"temperature": args.temperature})
        trainer = ag.Trainer(algorithm, n_runners=args.runners, store=store,
                             resources={"prompt": module.seed_prompt, "llm": llm})
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
        table.add_row("0 (seed)" if round_ == 0 else str(round_), "-" if score is None else f"{score:.3f}",
                      f"{so_far:.3f}")
    console.print(table)
    console.print(f"best prompt (printed above): score {result.score:.3f} (seed {result.seed_score:.3f}), "
                  f"snapshot {result.source_id}, published as {result.resources_id}")
    store_path = getattr(trainer.store, "path", args.store)
    console.print(f"store: {store_path}  (the search: each resources snapshot's metadata; "
                  f"rollouts: agentgrad rollouts ls --store {store_path})")


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def run_gateway(args: argparse.Namespace) -> None:
    """`agentgrad gateway`: serve the gateway until interrupted; buffered spans are written on the way out."""
    import os

    import uvicorn

    from agentgrad.gateway import Gateway, parse_backend

    token = os.environ.get(args.token_env) or None
    try:
        if token is None and args.host not in LOOPBACK_HOSTS and not args.host.startswith("127."):
            raise ValueError(f"--host {args.host} is reachable from other machines: set ${args.token_env} to a bearer token")
        backends = dict(parse_backend(spec) for spec in args.backend)
        default = parse_backend(f"default={args.default}")[1] if args.default else None
        gateway = Gateway(open_store(args.store), backends, default=default, token=token, close_store=True)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise SystemExit(2) from None
    served = ", ".join(gateway.models) + (" and any other model" if default else "")
    console.print(f"agentgrad gateway on http://{args.host}:{args.port}/v1 serving {served}; store: {args.store}")
    uvicorn.run(gateway, host=args.host, port=args.port, log_level="warning", access_log=False, lifespan="on",
                proxy_headers=False, server_header=False, date_header=False)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgrad", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    from agentgrad import demo as demo_module

    demo = commands.add_parser("demo", help="train the example calculator agent on this machine")
    demo_module.add_arguments(demo)
    demo.set_defaults(handler=demo_module.main)

    engine = commands.add_parser("engine", help="the local model: fetch it, serve it")
    engine_commands = engine.add_subparsers(dest="engine_command", required=True)
    fetch = engine_commands.add_parser("fetch", help="download and convert the default model once; print its path")
    fetch.add_argument("--model", help="a Hugging Face path or id (default: the built-in SmolLM2-135M-Instruct)")
    fetch.set_defaults(handler=lambda a: print(__import__("agentgrad.engine.model", fromlist=["x"]).resolve_model(a.model)))
    serve_engine = engine_commands.add_parser("serve", help="serve the model as an OpenAI-compatible API")
    serve_engine.add_argument("--model", help="a Hugging Face path or id (default: SmolLM2-135M-Instruct)")
    serve_engine.add_argument("--host", default="127.0.0.1")
    serve_engine.add_argument("--port", type=int, default=8000)
    serve_engine.add_argument("--max-batch-size", type=int, default=64)
    serve_engine.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="sampling precision (default: bf16 where fast)")
    serve_engine.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    serve_engine.set_defaults(handler=serve_engine_command)

    apo = commands.add_parser(
        "apo", help="improve an agent's prompt with any OpenAI-compatible model (key: OPENAI_API_KEY)",
        description="Beam search over the agent's prompt with textual gradients (APO); prints each round's "
                    "validation score and the best prompt. The API key is read from OPENAI_API_KEY.",
    )
    apo.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint, e.g. https://api.openai.com/v1")
    apo.add_argument("--model", required=True, help="the agent's model")
    apo.add_argument("--critic-model", help="model that criticizes the prompt (default: --model)")
    apo.add_argument("--editor-model", help="model that rewrites the prompt (default: the critic model)")
    apo.add_argument("--rounds", type=int, default=3, help="search rounds (default: 3)")
    apo.add_argument("--beam-width", type=int, default=2, help="prompts kept after each round (default: 2)")
    apo.add_argument("--branch-factor", type=int, default=3, help="rewrites per prompt and round (default: 3)")
    apo.add_argument("--train-batch-size", type=int, default=8,
                     help="training rollouts per prompt and round (default: 8)")
    apo.add_argument("--val-batch-size", type=int, help="validation tasks each prompt is scored on (default: all)")
    apo.add_argument("--temperature", type=float, default=0.0, help="the agent's sampling temperature (default: 0)")
    apo.add_argument("--runners", type=int, default=4, help="rollouts run at once (default: 4)")
    apo.add_argument("--seed", type=int, default=0, help="seed of the task order (default: 0)")
    apo.add_argument("--agent-file", default=str(EXAMPLE_AGENT_FILE),
                     help="Python file defining agent, seed_prompt, train_data and val_data "
                          "(default: the ticket router example)")
    apo.add_argument("--store", help="SQLite file for the run (default: a new file under .agentgrad/)")
    apo.set_defaults(handler=apo_command)

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

    gateway = commands.add_parser("gateway", help="serve the OpenAI-compatible gateway that records model calls into a store")
    gateway.add_argument("--store", required=True, help="SQLite path, 'memory', or store server URL")
    gateway.add_argument("--backend", action="append", default=[], metavar="MODEL=URL[,OPTION=VALUE...]",
                         help="serve MODEL from the OpenAI-compatible URL (repeatable); options: key_env=VAR (API key "
                              "from that variable), model=NAME (upstream's name), system=NAME, token_ids=false, logprobs=false")
    gateway.add_argument("--default", metavar="URL[,OPTION=VALUE...]", help="upstream for models not named by --backend")
    gateway.add_argument("--host", default="127.0.0.1")
    gateway.add_argument("--port", type=int, default=8090)
    gateway.add_argument("--token-env", default="AGENTGRAD_TOKEN",
                         help="variable holding the bearer token callers must send (required off loopback)")
    gateway.set_defaults(handler=run_gateway)

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
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
