"""`agentgrad apo`: APO on the agent an agent file defines, against any OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from agentgrad.cli.common import UsageError
from agentgrad.redact import RedactingConsole
from agentgrad.store import open_store

console = RedactingConsole()


EXAMPLE_AGENT_FILE = Path(__file__).resolve().parents[2] / "examples" / "ticket_routing.py"
"""What `agentgrad apo` optimizes by default (there in a source checkout)."""


AGENT_FILE_NAMES = ("agent", "seed_prompt", "train_data", "val_data")


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
    from agentgrad.algorithms.apo_critic import APOError

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
