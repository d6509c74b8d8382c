"""Where the test suite's time goes: per marker, per file and the slowest tests, from a log of every test's times.

    .venv/bin/python -m pytest -q -p benchmarks.suite_times --times-log=run.jsonl   # `make test`'s suite, logged
    .venv/bin/python benchmarks/suite_times.py run.jsonl [--compare before.jsonl] [--files 40] [--top 25]

As a pytest plugin (`-p benchmarks.suite_times`) it appends one JSON line per test phase (set-up, call, tear-down)
as the test ends, with the test's marker group and the load average, so a run that is killed halfway (a shared
machine running out of memory) keeps what it measured, and runs split over several pytest processes (`-n 2`, or one
file list each) add up. A test's time is its three phases together, so a fixture shared by many tests (a session
engine, a vLLM server) counts on the first test that starts it. Marker groups, most expensive first: `vllm`, `qwen`,
`model` (the markers), `tiny` (a tiny model: tests/tiny_models.py) and `none`. With `--compare`, the per-marker
table shows an earlier run beside this one (docs/development.md has the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

GROUPS = ("vllm", "qwen", "model", "tiny", "none")
LOG_PATH: dict[str, str] = {}


def marker_group(item: Any) -> str:
    """The most expensive thing a test loads: `vllm`, `qwen`, `model` (its markers), `tiny` (a fixture named
    `tiny_...` among those it uses) or `none`."""
    for marker in GROUPS[:3]:
        if item.get_closest_marker(marker):
            return marker
    return "tiny" if any(name.startswith("tiny_") for name in getattr(item, "fixturenames", ())) else "none"


# ----------------------------------------------------------------------------- the pytest plugin


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--times-log", help="append each test phase's duration to this file (JSON lines)")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        item.user_properties.append(("marker_group", marker_group(item)))


def pytest_runtest_logreport(report: Any) -> None:
    log = LOG_PATH.get("path")
    if not log or getattr(report, "node", None) is not None:  # under pytest-xdist: a worker's report, logged there
        return
    group = dict(report.user_properties).get("marker_group", "none")
    line = {"nodeid": report.nodeid, "when": report.when, "seconds": round(report.duration, 3),
            "outcome": report.outcome, "group": group, "load": os.getloadavg()[0], "at": round(time.time(), 1)}
    with open(log, "a") as f:
        f.write(json.dumps(line) + "\n")


def pytest_configure(config: Any) -> None:
    if config.getoption("--times-log", default=None):
        LOG_PATH["path"] = str(Path(config.getoption("--times-log")).resolve())


# ----------------------------------------------------------------------------- the report


def read_log(path: Path) -> dict[str, tuple[float, str, str]]:
    """Node id -> (seconds over its phases, marker group, worst outcome); a test run twice counts its last run."""
    seconds: dict[str, float] = defaultdict(float)
    group: dict[str, str] = {}
    outcome: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = json.loads(raw)
        node = line["nodeid"]
        if line["when"] == "setup":  # a new run of this test: forget an earlier one
            seconds[node], outcome[node] = 0.0, "passed"
        seconds[node] += line["seconds"]
        group[node] = line["group"]
        if line["outcome"] != "passed" and not (line["outcome"] == "skipped" and line["when"] != "setup"):
            outcome[node] = "failed" if line["outcome"] == "failed" else line["outcome"]
    return {node: (seconds[node], group[node], outcome.get(node, "passed")) for node in seconds}


def by_group(cases: dict[str, tuple[float, str, str]]) -> dict[str, tuple[int, float]]:
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for seconds, group, _ in cases.values():
        totals[group][0] += 1
        totals[group][1] += seconds
    return {g: (int(totals[g][0]), totals[g][1]) for g in GROUPS if g in totals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="the JSON lines `--times-log` wrote")
    parser.add_argument("--compare", type=Path, help="an earlier run's log: per-marker figures side by side")
    parser.add_argument("--files", type=int, default=40, help="how many files to list, slowest first")
    parser.add_argument("--top", type=int, default=25, help="how many tests to list, slowest first")
    args = parser.parse_args()
    cases = read_log(args.log)
    total = sum(seconds for seconds, _, _ in cases.values())
    failed = sorted(n for n, (_, _, outcome) in cases.items() if outcome == "failed")
    skipped = sorted(n for n, (_, _, outcome) in cases.items() if outcome == "skipped")
    print(f"{len(cases)} tests, {total / 60:.1f} min of test time, {len(failed)} failed, {len(skipped)} skipped\n")

    now = by_group(cases)
    before = by_group(read_log(args.compare)) if args.compare else {}
    header = "| marker | tests | minutes | share |"
    print(header + (" before: tests | before: minutes |" if args.compare else ""))
    print("| --- | ---: | ---: | ---: |" + (" ---: | ---: |" if args.compare else ""))
    for group in (g for g in GROUPS if g in now or g in before):
        count, seconds = now.get(group, (0, 0.0))
        row = f"| {group} | {count} | {seconds / 60:.1f} | {seconds / total:.0%} |"
        if args.compare:
            old_count, old_seconds = before.get(group, (0, 0.0))
            row += f" {old_count} | {old_seconds / 60:.1f} |"
        print(row)

    files: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for nodeid, (seconds, _, _) in cases.items():
        files[nodeid.split("::")[0]][0] += 1
        files[nodeid.split("::")[0]][1] += seconds
    print(f"\n| file (slowest {args.files}) | tests | seconds |\n| --- | ---: | ---: |")
    for name, (count, seconds) in sorted(files.items(), key=lambda kv: -kv[1][1])[: args.files]:
        print(f"| {name} | {int(count)} | {seconds:.0f} |")

    print(f"\n| test (slowest {args.top}) | marker | seconds |\n| --- | --- | ---: |")
    for nodeid, (seconds, group, _) in sorted(cases.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"| {nodeid} | {group} | {seconds:.0f} |")
    for nodeid in failed:
        print(f"failed: {nodeid}")


if __name__ == "__main__":
    main()
