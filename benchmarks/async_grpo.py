"""Synchronous vs asynchronous GRPO (`max_staleness=1`): on the calculator agent, and on the same agent
with a tool that takes 2 s per call (a wait on an external service).

    .venv/bin/python benchmarks/async_grpo.py [--steps 12] [--prompts 8] [--group 8] [--val 256] [--runs 2]
                                              [--tool-seconds 2] [--agents calc,slow] [--out results.jsonl]
                                              [--val-every K] [--curves DIR]

Each run is its own process (one model in memory at a time), in interleaved order (for each run: each
agent: sync then async), so a busy machine slows both modes alike. A run trains SmolLM2 through runners
→ gateway → engine exactly as the demo does, with greedy validation on `--val` held-out problems before
the first step and after the last. It prints, per run: steps per hour (from the start of the first step to
the end of the last, so model loading and the first validation are left out, and an asynchronous run's
first step, which samples the second's rollouts too, is counted), final held-out accuracy, staleness
(mean, max, groups dropped), the largest importance weight, and wall time; then one line per step
(seconds since the run began, train accuracy). With `--val-every K` the held-out accuracy is also
measured every K steps; each run's held-out accuracy against the wall-clock time since it began goes
to `DIR/<agent>-<mode>-run<n>.csv` (step, wall_s, val_accuracy), and all runs' curves, sync and async
side by side per agent, to one `DIR/async_grpo_curve.png`. Then the seconds per step of each phase (the
trainer waiting for rollouts, the update, the publish, validation, the tool's wait, decoding, idle runners:
benchmarks/async_phases.py) and the speedup those phases allow when the decode and the update share the cores.

The configuration: 2 runners, each running a whole step's rollouts at once (`runner_concurrency`), because a
rollout waiting on an external service costs nothing to run beside others, and a user would let all of a step's
waits run together rather than one after another; fewer slots would make the synchronous baseline wait longer
than it needs to. The tool: `--tool-seconds` (2 s) once per rollout, before its model call.

Where asynchronous pays: a step's rollouts that wait on the world (the 2 s tool) run during the previous
step's update. On the compute-bound demo, rollouts and update share the same CPU cores, so there is
little to overlap on a 2-core machine: only the gaps (queueing, the gateway, Python) are hidden.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from async_phases import PHASES, StepClock, as_dicts, mean_phases, speedup_bound, step_phases

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
    held_out: list[tuple[int, float, float]] = []  # (step, seconds since fit began, held-out accuracy)
    clocks: dict[int, StepClock] = {}  # when each step's metrics and validation were logged (epoch, as the store's)

    class Timed(GRPO):
        async def log_metrics(self, step: int, values: Any) -> None:
            if "perf/step_seconds" in values:
                marks.append((step, time.perf_counter() - began, values["train/accuracy"]))
                clocks[step] = StepClock(step, time.time())
            if "val/accuracy" in values:
                held_out.append((step, time.perf_counter() - began, values["val/accuracy"]))
                # after a step: when its validation ended; before the first step: when training began
                clocks[step] = (
                    replace(clocks[step], validated=time.time()) if step in clocks else StepClock(step, time.time())
                )
            await super().log_metrics(step, values)

    asynchronous = settings["mode"] == "async"
    config = GRPOConfig(
        steps=settings["steps"],
        prompts_per_step=settings["prompts"],
        group_size=settings["group"],
        max_tokens=settings["max_tokens"],
        val_every=settings["val_every"],
        seed=settings["seed"],
        max_staleness=1 if asynchronous else None,
    )
    concurrency = settings["prompts"] * settings["group"]  # a whole step's rollouts at once, two under async
    with tempfile.TemporaryDirectory() as store_dir:
        began = time.perf_counter()
        trainer = ag.Trainer(
            Timed(config, local_engine=engine), n_runners=2, runner_concurrency=concurrency, store=f"{store_dir}/s.db"
        )
        result = trainer.fit(agent, train, val)
        wall = time.perf_counter() - began
        phases = asyncio.run(step_phases(trainer.store, result.history, [clocks[s] for s in sorted(clocks)]))
    # from the first step's start (the held-out run before it ended) to the last step's end: an asynchronous run
    # samples its first two steps together, so counting from the first step's end would leave out a step's rollouts
    span = marks[-1][1] - held_out[0][1]
    history = result.history
    print(
        json.dumps(
            {
                **settings,
                "steps_per_hour": len(marks) / span * 3600 if span > 0 else float("nan"),
                "initial_accuracy": result.initial.success_rate if result.initial else float("nan"),
                "final_accuracy": result.final.success_rate if result.final else float("nan"),
                "staleness_mean": statistics.fmean(h.get("async/staleness_mean", 0.0) for h in history),
                "staleness_max": max(h.get("async/staleness_max", 0.0) for h in history),
                "dropped_groups": sum(h.get("async/dropped_groups", 0.0) for h in history),
                "is_weight_max": max(h.get("train/is_weight_max", 1.0) for h in history),
                "wall_s": wall,
                "load": os.getloadavg()[0],
                "curve": [(step, round(t, 1), acc) for step, t, acc in marks],
                "held_out": [(step, round(t, 1), acc) for step, t, acc in held_out],
                "phases": as_dicts(phases),
            }
        ),
        flush=True,
    )


def write_curves(rows: list[dict[str, Any]], directory: Path) -> Path:
    """Each run's held-out accuracy against wall time as a CSV, and all of them in one PNG (a panel per agent)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    agents = list(dict.fromkeys(r["agent"] for r in rows))
    figure, axes = plt.subplots(1, len(agents), figsize=(6 * len(agents), 4), squeeze=False)
    for row in rows:
        name = f"{row['agent']}-{row['mode']}-run{row['seed']}"
        with (directory / f"{name}.csv").open("w") as file:
            file.write("step,wall_s,val_accuracy\n")
            file.writelines(f"{step},{t},{acc}\n" for step, t, acc in row["held_out"])
        axis = axes[0][agents.index(row["agent"])]
        axis.plot(
            [t for _, t, _ in row["held_out"]],
            [acc for _, _, acc in row["held_out"]],
            marker="o",
            linestyle="-" if row["mode"] == "sync" else "--",
            color="tab:blue" if row["mode"] == "sync" else "tab:orange",
            label=f"{row['mode']} (seed {row['seed']})",
        )
    for agent, axis in zip(agents, axes[0]):
        wait = f", {rows[0]['tool_seconds']:g} s tool" if agent == "slow" else ""
        axis.set_title(f"{agent}{wait}: {rows[0]['prompts']}x{rows[0]['group']} per step, {rows[0]['val']} held out")
        axis.set_xlabel("wall time since the run began (s)")
        axis.set_ylabel("held-out accuracy (greedy)")
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    png = directory / "async_grpo_curve.png"
    figure.savefig(png, dpi=100)
    plt.close(figure)
    return png


