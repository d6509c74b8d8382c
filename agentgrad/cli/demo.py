"""`agentgrad demo`: train the example calculator agent on this machine and show it got better.

The agent (`examples/calc_agent.py`) is plain Python with the `openai` client. It runs in
runner threads; its calls go through the gateway to the local engine (SmolLM2-135M-Instruct on
CPU), which GRPO (or SFT) trains. Validation before and after is greedy, on 256 held-out problems.

`--task function` (the default): three-digit additions the model cannot do in its head, with a
calculator function (`tools=[calculate]`, OpenAI function calling) it rarely calls before
training: GRPO teaches it to call the tool. `--task tool` is the same by the text protocol
`calculate: <expr>`. Each attempt
that calls it makes two model calls (the call, then the answer after the result); the adapter
merges them into one trajectory (the second prompt continues the first token for token), the
tool result masked out of the loss, and the attempt's reward is its advantage for every token
the model wrote in either call. `--task plain`: two-digit additions, no tool.

Each run lives in a run folder, `.agentgrad/demo-<task>-<algorithm>/` (`--run-dir`): its store
(`store.db`) and GRPO's checkpoints (`checkpoints/step-N`, every `--checkpoint-every` steps). After
a crash, the same command again offers to resume (`--resume` says yes without asking, `--fresh`
starts over and keeps the old folder aside): GRPO and SFT pick up at the newest checkpoint, with its
optimizer, in the same store, and the rollouts the crash left unfinished are cancelled. The same command after
a run finished shows that run's result, read from its store (`--fresh` runs it again, more `--steps` go on).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rich.table import Table

import agentgrad as ag
from agentgrad.cli.options import add_report_to
from agentgrad.redact import RedactingConsole

if TYPE_CHECKING:
    from agentgrad.algorithms.base import Evaluation, Result
    from agentgrad.algorithms.loop import TrainsWeights

console = RedactingConsole()

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


def load_calc_example() -> ModuleType:
    """`examples.calc_agent`, importable by name (runner processes re-import it) from a source checkout."""
    if not (EXAMPLES_DIR / "calc_agent.py").exists():
        raise SystemExit(f"the demo needs the examples folder of a source checkout ({EXAMPLES_DIR} is missing)")
    root = str(EXAMPLES_DIR.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    import examples.calc_agent

    return examples.calc_agent


async def tool_call_rates(store: Any) -> dict[int, float]:
    """Per validation step, the share of held-out rollouts that called the calculator (made a second model call)."""
    from agentgrad.semconv import is_llm_call

    called: dict[int, list[bool]] = {}
    rollouts = await store.query_rollouts(mode="val")
    spans_of = await store.query_spans_of([r.rollout_id for r in rollouts])
    for rollout in rollouts:
        spans = spans_of[rollout.rollout_id]
        called.setdefault(int(rollout.metadata.get("step", 0)), []).append(sum(map(is_llm_call, spans)) > 1)
    return {step: sum(flags) / len(flags) for step, flags in called.items()}


def outcome_table(
    task: str, n: int, before: Evaluation | None, after: Evaluation | None, rates: dict[int, float]
) -> Table:
    """Before and after training on the held-out problems: accuracy, tool-call rate, reward, completed."""
    table = Table(title=f"calc agent ({task}), {n} held-out problems, greedy")
    for column in ("", "accuracy", "tool-call rate", "reward mean", "completed"):
        table.add_column(column, justify="right")
    for (name, evaluation), step in zip(
        (("before", before), ("after", after)), (min(rates, default=0), max(rates, default=0))
    ):
        if evaluation is not None:
            rate = f"{rates[step]:.3f}" if step in rates else "-"
            table.add_row(
                name,
                f"{evaluation.success_rate:.3f}",
                rate,
                f"{evaluation.reward_mean:.3f}",
                f"{evaluation.succeeded}/{evaluation.n}",
            )
    return table


async def validations_of(store_spec: str) -> tuple[Evaluation | None, Evaluation | None]:
    """A finished run's first and last validation, read from its store (its held-out rollouts, by step)."""
    from agentgrad.algorithms.base import Evaluation
    from agentgrad.store import open_store
    from agentgrad.types import RolloutStatus

    store = open_store(store_spec)
    try:
        by_step: dict[int, list[Any]] = {}
        for rollout in await store.query_rollouts(mode="val"):
            if rollout.status is not RolloutStatus.CANCELLED:  # a validation a crash cut short, redone on resume
                by_step.setdefault(int(rollout.metadata.get("step", 0)), []).append(rollout)
    finally:
        await store.close()
    if not by_step:
        return None, None
    return Evaluation.of(by_step[min(by_step)]), Evaluation.of(by_step[max(by_step)])


