"""The task set and reward every framework example shares: three-digit additions, a calculator tool.

Plain Python, no framework and no agentgrad: each example's agent gets `calculate` as its tool in
its framework's own way, and each wrapper scores the agent's final text with `reward`.
SmolLM2-135M gets ~5% of three-digit additions right in its head; with the tool, all of them.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Any

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as '123 + 456' (+ - * / and parentheses) and return the result."""

    def evaluate(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.operand))
        raise ValueError("unsupported expression")

    try:
        value = evaluate(ast.parse(str(expression).strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, TypeError):
        return "error: cannot calculate that"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


CALCULATE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression such as '123 + 456' and return the result.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
"""`calculate` as an OpenAI function tool, for the agents that write their tool schemas by hand."""

INSTRUCTIONS = "You are a calculator assistant. Use the calculate tool, then reply with 'Answer: <number>'."

EXAMPLE_QUESTION, EXAMPLE_EXPRESSION, EXAMPLE_RESULT, EXAMPLE_ANSWER = "What is 123 + 456?", "123 + 456", "579", "Answer: 579"
"""One worked exchange (question, the tool's argument and result, the answer) that each agent puts before
the question as earlier turns, in its framework's own message types: few-shot prompting with tool
calls. SmolLM2-135M copies the last exchange it was shown: with this one it calls the tool (greedy);
with instructions alone it never does, in any tool-call format (`benchmarks/tool_format_probe.py`)."""


def make_tasks(n: int = 8, seed: int = 0, worked_example: bool = True, operator: str = "+") -> list[dict[str, Any]]:
    """`n` three-digit additions (`operator` "*": multiplications, which a small model cannot do in its head), the
    same for the same seed; `worked_example=False` marks each task to be asked without the worked exchange
    (instructions and the question alone: does the model call by itself?)."""
    if operator not in ("+", "*"):
        raise ValueError(f"operator is '+' or '*', not {operator!r}")
    rng = random.Random(seed)
    pairs = [(rng.randint(100, 999), rng.randint(100, 999)) for _ in range(n)]
    extra = {} if worked_example else {"worked_example": False}
    return [{"question": f"What is {a} {operator} {b}?", "answer": a + b if operator == "+" else a * b, **extra}
            for a, b in pairs]


def wants_example(task: dict[str, Any]) -> bool:
    """Whether the agent puts the worked exchange before this task's question (yes unless the task says not)."""
    return bool(task.get("worked_example", True))


TASKS = make_tasks()

_NUMBER = re.compile(r"-?\d+")


def reward(final_text: str | None, task: dict[str, Any]) -> float:
    """1.0 when the last number in the agent's final reply is the answer, else 0.0."""
    numbers = _NUMBER.findall((final_text or "").replace(",", ""))
    return 1.0 if numbers and int(numbers[-1]) == task["answer"] else 0.0
