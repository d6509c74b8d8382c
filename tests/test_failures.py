"""Failed rollouts are reported on the console with their errors, never as a bare accuracy."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

import agentgrad as ag
from agentgrad.store import SqliteStore


@ag.rollout
def flaky_agent(task: dict) -> float:
    if task["n"] % 2:
        raise ValueError(f"tool 'lookup' is not defined (task {task['n'] % 4})")
    return 1.0


@ag.rollout
def needs_llm(task: dict, llm: ag.LLM) -> float:
    return 1.0


@pytest.fixture
def console() -> Console:
    return Console(file=io.StringIO(), width=200)


def test_a_batch_with_failures_prints_how_many_failed_and_the_most_frequent_errors(console: Console) -> None:
    ag.Trainer(n_runners=2, store="memory", console=console).dev(flaky_agent, [{"n": n} for n in range(12)])
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert "6 of 12 train rollouts failed:" in printed
    # six failures, two distinct messages, each counted once per occurrence and printed once
    assert "3× ValueError: tool 'lookup' is not defined (task 3)" in printed
    assert "3× ValueError: tool 'lookup' is not defined (task 1)" in printed
    assert "see them with" not in printed


def test_a_batch_where_every_rollout_failed_says_so_and_names_the_command_that_lists_them(
    tmp_path: Path, console: Console
) -> None:
    store = SqliteStore(tmp_path / "run.db")
    results = ag.Trainer(store=store, console=console).fit(needs_llm, [{"n": n} for n in range(4)])  # dev() would serve the local model
    assert results["train"].succeeded == 0
    printed = console.file.getvalue()  # type: ignore[attr-defined]
    assert "every one of the 4 train rollouts failed:" in printed
    assert "4× AgentError:" in printed and "give one: Trainer(resources={'llm': ag.LLM(...)})" in printed
    assert f"agentgrad rollouts ls --store {tmp_path / 'run.db'} --status failed" in printed
