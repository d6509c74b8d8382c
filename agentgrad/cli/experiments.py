"""The experiment commands: `runs ls|show|compare`, `export`, `ab report` (docs/experiments.md)."""

from __future__ import annotations

import argparse

from agentgrad.cli import ab_report, run_views
from agentgrad.cli.common import UsageError, with_store
from agentgrad.redact import RedactingConsole

console = RedactingConsole()


def export_command(args: argparse.Namespace) -> None:
    """`agentgrad export CHECKPOINT --to DIR [--merge-lora]`: a bad folder is a usage error naming what was wrong."""
    from agentgrad.policy.export import export

    try:
        target = export(args.checkpoint, args.to, merge_lora=args.merge_lora, base=args.base)
    except (ValueError, FileExistsError) as exc:
        raise UsageError(str(exc)) from None
    console.print(f"exported {args.checkpoint} to {target} (a Hugging Face folder: transformers and vLLM load it)")


def compare_command(args: argparse.Namespace) -> None:
    """`agentgrad runs compare RUN RUN...`: two runs or more, side by side."""
    if len(args.runs) < 2:
        raise UsageError(f"runs compare takes two runs or more (ids or names), got {len(args.runs)}: {args.runs[0]}")
    with_store(args.store, lambda s: run_views.compare_runs(console, s, args.runs))


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `export`, `ab` and `runs` to the `agentgrad` command."""
    export_parser = commands.add_parser("export", help="a training checkpoint as a Hugging Face folder (vLLM loads it)")
    export_parser.add_argument("checkpoint", help="a step-N checkpoint folder")
    export_parser.add_argument("--to", required=True, help="the folder to write (new or empty)")
    export_parser.add_argument("--merge-lora", action="store_true", help="merge a LoRA adapter into its base weights")
    export_parser.add_argument("--base", help="a LoRA adapter's base model (default: the one it names)")
    export_parser.set_defaults(handler=export_command)

    ab = commands.add_parser("ab", help="A/B serving: how the arms of a split did")
    ab_commands = ab.add_subparsers(dest="ab_command", required=True)
    ab_report_parser = ab_commands.add_parser("report", help="per-arm reward, success rate, CI of the difference")
    ab_report_parser.add_argument("--store", required=True, help="SQLite path or store server URL")
    ab_report_parser.add_argument("--mode", help="only rollouts of this mode (train, val, ...)")
    ab_report_parser.add_argument("--success-threshold", type=float, default=1.0, help="reward counted a success")
    ab_report_parser.set_defaults(
        handler=lambda a: with_store(a.store, lambda s: ab_report.print_report(console, s, a.mode, a.success_threshold))
    )

    runs = commands.add_parser("runs", help="the runs a store recorded: list, show one, compare several")
    run_commands = runs.add_subparsers(dest="runs_command", required=True)
    runs_ls = run_commands.add_parser("ls", help="a line per run: status, final figures, best, git commit")
    runs_ls.add_argument("--store", required=True, help="SQLite path or store server URL")
    runs_ls.set_defaults(handler=lambda a: with_store(a.store, lambda s: run_views.print_runs(console, s)))
    runs_show = run_commands.add_parser("show", help="one run: configuration, versions, machine, figures, checkpoints")
    runs_show.add_argument("run", help="run id, or name (the latest run of that name)")
    runs_show.add_argument("--store", required=True, help="SQLite path or store server URL")
    runs_show.set_defaults(handler=lambda a: with_store(a.store, lambda s: run_views.print_run(console, s, a.run)))
    runs_compare = run_commands.add_parser("compare", help="runs side by side: settings that differ, figures")
    runs_compare.add_argument("runs", nargs="+", metavar="RUN", help="run ids or names (two or more)")
    runs_compare.add_argument("--store", required=True, help="SQLite path or store server URL")
    runs_compare.set_defaults(handler=compare_command)
