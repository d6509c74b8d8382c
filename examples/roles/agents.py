"""A solver and a verifier on three-digit additions: an ordinary two-agent program with the `openai` client.

The solver answers (`Answer: <number>`), writing `calculate: <expression>` when it wants the calculator
(the text protocol of `examples/calc_agent.py`, `tool` task). The verifier sees the problem and the
solver's answer, checks it by difference with the same calculator (`calculate: 123 + 456 - 589`, shown in its
examples), and says `Verdict: correct` or `Verdict: wrong`; a wrong verdict sends the answer back to the solver
once (its new answer, if it gives one, is final). `solve` and `verify` know nothing of training: each
gets an OpenAI client whose base URL names its agent (`llm.for_agent("solver")`, a gateway route), which is
how `GRPOConfig(roles=...)` trains one LoRA adapter per role.

Two kinds of task: `solve` runs both agents; `check` hands the verifier a fixed proposed answer (right
for half the tasks, off by a typical slip for the other half), so it is judged on a known mix whatever the
solver does.

The grader (`grade`) rewards the solver 1 for a correct final answer, and the verifier 1 for a correct verdict on
a check task, as one reward with a dimension per role, returned by the rollout (`return {"solver": ...,
"verifier": ...}`, the first key the rollout's reward): under `roles=` each role trains on its own dimension,
and one shared policy trains on the first alone. The verifier is not graded on solve tasks (a constant
`UNGRADED`, which GRPO skips as a group of equal rewards): there the right verdict is mostly "wrong" while the
solver is weak, and paying it taught the verifier to reject everything (measured: see `grade`).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from openai import OpenAI

import agentgrad as ag
from examples.calc_agent import CALCULATE, build_messages, calculate, client_for, make_tasks, parse_answer

SOLVER, VERIFIER = "solver", "verifier"
ROLES = {SOLVER: f"^{SOLVER}$", VERIFIER: f"^{VERIFIER}$"}
"""`GRPOConfig(roles=ROLES)`: each role trains the calls of the agent of its name."""
MAX_TURNS = 3  # model calls per answer or verdict: a calculator round, its result, the reply
VERIFIER_PROMPT = (
    "Check the proposed answer to the problem. Use the calculator: 'calculate: <problem> - <proposed answer>'. "
    "If the result is 0 reply 'Verdict: correct', otherwise 'Verdict: wrong'."
)
VERIFIER_EXAMPLES: list[dict[str, Any]] = [
    {"role": "user", "content": "Problem: What is 23 + 14?\nProposed answer: 37"},
    {"role": "assistant", "content": "calculate: 23 + 14 - 37"},
    {"role": "user", "content": "Result: 0"},
    {"role": "assistant", "content": "Verdict: correct"},
    {"role": "user", "content": "Problem: What is 123 + 456?\nProposed answer: 589"},
    {"role": "assistant", "content": "calculate: 123 + 456 - 589"},
    {"role": "user", "content": "Result: -10"},
    {"role": "assistant", "content": "Verdict: wrong"},
    {"role": "user", "content": "Problem: What is 208 + 315?\nProposed answer: 523"},
    {"role": "assistant", "content": "calculate: 208 + 315 - 523"},
    {"role": "user", "content": "Result: 0"},
    {"role": "assistant", "content": "Verdict: correct"},
]
"""Three worked checks by difference: the calculator gives the proposed answer's error, so the verdict rests on one
short number (0 or not) rather than on comparing two four-digit ones. The base model copies the calculator line
but then says `correct` whatever the result (greedy, 64 of 64 held-out checks); that mapping is what GRPO teaches.
With the first protocol (`calculate: <problem>`, then compare the result with the proposed answer) the verifier
did not learn in six steps: it went from accepting every answer to rejecting every one."""
SEND_BACK = "A checker says this answer is wrong. Work it out again and give the final 'Answer: <number>'."
VERDICT = re.compile(r"Verdict:\s*(correct|incorrect|wrong)", re.IGNORECASE)
UNGRADED = 0.0
"""The verifier's reward on solve tasks: the same for every rollout of a task, so its group teaches it nothing."""
SLIPS = (-100, -10, -1, 1, 10, 100)
"""How a wrong proposed answer differs from the sum: a digit off by one, the small model's typical error."""


