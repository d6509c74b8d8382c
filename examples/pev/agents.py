"""A planner, an executor and a verifier on two-step word problems: three agents with the `openai` client.

The planner turns a word problem into one arithmetic expression (`Plan: 4 * 12 - 5`): the step where
planning matters, since the story's order is not the computation's. The verifier checks the plan against
the problem (`Verdict: correct` or `Verdict: wrong`); a wrong verdict sends it back to the planner once.
The executor carries the final plan out with a calculator (`calculate: <expression>`, its `Result:` back)
and answers (`Answer: <number>`). Each agent calls its own gateway route (`llm.for_agent(name)`), so
`GRPOConfig(roles=ROLES)` trains one LoRA adapter per role.

`grade` pays each role for its own job, as one reward with a dimension per role (`answer`, the task's
success, first: the rollout's reward): the planner for a final plan whose value is the answer, the
executor for an answer equal to its plan's value (faithful execution, right plan or not), the verifier for
a verdict that is right about the first plan.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from openai import OpenAI

import agentgrad as ag
from examples.calc_agent import calculate, client_for

PLANNER, EXECUTOR, VERIFIER = "planner", "executor", "verifier"
ROLES = {role: f"^{role}$" for role in (PLANNER, EXECUTOR, VERIFIER)}
"""`GRPOConfig(roles=ROLES)`: each role trains the calls of the agent of its name."""

TEMPLATES = [  # (story, the expression over its numbers)
    ("{name} has {a} boxes of {b} apples and eats {c} apples. How many apples are left?", "{a} * {b} - {c}"),
    ("A shop sells {a} pens on each of {b} days, and {c} more on the last day. How many pens did it sell?",
     "{a} * {b} + {c}"),
    ("{name} had {a} stickers and gave {b} to each of {c} friends. How many stickers are left?", "{a} - {b} * {c}"),
    ("{name} buys {a} bags with {b} marbles each, then loses {c} bags. How many marbles are left?",
     "{a} * {b} - {c} * {b}"),
    ("{name} reads {a} pages in the morning and {b} pages in the evening, for {c} days. How many pages?",
     "({a} + {b}) * {c}"),
]
NAMES = ["Ana", "Ben", "Chen", "Dana", "Eli", "Fay", "Gus", "Hana"]

PLANNER_PROMPT = "Write one arithmetic expression that answers the problem. Reply 'Plan: <expression>'."
PLANNER_EXAMPLES: list[dict[str, str]] = [
    {"role": "user", "content": question} if i % 2 == 0 else {"role": "assistant", "content": f"Plan: {plan}"}
    for question, plan in [
        ("Tom has 3 bags of 10 nuts and eats 4 nuts. How many nuts are left?", "3 * 10 - 4"),
        ("A bakery bakes 6 cakes on each of 4 days, and 5 more on the last day. How many cakes?", "6 * 4 + 5"),
        ("Sam had 30 coins and gave 4 to each of 6 friends. How many coins are left?", "30 - 4 * 6"),
        ("Lia buys 5 boxes with 6 pens each, then loses 2 boxes. How many pens are left?", "5 * 6 - 2 * 6"),
        ("Mia swims 2 laps before lunch and 5 laps after lunch, for 3 days. How many laps?", "(2 + 5) * 3"),
    ]
    for i in range(2)
]
"""Five worked plans, one of each shape the problems take, in other words: the planner maps a problem to the
shape it matches and its numbers into place (SmolLM2 shown two of them planned 0 of 10 held-out problems greedy,
mostly dropping a number)."""
EXECUTOR_PROMPT = ("Carry out the plan with the calculator: write 'calculate: <expression>', then reply "
                   "'Answer: <number>' with its result.")
EXECUTOR_EXAMPLES: list[dict[str, str]] = [
    {"role": "user", "content": "Plan: 3 * 10 - 4"},
    {"role": "assistant", "content": "calculate: 3 * 10 - 4"},
    {"role": "user", "content": "Result: 26"},
    {"role": "assistant", "content": "Answer: 26"},
]
VERIFIER_PROMPT = "Check that the plan computes what the problem asks. Reply 'Verdict: correct' or 'Verdict: wrong'."
VERIFIER_EXAMPLES: list[dict[str, str]] = [
    {"role": "user", "content": "Problem: Tom has 3 bags of 10 nuts and eats 4 nuts. How many nuts are left?\n"
                                "Plan: 3 * 10 - 4"},
    {"role": "assistant", "content": "Verdict: correct"},
    {"role": "user", "content": "Problem: Mia swims 2 laps before lunch and 5 laps after lunch, for 3 days. How many "
                                "laps?\nPlan: 2 + 5 * 3"},
    {"role": "assistant", "content": "Verdict: wrong"},
]
SEND_BACK = "A checker says this plan is wrong. Write a better one: 'Plan: <expression>'."
PLAN = re.compile(r"Plan:\s*([-+*/() \d.]*\d[-+*/() \d.]*)")
CALCULATE = re.compile(r"calculate:\s*([-+*/() \d.]+)", re.IGNORECASE)
ANSWER = re.compile(r"Answer:\s*(-?\d+)")
VERDICT = re.compile(r"Verdict:\s*(correct|wrong)", re.IGNORECASE)


def value_of(expression: str | None) -> int | None:
    """An expression's integer value, or None (no expression, not computable, not a whole number)."""
    if expression is None:
        return None
    result = calculate(expression)
    return int(result) if re.fullmatch(r"-?\d+", result) else None


