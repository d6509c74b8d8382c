"""Command-line options that several commands share."""

from __future__ import annotations

import argparse

from agentgrad.tracking import TRACKERS


def add_report_to(parser: argparse.ArgumentParser) -> None:
    """`--report-to mlflow tensorboard`: the trackers a training command sends its run to (TRL's `report_to`)."""
    parser.add_argument(
        "--report-to",
        nargs="+",
        default=[],
        choices=[*TRACKERS, "none"],
        metavar="TRACKER",
        help=f"send the run's metrics, configuration and final figures to these trackers too: {', '.join(TRACKERS)} "
        "(each an extra: pip install 'agentgrad[mlflow]'; MLflow reads MLFLOW_TRACKING_URI, W&B WANDB_MODE, "
        "TensorBoard writes under runs/)",
    )