def ask(client: OpenAI, model: str, messages: list[dict[str, Any]], sampling: dict[str, Any]) -> str:
    """Run one answer to its end: each `calculate:` line gets its result back, up to `MAX_TURNS` calls."""
    reply = ""
    for turn in range(MAX_TURNS):
        response = client.chat.completions.create(model=model, messages=messages, **sampling)
        reply = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        tool = CALCULATE.search(reply)
        if tool is None or parse_answer(reply) is not None or VERDICT.search(reply) or turn == MAX_TURNS - 1:
            break
        messages.append({"role": "user", "content": f"Result: {calculate(tool.group(1))}"})
    return reply


def solve(client: OpenAI, model: str, messages: list[dict[str, Any]], sampling: dict[str, Any]) -> int | None:
    """The solver: its answer to the last question of `messages` (which grows by its turns)."""
    return parse_answer(ask(client, model, messages, sampling))


def verify(client: OpenAI, model: str, question: str, proposed: int | None, sampling: dict[str, Any]) -> bool | None:
    """The verifier: True (correct), False (wrong), or None when it gave no verdict."""
    shown = "none" if proposed is None else str(proposed)
    messages = [
        {"role": "system", "content": VERIFIER_PROMPT},
        *VERIFIER_EXAMPLES,
        {"role": "user", "content": f"Problem: {question}\nProposed answer: {shown}"},
    ]
    verdict = VERDICT.search(ask(client, model, messages, sampling))
    return None if verdict is None else verdict.group(1).lower() == "correct"


@dataclass(frozen=True)
class Outcome:
    """What happened in one run of the program, for the grader."""

    first: int | None  # the solver's first answer (the proposed one in a check task)
    verdict: bool | None  # the verifier's on it
    final: int | None  # the solver's answer after a send-back (else the first); None in a check task


def run_program(
    task: dict[str, Any], solver: OpenAI, verifier: OpenAI, model: str, sampling: dict[str, Any]
) -> Outcome:
    """The two-agent program: solve, verify, and on a wrong verdict solve once more."""
    if task["kind"] == "check":
        return Outcome(task["proposed"], verify(verifier, model, task["question"], task["proposed"], sampling), None)
    messages = build_messages(task["question"], "tool")
    first = solve(solver, model, messages, sampling)
    verdict = verify(verifier, model, task["question"], first, sampling)
    if verdict is not False:
        return Outcome(first, verdict, first)
    messages.append({"role": "user", "content": SEND_BACK})
    second = solve(solver, model, messages, sampling)
    return Outcome(first, verdict, first if second is None else second)  # no new answer: the first one stands


def grade(task: dict[str, Any], outcome: Outcome) -> dict[str, float]:
    """The task's grader, per role: the solver 1 for a correct final answer (solve tasks), the verifier 1 for a
    correct verdict (check tasks, half of them right). The solver's dimension comes first: the rollout's reward.

    On solve tasks the verifier gets `UNGRADED` whatever it says. Graded there too, it saw mostly wrong answers
    from the untrained solver, so "wrong" paid far more often than "correct", and within four steps it rejected
    every answer (check tasks included), sending the solver's right answers back to be spoiled."""
    verdict_right = float(outcome.verdict is not None and outcome.verdict == (outcome.first == task["answer"]))
    if task["kind"] == "check":
        return {VERIFIER: verdict_right}
    return {SOLVER: float(outcome.final == task["answer"]), VERIFIER: UNGRADED}


@ag.rollout
def solver_and_verifier(task: dict[str, Any], llm: ag.LLM) -> dict[str, float]:
    """One rollout: the program, then its grades as one reward with a dimension per role (the first the primary)."""
    solver, verifier = client_for(llm.for_agent(SOLVER)), client_for(llm.for_agent(VERIFIER))
    return grade(task, run_program(task, solver, verifier, llm.model, dict(llm.sampling_parameters)))


def make_splits(
    n_train: int = 400, n_val: int = 64, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Disjoint train and held-out tasks, half `solve` and half `check` in each (`n_val` of each kind held out);
    half the check tasks propose the right sum, the others a slip (`SLIPS`)."""
    rng = random.Random(seed)
    val = make_tasks(2 * n_val, seed + 1, digits=3, demo="tool")
    train = make_tasks(n_train, seed, digits=3, demo="tool", exclude={(t["a"], t["b"]) for t in val})

    def mixed(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
        half = len(tasks) // 2
        checks = [
            {**t, "kind": "check", "proposed": t["answer"] + (0 if i % 2 == 0 else rng.choice(SLIPS))}
            for i, t in enumerate(tasks[half:])
        ]
        solves = [{**t, "kind": "solve"} for t in tasks[:half]]
        return [task for pair in zip(solves, checks) for task in pair]  # interleaved: every batch holds both kinds

    return mixed(train), mixed(val)