async def store_rates(store_spec: str) -> dict[int, float]:
    """`tool_call_rates` of the store at `store_spec`."""
    from agentgrad.store import open_store

    store = open_store(store_spec)
    try:
        return await tool_call_rates(store)
    finally:
        await store.close()


@dataclass(frozen=True)
class RunFolder:
    """Where a demo run keeps its store and checkpoints, and whether it continues an earlier one."""

    path: Path
    store: str
    checkpoints: Path
    resume_step: int | None
    """The step of the checkpoint the run resumes from (0: the earlier run saved none); None: a new run."""
    finished: bool = False
    """The earlier run saved its last step: there is nothing to run, only its result to show."""


def run_folder(args: argparse.Namespace, ask: Any = None) -> RunFolder:
    """The run folder of this demo command: a new run, or the earlier one's to resume (see the module docstring).

    An earlier run there is resumed with `--resume`, set aside with `--fresh` (renamed with its date), or,
    with neither, resumed if `ask` (a terminal's yes/no question) says so; without a terminal the
    command stops and says which flag to pass."""
    from agentgrad.policy.checkpoints import latest_checkpoint

    path = Path(args.run_dir) if args.run_dir else Path(".agentgrad") / f"demo-{args.task}-{args.algorithm}"
    checkpoints = path / "checkpoints"
    own_store = path / "store.db"
    found = latest_checkpoint(checkpoints)
    step = int(found.name.removeprefix("step-")) if found is not None else 0
    earlier = found is not None or own_store.exists()
    if earlier and args.fresh:
        aside = path.with_name(f"{path.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        path.rename(aside)
        console.print(f"the earlier run in {path} was moved to {aside}; starting over")
        earlier = False
    elif earlier and found is not None and step >= demo_steps(args):
        return RunFolder(path, args.store or str(own_store), checkpoints, step, finished=True)
    elif earlier and not args.resume:
        where = f"step {step} ({found})" if found is not None else "its start (it saved no checkpoint)"
        question = f"an earlier demo run in {path} can resume from {where}: resume it? [Y/n] "
        if ask is None and sys.stdin.isatty():
            ask = console.input
        if ask is None:
            raise SystemExit(
                f"an earlier demo run in {path} stopped; it resumes from {where}. Pass --resume to "
                "continue it, or --fresh to start over (the earlier folder is kept, renamed)"
            )
        if ask(question).strip().lower() not in ("", "y", "yes"):
            raise SystemExit("not resumed: pass --fresh to start over (the earlier folder is kept, renamed)")
    path.mkdir(parents=True, exist_ok=True)
    return RunFolder(path, args.store or str(own_store), checkpoints, step if earlier else None)


def demo_steps(args: argparse.Namespace) -> int:
    """The run's steps (GRPO's and SFT's alike)."""
    if args.algorithm == "sft":
        return args.steps or 3
    return args.steps or {"plain": 20, "sql": 6}.get(args.task, 10)


def demo_runners(args: argparse.Namespace) -> int:
    """Runner threads: 64 rollouts at once; for the SQL agent 2 threads of `sql_demo.RUNNER_CONCURRENCY` (its fp32
    0.5B model on a loaded 2-core CPU took over the gateway's 600 s per call with too many episodes prefilling
    together)."""
    return args.runners or (2 if args.task == "sql" else 4)


def check_resume_flags(args: argparse.Namespace) -> None:
    """Refuse `--resume` with `--fresh` before anything is loaded."""
    if args.resume and args.fresh:
        raise SystemExit("--resume continues the earlier run, --fresh starts over: pass one of them")


def open_run(args: argparse.Namespace) -> RunFolder:
    """`run_folder`, with the rollouts a resumed run left unfinished cancelled and the resume said."""
    run = run_folder(args)
    if run.finished:
        console.print(
            f"the demo run in {run.path} already finished its {run.resume_step} steps; its result, from its store "
            f"(--fresh runs it again, the earlier folder kept and renamed; more --steps train on from there):"
        )
    elif run.resume_step is not None:
        cancelled = asyncio.run(cancel_unfinished(run.store))
        console.print(
            f"resuming the run in {run.path} from step {run.resume_step}"
            + (f"; {cancelled} rollout(s) it left unfinished cancelled" if cancelled else "")
        )
    return run


async def cancel_unfinished(store_spec: str) -> int:
    """Cancel the rollouts an interrupted run left queued or running (their resources died with it)."""
    from agentgrad.store import open_store
    from agentgrad.types import RolloutStatus

    store = open_store(store_spec)
    try:
        left = await store.query_rollouts(
            status=[RolloutStatus.QUEUING, RolloutStatus.REQUEUING, RolloutStatus.RUNNING]
        )
        for rollout in left:
            await store.update_rollout(rollout.rollout_id, status=RolloutStatus.CANCELLED)
        return len(left)
    finally:
        await store.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--task",
        choices=["function", "tool", "plain", "sql"],
        default="function",
        help="function: three-digit additions and a calculator function (OpenAI function calling, the "
        "default); tool: the same by the text protocol 'calculate: <expr>'; plain: two-digit, no tool; "
        "sql: the text-to-SQL agent of examples/sql on Qwen2.5-Coder-0.5B with LoRA (agentgrad.cli.sql_demo)",
    )
    parser.add_argument(
        "--model",
        help="a built-in model name or a Hugging Face folder (default: smollm2-135m; qwen2.5-coder-0.5b for sql)",
    )
    parser.add_argument(
        "--sql-first-call",
        choices=["required", "auto"],
        default="required",
        help="sql: the agent's first turn must run a query (tool_choice required; the untrained Qwen-0.5B "
        "almost never calls run_sql by itself), or may answer at once (auto)",
    )
    parser.add_argument(
        "--sql-from-mistakes",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="sql: the share of training episodes that start from a mistake to fix (a query that fails, already "
        "run, with the tool's answer), added to the training questions (default: 0)",
    )
    parser.add_argument(
        "--sql-rerun-mistakes",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="sql: the share of those episodes whose mistake already ran twice, rerun unchanged with the tool's "
        "'You ran this same query before: change it' (the greedy model's commonest failure), so what is trained "
        "is changing the query after that (default: 0)",
    )
    parser.add_argument(
        "--sql-warm-start",
        action="store_true",
        help="sql: before the first GRPO step, fine-tune (SFT) on 240 demonstrations: fixes of mistakes that fail "
        "(the tool's answer, then the gold query), of the three join mistakes, and chats that start right "
        "(examples/sql/recovery.py; ~25 min more on 2 CPU cores)",
    )
    parser.add_argument(
        "--algorithm", choices=["grpo", "sft"], default="grpo", help="what trains the model (default: grpo)"
    )
    parser.add_argument(
        "--steps", type=int, help="training steps (default: GRPO 10 for tool, 20 for plain, 6 for sql; SFT 3)"
    )
    parser.add_argument(
        "--val-size",
        type=int,
        help="held-out problems judged before and after (default: 256; for sql 60 of each held-out set)",
    )
    parser.add_argument(
        "--val-every",
        type=int,
        metavar="K",
        help="validate every K steps too (default: GRPO only before and after, 3 for sql; SFT every step)",
    )
    parser.add_argument(
        "--runners", type=int, help="runner threads, each running 16 rollouts at once (default: 4; for sql 2 of 8)"
    )
    parser.add_argument("--store", help="SQLite file for the run (default: store.db in the run folder)")
    parser.add_argument(
        "--run-dir", help="the run's folder: store and checkpoints (default: .agentgrad/demo-TASK-ALGORITHM)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the earlier run in the run folder from its newest checkpoint, without asking",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start over; an earlier run in the run folder is kept, renamed with its date",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=1,
        metavar="K",
        help="checkpoint every K steps, so a crash loses fewer than K (default: 1); the "
        "newest 2 and the best validated are kept, 1.6 GB each for the default model, ~7 s to write here",
    )
    parser.add_argument(
        "--prompts-per-step", type=int, help="tasks sampled per step (default: GRPO 8, 4 for sql; SFT 64)"
    )
    parser.add_argument("--group-size", type=int, help="rollouts per task (default: GRPO 8, 4 for sql; SFT 4)")
    parser.add_argument(
        "--dynamic-sampling",
        type=int,
        default=0,
        metavar="N",
        help="GRPO: a step with fewer than --prompts-per-step groups whose rewards differ draws as many tasks again, "
        "up to N more times (DAPO's dynamic sampling; default: 0, off)",
    )
    parser.add_argument(
        "--learning-rate",
        type=float,
        metavar="LR",
        help="the update's learning rate (default: the algorithm's, 1e-5; for sql 2e-5, the warm start's apart)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        help="train LoRA adapters of this rank instead of all weights (default: 0, all weights); each checkpoint is "
        "then an adapter, and two of them serve from one engine (engine serve --adapter NAME=PATH)",
    )
    parser.add_argument(
        "--strategy",
        choices=["threads", "ray"],
        default="threads",
        help="runners as threads here, or as actors of a Ray cluster ($RAY_ADDRESS, else a local one)",
    )
    parser.add_argument(
        "--train-processes",
        type=int,
        default=1,
        help="shard the update with FSDP2 over this many processes (Ray actors with --strategy ray)",
    )
    parser.add_argument(
        "--engine",
        choices=["local", "vllm"],
        default="local",
        help="what samples the rollouts: the built-in engine, or vLLM servers from .venv-vllm (make vllm)",
    )
    parser.add_argument(
        "--vllm-replicas", type=int, default=1, help="--engine vllm: servers to start (one core each on a CPU)"
    )
    parser.add_argument(
        "--vllm-url",
        action="append",
        default=[],
        help="--engine vllm: attach to this server (VLLM_SERVER_DEV_MODE=1) instead; repeat for replicas",
    )
    add_report_to(parser)