def print_phases(rows: list[dict[str, Any]], agents: list[str]) -> None:
    """Each agent's and mode's mean phase times per step (benchmarks/async_phases.py), then the bound on the speedup
    that the synchronous phases allow and the measured one."""
    print("\nseconds per step (means over runs and steps):")
    print("agent mode  " + " ".join(f"{name:>12}" for name in PHASES))
    for agent in agents:
        means = {}
        for mode in ("sync", "async"):
            means[mode] = mean_phases([r["phases"] for r in rows if r["agent"] == agent and r["mode"] == mode])
            print(f"{agent:5} {mode:5} " + " ".join(f"{means[mode][name]:12.1f}" for name in PHASES))
        measured = means["sync"]["interval"] / means["async"]["interval"]
        print(
            f"{agent:5} async/sync from the intervals: {measured:.2f}x; bound when decode and update share the "
            f"cores (only the tool's wait overlaps): {speedup_bound(means['sync']):.2f}x"
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
    parser.add_argument("--val-every", type=int, default=0, help="held-out accuracy every K steps (0: first and last)")
    parser.add_argument("--curves", type=Path, default=Path("async-grpo-curves"), help="where the CSVs and PNG go")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.val < 1:
        parser.error("--val must be at least 1: the held-out run before the first step marks when training begins")
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
                    "val_every": args.val_every,
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
                print(
                    "      held out (step, s, acc):    " + " ".join(f"{s}:{t}:{a:.3f}" for s, t, a in row["held_out"])
                )
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
        sync, asyn = (
            [r["steps_per_hour"] for r in rows if r["agent"] == agent and r["mode"] == m] for m in ("sync", "async")
        )
        print(f"{agent:5} async/sync steps per hour: {statistics.fmean(asyn) / statistics.fmean(sync):.2f}x")
    print_phases(rows, args.agents.split(","))
    print(f"\nheld-out accuracy against wall time: {write_curves(rows, args.curves)} (and one CSV per run beside it)")


if __name__ == "__main__":
    main()
