"""Synchronous vs asynchronous GRPO (`max_staleness=1`): on the calculator agent, and on the same agent
with a tool that takes 2 s per call (a wait on an external service).

    .venv/bin/python benchmarks/async_grpo.py [--steps 12] [--prompts 8] [--group 8] [--val 256] [--runs 2]
                                              [--tool-seconds 2] [--agents calc,slow] [--out results.jsonl]

Each run is its own process (one model in memory at a time), in interleaved order (for each run: each
agent: sync then async), so a busy machine slows both modes alike. A run trains SmolLM2 through runners
→ gateway → engine exactly as the demo does, with greedy validation on `--val` held-out problems before
the first step and after the last. It prints, per run: steps per hour (between the ends of the first
and last steps, so model loading and validation are left out), final held-out accuracy, staleness
(mean, max, groups dropped), the largest importance weight, and wall time; then one line per step
(seconds since the run began, train accuracy), the curve of accuracy against wall time.

Where asynchronous pays: a step's rollouts that wait on the world (the 2 s tool) run during the previous
step's update. On the compute-bound demo, rollouts and update share the same CPU cores, so there is
little to overlap on a 2-core machine: only the gaps (queueing, the gateway, Python) are hidden.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def child(settings: dict[str, Any]) -> None:
    """One training run at `settings`; prints one JSON line of figures."""
    import tempfile

    import agentgrad as ag
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.cli.demo import load_calc_example
    from agentgrad.engine import Engine

    calc = load_calc_example()
    tool_seconds = settings["tool_seconds"] if settings["agent"] == "slow" else 0.0

    @ag.rollout
    def agent(task: dict[str, Any], llm: ag.LLM) -> float:
        """The demo's agent, first looking the question up in a service that answers after `tool_seconds`."""
        time.sleep(tool_seconds)  # the external service's latency (what the rollout waits on)
        return float(calc.calc_agent.function(task, llm))

    train, val = calc.make_splits(n_train=2000, n_val=settings["val"], seed=0)
    engine = Engine()
    marks: list[tuple[int, float, float]] = []  # (step, seconds since fit began, train accuracy)

    class Timed(GRPO):
        async def log_metrics(self, step: int, values: Any) -> None:
            if "perf/step_seconds" in values:
                marks.append((step, time.perf_counter() - began, values["train/accuracy"]))
            await super().log_metrics(step, values)

    asynchronous = settings["mode"] == "async"
    config = GRPOConfig(
        steps=settings["steps"],
        prompts_per_step=settings["prompts"],
        group_size=settings["group"],
        max_tokens=settings["max_tokens"],
        val_every=0,
        seed=settings["seed"],
        max_staleness=1 if asynchronous else None,
    )
    concurrency = settings["prompts"] * settings["group"]  # a whole step's rollouts at once, two under async
    with tempfile.TemporaryDirectory() as store_dir:
        began = time.perf_counter()
        result = ag.Trainer(
            Timed(config, local_engine=engine), n_runners=2, runner_concurrency=concurrency, store=f"{store_dir}/s.db"
        ).fit(agent, train, val)
        wall = time.perf_counter() - began
    span = marks[-1][1] - marks[0][1]
    history = result.history
    print(
        json.dumps(
            {
                **settings,
                "steps_per_hour": (len(marks) - 1) / span * 3600 if span > 0 else float("nan"),
                "initial_accuracy": result.initial.success_rate if result.initial else float("nan"),
                "final_accuracy": result.final.success_rate if result.final else float("nan"),
                "staleness_mean": statistics.fmean(h.get("async/staleness_mean", 0.0) for h in history),
                "staleness_max": max(h.get("async/staleness_max", 0.0) for h in history),
                "dropped_groups": sum(h.get("async/dropped_groups", 0.0) for h in history),
                "is_weight_max": max(h.get("train/is_weight_max", 1.0) for h in history),
                "wall_s": wall,
                "load": os.getloadavg()[0],
                "curve": [(step, round(t, 1), acc) for step, t, acc in marks],
            }
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--val", type=int, default=256, help="held-out problems (>= 256 to judge accuracy)")
    parser.add_argument("--runs", type=int, default=2, help="runs of each mode per agent (seed = run index)")
    parser.add_argument("--tool-seconds", type=float, default=2.0)
    parser.add_argument("--agents", default="calc,slow", help="calc: the demo's agent; slow: with the 2 s tool")
    parser.add_argument("--out", type=Path, help="also append each run's JSON line here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    rows = []
    for run in range(args.runs):
        for agent in args.agents.split(","):
            for mode in ("sync", "async"):
                settings = {
                    "agent": agent,
                    "mode": mode,
                    "seed": run,
                    "steps": args.steps,
                    "prompts": args.prompts,
                    "group": args.group,
                    "max_tokens": args.max_tokens,
                    "val": args.val,
                    "tool_seconds": args.tool_seconds,
                }
                done = subprocess.run(
                    [sys.executable, __file__, "--child", json.dumps(settings)],
                    cwd=HERE,
                    capture_output=True,
                    text=True,
                    env={**os.environ, "PYTHONPATH": str(HERE)},
                )
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                if done.returncode or not lines:
                    raise SystemExit(f"{agent}/{mode} run {run} failed:\n{done.stderr[-3000:]}")
                row = json.loads(lines[-1])
                rows.append(row)
                print(
                    f"{agent:5} {mode:5} seed {run}: {row['steps_per_hour']:7.0f} steps/h  held-out "
                    f"{row['initial_accuracy']:.3f} -> {row['final_accuracy']:.3f}  staleness mean "
                    f"{row['staleness_mean']:.2f} max {row['staleness_max']:.0f} dropped {row['dropped_groups']:.0f}  "
                    f"IS max {row['is_weight_max']:.2f}  wall {row['wall_s']:.0f} s  load {row['load']:.1f}",
                    flush=True,
                )
                print("      curve (step, s, train acc): " + " ".join(f"{s}:{t}:{a:.2f}" for s, t, a in row["curve"]))
                if args.out:
                    with args.out.open("a") as file:
                        file.write(json.dumps(row) + "\n")
    print("\nagent mode   steps/h  final held-out  staleness  wall s  (means over runs)")
    for agent in args.agents.split(","):
        for mode in ("sync", "async"):
            mine = [r for r in rows if r["agent"] == agent and r["mode"] == mode]
            print(
                f"{agent:5} {mode:5} {statistics.fmean(r['steps_per_hour'] for r in mine):8.0f} "
                f"{statistics.fmean(r['final_accuracy'] for r in mine):15.3f} "
                f"{statistics.fmean(r['staleness_mean'] for r in mine):10.2f} "
                f"{statistics.fmean(r['wall_s'] for r in mine):7.0f}"
            )
        sync, asyn = ([r["steps_per_hour"] for r in rows if r["agent"] == agent and r["mode"] == m] for m in ("sync", "async"))
        print(f"{agent:5} async/sync steps per hour: {statistics.fmean(asyn) / statistics.fmean(sync):.2f}x")


if __name__ == "__main__":
    main()
