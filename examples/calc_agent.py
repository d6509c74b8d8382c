"""The calculator agent that `agentgrad demo` trains: plain Python with the `openai` client.

It answers arithmetic problems in the format `Answer: <number>` and is rewarded 1 for the exact
number, calling a calculator for up to `MAX_TURNS` model calls. Nothing in it knows about
training except the `@ag.rollout` decorator and the `llm` resource it is handed.

Three tasks (`task["demo"]`), the first two on three-digit additions, which SmolLM2-135M gets
right ~2-4% of the time in its head; the history shows one worked example that uses the tool,
between two that answer directly (the model copies the *last* demonstration: with the tool
example last it calls before any training; with none it almost never samples a call):
- `tool`: the text protocol, a reply containing `calculate: <expression>` gets the
  result back as the next user turn (`Result: N`). Greedy never calls; sampling calls often
  enough (~13% of first tokens, ~30% of replies) for GRPO to reinforce: 0.03 -> 1.00 in 10 steps.
- `function` (the demo): the same with OpenAI function calling (`tools=[CALCULATE_TOOL]`, each call run and
  its result sent back as a `tool` message). The engine writes SmolLM2's calls in the pythonic
  format (`[calculate(expression="123 + 456")]`, `agentgrad/engine/tools.py`), the one format
  it samples in that middle position at all, but rarely at first: 1 call in 64 sampled rollouts
  at the first GRPO step (greedy: 1 of 256). GRPO picks it up all the same (`agentgrad demo`, seed 0:
  greedy accuracy on 256 held-out problems 0.016 -> 0.996, tool-call rate 0.004 -> 1.000 in
  10 steps, 24.8 min on a shared 2-core machine).
- `plain`: two-digit additions with no tool in the history: training improves mental arithmetic.

`task["first_call"]` (`function` only), e.g. "required": the `tool_choice` of the first call, for a model that
calls in its own format only when forced (Qwen2.5-Coder-0.5B writes its calls as bare JSON text when not).

The data is generated from a seed: `make_splits()` gives disjoint train and validation sets.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re
from typing import Any

from openai import OpenAI

import agentgrad as ag

SYSTEM_PROMPT = (
    "Solve the problem and give the final result on the last line as 'Answer: <number>'. "
    "If you need to, you can write 'calculate: <expression>' to use a calculator."
)
FUNCTION_SYSTEM_PROMPT = ("Solve the problem and give the final result on the last line as 'Answer: <number>'. "
                          "If you need to, you can call the calculate tool.")
CALCULATE_TOOL = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression such as '123 + 456' and return the result.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
"""`calculate` as an OpenAI function tool."""
EXAMPLES = [("What is 23 + 14?", "Answer: 37"), ("What is 8 + 51?", "Answer: 59")]
"""`plain`: two solved problems shown as earlier turns: they teach the answer format, not the arithmetic."""
TOOL_EXAMPLES: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 23 + 14?"}, {"role": "assistant", "content": "Answer: 37"},
    {"role": "user", "content": "What is 123 + 456?"}, {"role": "assistant", "content": "calculate: 123 + 456"},
    {"role": "user", "content": "Result: 579"}, {"role": "assistant", "content": "Answer: 579"},
    {"role": "user", "content": "What is 8 + 51?"}, {"role": "assistant", "content": "Answer: 59"},
]
"""`tool`: the tool demonstrated in the middle, direct answers around it."""
FUNCTION_EXAMPLES: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 23 + 14?"}, {"role": "assistant", "content": "Answer: 37"},
    {"role": "user", "content": "What is 123 + 456?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "123 + 456"}'}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "579"}, {"role": "assistant", "content": "Answer: 579"},
    {"role": "user", "content": "What is 8 + 51?"}, {"role": "assistant", "content": "Answer: 59"},
]
"""`function`: the same, the call as OpenAI `tool_calls` and the result as a `tool` message."""
DEMOS = ("tool", "function", "plain")
MAX_TURNS = 3
ANSWER = re.compile(r"Answer:\s*(-?\d+)")
CALCULATE = re.compile(r"calculate:\s*([-+*/() \d.]+)", re.IGNORECASE)

WORD_PROBLEMS = [
    "{name} has {a} marbles and finds {b} more. How many marbles does {name} have now?",
    "A shelf holds {a} books and another holds {b}. How many books are on the two shelves?",
    "{name} walked {a} meters and then {b} meters more. How many meters did {name} walk?",
]
NAMES = ["Ana", "Ben", "Chen", "Dana", "Eli", "Fay"]


def make_tasks(n: int, seed: int, digits: int = 2, style: str = "plain", exclude: set[tuple[int, int]] | None = None,
               demo: str = "plain") -> list[dict[str, Any]]:
    """`n` distinct addition problems. `style="plain"` asks "What is A + B?"; "word" tells a story.

    The 135M model gets ~22% of plain two-digit problems right before training and ~5% of word
    problems: plain is what a few CPU minutes can visibly improve.
    """
    rng = random.Random(seed)
    low, high = 10 ** (digits - 1), 10**digits - 1
    if (high - low + 1) ** 2 < n + len(exclude or ()):
        raise ValueError(f"there are not {n} distinct {digits}-digit problems")
    seen = set(exclude or ())
    tasks = []
    while len(tasks) < n:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        question = f"What is {a} + {b}?" if style == "plain" else rng.choice(WORD_PROBLEMS).format(a=a, b=b, name=rng.choice(NAMES))
        tasks.append({"question": question, "a": a, "b": b, "answer": a + b, "demo": demo})
    return tasks


def make_splits(n_train: int = 2000, n_val: int = 256, seed: int = 0, style: str = "plain", demo: str = "plain"
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Disjoint train and validation problems, the same for the same seed (`tool`, `function`: three digits)."""
    if demo not in DEMOS:
        raise ValueError(f"demo is one of {DEMOS}, not {demo!r}")
    digits = 2 if demo == "plain" else 3
    val = make_tasks(n_val, seed + 1, digits, style=style, demo=demo)
    train = make_tasks(n_train, seed, digits, style=style, exclude={(t["a"], t["b"]) for t in val}, demo=demo)
    return train, val


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """The calculator tool: + - * / and parentheses over numbers, nothing else."""

    def evaluate(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.operand))
        raise ValueError("unsupported expression")

    try:
        value = evaluate(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return "error: cannot calculate that"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def build_messages(question: str, demo: str = "plain") -> list[dict[str, Any]]:
    if demo == "tool":
        return [{"role": "system", "content": SYSTEM_PROMPT}, *TOOL_EXAMPLES, {"role": "user", "content": question}]
    if demo == "function":
        return [{"role": "system", "content": FUNCTION_SYSTEM_PROMPT}, *FUNCTION_EXAMPLES, {"role": "user", "content": question}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    for user, assistant in EXAMPLES:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return messages + [{"role": "user", "content": question}]


def parse_answer(text: str) -> int | None:
    match = ANSWER.search(text)
    return int(match.group(1)) if match else None


_clients: dict[str, OpenAI] = {}


def client_for(llm: ag.LLM) -> OpenAI:
    """A client for this endpoint sharing one connection pool: building a client costs ~25 ms,
    and each attempt has its own URL (the gateway route that records it)."""
    if llm.api_key not in _clients:
        _clients[llm.api_key] = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=2)
    return _clients[llm.api_key].with_options(base_url=llm.base_url)


def run_tool(name: str, arguments: str) -> str:
    """What a tool call returns: the calculator's result, or an error the model can read."""
    try:
        expression = json.loads(arguments).get("expression", "")
    except (json.JSONDecodeError, AttributeError):
        return "error: the arguments are not a JSON object"
    return calculate(str(expression)) if name == "calculate" else f"error: there is no tool {name!r}"


@ag.rollout
def calc_agent(task: dict[str, Any], llm: ag.LLM) -> float:
    client = client_for(llm)
    demo = task.get("demo", "plain")
    messages = build_messages(task["question"], demo)
    reply = ""
    for turn in range(MAX_TURNS):
        if demo == "function":  # OpenAI function calling: run every call, send its result back as a tool message
            forced = {"tool_choice": task["first_call"]} if turn == 0 and task.get("first_call") else {}
            response = client.chat.completions.create(model=llm.model, messages=messages, tools=[CALCULATE_TOOL],
                                                      **forced, **llm.sampling_parameters)
            message = response.choices[0].message
            reply = message.content or ""
            if not message.tool_calls:
                break
            messages.append(message.model_dump(include={"role", "content", "tool_calls"}))
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": run_tool(call.function.name, call.function.arguments)})
            continue
        response = client.chat.completions.create(model=llm.model, messages=messages, **llm.sampling_parameters)
        reply = response.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        tool = CALCULATE.search(reply)
        if tool is None or parse_answer(reply) is not None or turn == MAX_TURNS - 1:
            break
        messages.append({"role": "user", "content": f"Result: {calculate(tool.group(1))}"})
    return 1.0 if parse_answer(reply) == task["answer"] else 0.0