def ask(client: OpenAI, model: str, messages: list[dict[str, Any]], sampling: dict[str, Any]) -> str:
    response = client.chat.completions.create(model=model, messages=messages, **sampling)
    reply = response.choices[0].message.content or ""
    messages.append({"role": "assistant", "content": reply})
    return reply


def plan(client: OpenAI, model: str, messages: list[dict[str, Any]], sampling: dict[str, Any]) -> str | None:
    """The planner's expression for the last problem of `messages` (which grows by its turn)."""
    found = PLAN.search(ask(client, model, messages, sampling))
    return found.group(1).strip() if found else None


def verify(client: OpenAI, model: str, problem: str, planned: str | None, sampling: dict[str, Any]) -> bool | None:
    """The verifier's verdict on a plan: True (correct), False (wrong), None (none given)."""
    messages = [{"role": "system", "content": VERIFIER_PROMPT}, *VERIFIER_EXAMPLES,
                {"role": "user", "content": f"Problem: {problem}\nPlan: {planned or 'none'}"}]
    verdict = VERDICT.search(ask(client, model, messages, sampling))
    return None if verdict is None else verdict.group(1).lower() == "correct"


def execute(client: OpenAI, model: str, planned: str | None, sampling: dict[str, Any]) -> int | None:
    """The executor: a calculator round, then its answer."""
    messages = [{"role": "system", "content": EXECUTOR_PROMPT}, *EXECUTOR_EXAMPLES,
                {"role": "user", "content": f"Plan: {planned or 'none'}"}]
    reply = ask(client, model, messages, sampling)
    if (tool := CALCULATE.search(reply)) and not ANSWER.search(reply):
        messages.append({"role": "user", "content": f"Result: {calculate(tool.group(1))}"})
        reply = ask(client, model, messages, sampling)
    found = ANSWER.search(reply)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Outcome:
    """What one run of the system did, for the grader."""

    first_plan: str | None
    verdict: bool | None
    final_plan: str | None
    answer: int | None


def run_system(problem: str, clients: dict[str, OpenAI], model: str, sampling: dict[str, Any]) -> Outcome:
    """Plan, verify (a wrong verdict: plan once more), execute."""
    messages = [{"role": "system", "content": PLANNER_PROMPT}, *PLANNER_EXAMPLES, {"role": "user", "content": problem}]
    first = plan(clients[PLANNER], model, messages, sampling)
    verdict = verify(clients[VERIFIER], model, problem, first, sampling)
    final = first
    if verdict is False:
        messages.append({"role": "user", "content": SEND_BACK})
        final = plan(clients[PLANNER], model, messages, sampling) or first
    return Outcome(first, verdict, final, execute(clients[EXECUTOR], model, final, sampling))


def grade(task: dict[str, Any], outcome: Outcome) -> dict[str, float]:
    """The task's success first (the rollout's reward), then each role's own reward."""
    gold = task["answer"]
    first_right = value_of(outcome.first_plan) == gold
    planned = value_of(outcome.final_plan)
    return {
        "answer": float(outcome.answer == gold),
        PLANNER: float(planned == gold),
        EXECUTOR: float(planned is not None and outcome.answer == planned),
        VERIFIER: float(outcome.verdict is not None and outcome.verdict == first_right),
    }


@ag.rollout
def plan_execute_verify(task: dict[str, Any], llm: ag.LLM) -> dict[str, float]:
    clients = {role: client_for(llm.for_agent(role)) for role in ROLES}
    return grade(task, run_system(task["question"], clients, llm.model, dict(llm.sampling_parameters)))


def make_tasks(n: int, seed: int, exclude: set[str] | None = None) -> list[dict[str, Any]]:
    """`n` distinct problems, each template in turn, numbers small enough to stay positive."""
    rng = random.Random(seed)
    seen, tasks = set(exclude or ()), []
    while len(tasks) < n:
        story, expression = TEMPLATES[len(tasks) % len(TEMPLATES)]
        numbers = {"a": rng.randint(2, 12), "b": rng.randint(2, 12), "c": rng.randint(2, 9), "name": rng.choice(NAMES)}
        if "{a} - {b} * {c}" in expression:
            numbers["a"] = numbers["b"] * numbers["c"] + rng.randint(1, 20)
        if "- {c} * {b}" in expression:
            numbers["c"] = rng.randint(1, numbers["a"] - 1) if numbers["a"] > 1 else 1
        question = story.format(**numbers)
        if question in seen:
            continue
        seen.add(question)
        formula = expression.format(**numbers)
        tasks.append({"question": question, "plan": formula, "answer": value_of(formula)})
    return tasks


def make_splits(n_train: int = 400, n_val: int = 60, seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Disjoint train and held-out problems (every template in both), the same for the same seed."""
    val = make_tasks(n_val, seed + 1)
    return make_tasks(n_train, seed, exclude={t["question"] for t in val}), val