def main(args: argparse.Namespace) -> None:
    from agentgrad.engine import Engine

    check_resume_flags(args)
    calc = load_calc_example()
    train, val = calc.make_splits(n_train=2000, n_val=args.val_size or 256, seed=args.seed, demo=args.task)
    run = open_run(args)  # before the model loads: a question or a stop comes at once
    if run.finished:
        before, after = asyncio.run(validations_of(run.store))
        console.print(outcome_table(args.task, len(val), before, after, asyncio.run(store_rates(run.store))))
        return
    began = time.perf_counter()
    # vLLM samples: no bf16 copy here
    engine = Engine(args.model, sampling_dtype="float32") if args.engine == "vllm" else Engine(args.model)
    from agentgrad.policy.config import PolicyConfig

    policy = PolicyConfig(
        engine=args.engine, vllm_replicas=args.vllm_replicas, vllm_urls=args.vllm_url or (), lora_rank=args.lora_rank
    )
    steps = demo_steps(args)
    settings: dict[str, Any] = {
        "steps": steps,
        "checkpoint_dir": str(run.checkpoints),
        "checkpoint_every": args.checkpoint_every,
        "seed": args.seed,
        "train_processes": args.train_processes,
        "policy": policy,
        **{
            name: value
            for name in ("prompts_per_step", "group_size", "val_every", "learning_rate")
            if (value := getattr(args, name)) is not None
        },
    }
    algorithm: TrainsWeights
    if args.algorithm == "grpo":
        from agentgrad.algorithms.grpo import GRPO

        # micro-batches of 8: the update's memory is the activations of one micro-batch (see README)
        settings.setdefault("val_every", 10 if args.task == "plain" else steps)
        algorithm = GRPO(local_engine=engine, micro_batch_size=8, dynamic_sampling=args.dynamic_sampling, **settings)
    else:
        from agentgrad.algorithms.sft import SFT

        if args.dynamic_sampling:
            raise SystemExit(
                "--dynamic-sampling is GRPO's (groups whose rewards differ): SFT keeps what each step earned"
            )

        algorithm = SFT(local_engine=engine, **settings)
    if args.strategy == "ray":
        import ray.cloudpickle

        ray.cloudpickle.register_pickle_by_value(calc)  # runner actors elsewhere have no checkout to import it from
    trainer: ag.Trainer[Result] = ag.Trainer(
        algorithm,
        n_runners=demo_runners(args),
        runner_concurrency=16,
        store=run.store,
        strategy=args.strategy,
        report_to=args.report_to,
    )
    console.print(
        f"training the calculator agent ({args.task} task, seed {args.seed}) with {args.algorithm.upper()} "
        f"on {engine.name} ({engine.device}, "
        f"rollouts by {'vLLM' if args.engine == 'vllm' else 'the built-in engine'}); "
        f"store: {getattr(trainer.store, 'path', trainer.store)}"
    )
    result = trainer.fit(calc.calc_agent, train, val)
    elapsed = time.perf_counter() - began

    rates = asyncio.run(tool_call_rates(trainer.store))
    table = outcome_table(args.task, len(val), result.initial, result.final, rates)
    console.print(table)
    store = getattr(trainer.store, "path", trainer.store)
    console.print(f"{args.algorithm.upper()} took {elapsed / 60:.1f} min (model load, validation and training)")
    console.print(
        f"store: {store}\n  agentgrad rollouts ls --store {store}\ncheckpoint: {result.checkpoint}"
        f"\nrun folder: {run.path} (the same command resumes it; --fresh starts over)"
    )
