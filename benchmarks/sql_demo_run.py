"""`agentgrad demo --task sql` timed, with its before/after figures beside issue 43's goals.

    .venv/bin/python benchmarks/sql_demo_run.py                       # the demo at its defaults, a fresh run folder
    .venv/bin/python benchmarks/sql_demo_run.py -- --val-size 30      # demo flags after --

Runs the demo in a child process (its own run folder under the temp dir unless `--run-dir` is among the
flags), then prints the wall time, the child's peak RSS and the load average before and after, and, per
set of databases and per database, accuracy, failed-first share and self-corrected share at the first and
last validation, read from the run's `curve.csv`, beside the goals: at most 45 min and 16 GB; after training
a self-corrected share of at least 0.3 on the held-out sets, real-world accuracy up 10 points or more, the
project's held-out accuracy not down. On a machine shared with other jobs the wall time says little: the
load average beside it says how little.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_MINUTES = 45.0
GOAL_RSS_GB = 16.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("demo_flags", nargs="*", help="flags for `agentgrad demo --task sql`, after --")
    flags = parser.parse_args().demo_flags
    if "--run-dir" not in flags:
        flags += ["--run-dir", tempfile.mkdtemp(prefix="sql-demo-")]
    run_dir = Path(flags[flags.index("--run-dir") + 1])
    command = [sys.executable, "-m", "agentgrad.cli", "demo", "--task", "sql", *flags]
    load_before = os.getloadavg()
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, check=False, env={**os.environ, "COLUMNS": "200"})
    minutes = (time.perf_counter() - began) / 60
    load_after = os.getloadavg()
    rss_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # Linux: KiB
    print(f"command: {' '.join(command[2:])} (exit {done.returncode})")
    print(f"wall {minutes:.1f} min (goal <= {GOAL_MINUTES:.0f}), peak RSS {rss_gb:.1f} GB (goal <= {GOAL_RSS_GB:.0f}); "
          f"load average before {load_before[0]:.1f} / {load_before[1]:.1f} / {load_before[2]:.1f}, "
          f"after {load_after[0]:.1f} / {load_after[1]:.1f} / {load_after[2]:.1f}")
    if done.returncode != 0:  # a curve.csv there is an earlier run's: not this command's result
        raise SystemExit(f"the demo exited with {done.returncode}: no figures")
    curve = run_dir / "curve.csv"
    if not curve.exists():
        raise SystemExit(f"no {curve}: the demo did not finish")
    with open(curve) as f:
        rows = list(csv.DictReader(f))
    steps = sorted({int(r["step"]) for r in rows})
    at = {(int(r["step"]), r["scope"]): r for r in rows}
    print(f"{'databases':>14} | accuracy (step {steps[0]} -> {steps[-1]}) | first query failed | self-corrected")
    for scope in dict.fromkeys(r["scope"] for r in rows):
        before, after = at.get((steps[0], scope)), at.get((steps[-1], scope))
        if before is None or after is None:
            continue
        cells = [f"{float(before[k]):.3f} -> {float(after[k]):.3f}" for k in ("accuracy", "failed_first")]
        corrected = [f"{r['n_self_corrected']}/{r['n_failed_first']}" for r in (before, after)]
        print(f"{scope:>14} | {cells[0]:>22} | {cells[1]:>18} | {corrected[0]} -> {corrected[1]}")
    for scope, goal in (("held-out", "not down"), ("real-world", "up >= 0.10")):
        before, after = at.get((steps[0], scope)), at.get((steps[-1], scope))
        if before and after:
            change = float(after["accuracy"]) - float(before["accuracy"])
            print(f"{scope}: accuracy {change:+.3f} (goal {goal}); self-corrected after "
                  f"{float(after['self_corrected']):.3f} (goal >= 0.3)")


if __name__ == "__main__":
    main()
