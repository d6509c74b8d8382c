"""The GRPO demo with its runners on a second host, against the same run with them on this one.

Both runs train the calculator agent (`examples/calc_agent.py`, the demo's `plain` task) on SmolLM2 with the
same GRPO settings and seed, their store in one PostgreSQL server (a throwaway one, `tests/postgres_server.py`).
- one host: `Trainer(n_runners=R)`: runner threads beside the algorithm, everything on loopback;
- second host: the runners are `agentgrad runner` processes in a network namespace (`tests/netns.py`: its own
  address, no shared loopback), joined through an `agentgrad serve` on the same database, bound to this side's
  address of the link; the trainer starts no runner (`n_runners=0`), binds its gateway to that address and
  publishes the LLM resource under it (`host=`, `token=`), so the agents' calls cross the link.

Printed: each run's greedy accuracy on the held-out problems before and after, its minutes, and where its
rollouts ran. Needs root (network namespaces), `make postgres` and the model (`make model`).

    .venv/bin/python benchmarks/hosts_apart_grpo.py                 # 4 steps of 4 tasks x 4, 64 held out
    .venv/bin/python benchmarks/hosts_apart_grpo.py --steps 10 --val-size 128
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TOKEN = "hosts-apart-demo-token"


def grpo(args: argparse.Namespace, checkpoints: Path) -> Any:
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.engine import Engine

    config = GRPOConfig(
        steps=args.steps,
        val_every=args.steps,
        micro_batch_size=8,
        checkpoint_dir=str(checkpoints),
        checkpoint_every=args.steps,
        prompts_per_step=args.prompts,
        group_size=args.group,
        seed=args.seed,
    )
    return GRPO(config, local_engine=Engine(args.model))


def where_they_ran(store_url: str) -> dict[str, int]:
    """Rollouts by the worker that ran their last attempt's prefix (runner threads: `runner-N`; runner processes:
    host name and pid)."""
    from agentgrad.store import open_store

    async def count() -> dict[str, int]:
        store = open_store(store_url)
        by: dict[str, int] = {}
        for rollout in await store.query_rollouts():
            attempts = await store.query_attempts(rollout.rollout_id)
            if attempts:
                worker = (attempts[-1].worker_id or "?").rsplit("-", 1)[0]
                by[worker] = by.get(worker, 0) + 1
        await store.close()
        return by

    return asyncio.run(count())


def one_host(args: argparse.Namespace, store_url: str, folder: Path, train: Any, val: Any, agent: Any) -> Any:
    import agentgrad as ag

    trainer = ag.Trainer(grpo(args, folder / "one"), n_runners=args.runners, runner_concurrency=16, store=store_url)
    return trainer.fit(agent, train, val)


def second_host(args: argparse.Namespace, store_url: str, folder: Path, train: Any, val: Any, agent: Any) -> Any:
    import agentgrad as ag
    from agentgrad.serving import free_port
    from tests.helpers import healthy, wait_until
    from tests.netns import second_host as make_second_host

    env = {**os.environ, "AGENTGRAD_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    with make_second_host() as host:
        port = free_port(host.here)
        url = f"http://{host.here}:{port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "agentgrad.cli", "serve", "--store", store_url, "--host", host.here,
             "--port", str(port), "--token", TOKEN],
            env=env, stdout=subprocess.DEVNULL,
        )
        runners = []
        try:
            wait_until(lambda: healthy(url), "the store server for the second host")
            runners = [
                host.run(sys.executable, "-m", "agentgrad.cli", "runner", "--store", url, "--agent",
                         "examples.calc_agent:calc_agent", "--workers", "16", env=env, cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(args.runners)
            ]
            trainer = ag.Trainer(grpo(args, folder / "two"), n_runners=0, store=store_url, host=host.here,
                                 token=TOKEN)
            return trainer.fit(agent, train, val)
        finally:  # the runners first: they finish what is in flight through the store server
            for group in (runners, [server]):
                for process in group:
                    process.terminate()
                for process in group:
                    try:
                        process.wait(30)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4, help="tasks per step")
    parser.add_argument("--group", type=int, default=4, help="rollouts per task")
    parser.add_argument("--val-size", type=int, default=64)
    parser.add_argument("--runners", type=int, default=2, help="runners (16 rollouts at once each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="default: smollm2-135m")
    args = parser.parse_args()

    import tempfile

    from agentgrad.cli.demo import load_calc_example
    from tests.postgres_server import PostgresServer

    calc = load_calc_example()
    train, val = calc.make_splits(n_train=2000, n_val=args.val_size, seed=args.seed, demo="plain")
    rows = []
    with PostgresServer() as pg, tempfile.TemporaryDirectory(prefix="hosts-apart-") as scratch:
        for name, run in (("one host", one_host), ("runners on a second host", second_host)):
            store_url = pg.create_database(name.split()[0] + "_run")
            began = time.perf_counter()
            result = run(args, store_url, Path(scratch), train, val, calc.calc_agent)
            minutes = (time.perf_counter() - began) / 60
            rows.append((name, result.initial, result.final, minutes, where_they_ran(store_url)))
            print(f"  rollouts by: {rows[-1][-1]}", flush=True)
            print(f"{name}: {result.initial.success_rate:.3f} -> {result.final.success_rate:.3f} in {minutes:.1f} min",
                  flush=True)
    print(f"\nGRPO, calc agent (plain), {args.steps} steps of {args.prompts} tasks x {args.group}, seed {args.seed}, "
          f"{args.val_size} held out, greedy; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'run':<28}{'accuracy before':>16}{'after':>8}{'reward after':>14}{'minutes':>9}  rollouts by")
    for name, before, after, minutes, by in rows:
        print(f"{name:<28}{before.success_rate:>16.3f}{after.success_rate:>8.3f}{after.reward_mean:>14.3f}"
              f"{minutes:>9.1f}  {by}")


if __name__ == "__main__":
    main()
