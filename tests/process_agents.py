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


@ag.rollout
def unchanged_calc(task: dict) -> float:
    """A calc agent written for OpenAI, unchanged: `OpenAI()` with no arguments, a hosted model's name."""
    from openai import OpenAI

    messages = [{"role": "system", "content": "Reply with 'Answer: <number>'."},
                {"role": "user", "content": "What is 23 + 14?"}, {"role": "assistant", "content": "Answer: 37"},
                {"role": "user", "content": task["question"]}]
    reply = OpenAI().chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=8, temperature=1.0)
    text = reply.choices[0].message.content or ""
    digits = "".join(c for c in text if c.isdigit())
    return 1.0 / (1.0 + abs(int(digits) - task["answer"])) if digits else 0.0


@ag.rollout
def exits_hard(task: dict) -> float:
    """Leaves the interpreter without a trace: no exception to catch (`os._exit`), or a segfault."""
    ag.emit_message("about to go")
    if task.get("segfault"):
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    os._exit(task.get("code", 7))


@ag.rollout
async def interrupts(task: dict) -> float:
    """Raises what a Ctrl+C would, or exits, from async code (`task['raise']`: 'interrupt' or 'exit')."""
    if task["raise"] == "interrupt":
        raise KeyboardInterrupt("agent pressed Ctrl+C")
    raise SystemExit(3)


@ag.rollout
def rewards_in_a_process(task: dict) -> float:
    ag.emit_message(f"pid {os.getpid()}")
    return float(task["n"])


@ag.rollout
def hangs(task: dict) -> float:
    ag.emit_message("hanging")
    time.sleep(task.get("seconds", 60))
    return 1.0


@ag.rollout
def unchanged_anthropic_calc(task: dict) -> float:
    """The calc agent written on Anthropic's SDK, unchanged: `Anthropic()` with no arguments, a hosted model's name."""
    from anthropic import Anthropic

    messages = [{"role": "user", "content": "What is 23 + 14?"}, {"role": "assistant", "content": "Answer: 37"},
                {"role": "user", "content": task["question"]}]
    reply = Anthropic().messages.create(model="claude-haiku-4-5", system="Reply with 'Answer: <number>'.",
                                        messages=messages, max_tokens=8, temperature=1.0)  # type: ignore[arg-type]
    text = "".join(block.text for block in reply.content if block.type == "text")
    digits = "".join(c for c in text if c.isdigit())
    return 1.0 / (1.0 + abs(int(digits) - task["answer"])) if digits else 0.0


@ag.rollout
def asks_llm(task: dict, llm: ag.LLM) -> float:
    """Calls its LLM resource as any agent would (`base_url`, `api_key`), and notes the URL it was handed."""
    from openai import OpenAI

    ag.emit_message(llm.base_url)
    reply = OpenAI(base_url=llm.base_url, api_key=llm.api_key).chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["q"]}]
    )
    return 1.0 if reply.choices[0].message.content == f"echo: {task['q']}" else 0.0
