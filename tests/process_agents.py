"""Agents that runner processes in the tests import by module and name (`process_agents:slow`)."""

from __future__ import annotations

import os
import signal
import time

import agentgrad as ag

STEPS = 3


@ag.rollout
def square(task: dict) -> float:
    ag.emit_message(f"pid {os.getpid()}")
    return float(task["n"] ** 2)


@ag.rollout
def slow(task: dict) -> float:
    """Takes about `task['seconds']`, writing `STEPS` messages on the way, so each attempt's spans can be counted."""
    for step in range(STEPS):
        time.sleep(task.get("seconds", 0.1) / STEPS)
        ag.emit_message(f"step {step}", step=step)
    return 1.0


@ag.rollout
def dies_once(task: dict, rollout: ag.Rollout) -> float:
    """The task marked `die` kills its runner process on its first attempt."""
    if task.get("die") and rollout.num_attempts == 1:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.05)
    return 1.0


@ag.rollout
def bare_openai(task: dict) -> float:
    """An agent written for plain OpenAI: it builds its client with no arguments, from the environment."""
    from openai import OpenAI

    reply = OpenAI().chat.completions.create(model="policy", messages=[{"role": "user", "content": task["q"]}])
    return 1.0 if reply.choices[0].message.content else 0.0
