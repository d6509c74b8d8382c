"""Agents that Ray runner actors in the tests import by module and name."""

from __future__ import annotations

import os
import time
from pathlib import Path

from openai import OpenAI

import agentgrad as ag


@ag.rollout
def even_length(task: dict, llm: ag.LLM) -> float:
    """Asks the model anything; rewards an even-length answer (a tiny random model's signal to learn from)."""
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key or "none")
    answer = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["q"]}],
                                            **llm.sampling_parameters)
    return float(len(answer.choices[0].message.content or "") % 2 == 0)


@ag.rollout
def hangs_on_first_attempt(task: dict, rollout: ag.Rollout) -> float:
    """The task marked `hang` writes its pid to `started` and never returns on its first attempt; every
    finished attempt appends a line to `finished`."""
    if task.get("hang") and rollout.num_attempts == 1:
        Path(task["started"]).write_text(str(os.getpid()))
        while True:
            time.sleep(0.05)  # until its process is killed
    with open(task["finished"], "a") as out:
        out.write(f"{rollout.rollout_id}\n")
    return 1.0


class RunnerLog(ag.Hook):
    """Appends, for each rollout a runner starts, the runner's worker id and process id to `path`."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_rollout_start(self, *, agent: ag.LitAgent, runner: ag.Runner, rollout: ag.Rollout) -> None:
        with open(self.path, "a") as out:
            out.write(f"{runner.worker_id} {os.getpid()}\n")


@ag.rollout
def writes_its_pid(task: dict) -> float:
    """Appends the process id the agent runs in to `task['pids']`."""
    with open(task["pids"], "a") as out:
        out.write(f"{os.getpid()}\n")
    return 1.0
