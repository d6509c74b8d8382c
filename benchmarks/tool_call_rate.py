"""How often SmolLM2 calls a tool in the engine's built-in format, in the issue-14 demo history shape.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/tool_call_rate.py [--problems 64] [--samples 4]

One worked example that calls the tool sits in the middle of the history, between two that
answer directly; the question is a three-digit addition. Greedy and sampled (temperature 1)
rates of replies that parse into a tool call are printed.
"""

from __future__ import annotations

import argparse
import random
import time

from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.chat import plan
from agentgrad.engine.tools import parse_reply

SYSTEM = ("Solve the problem and give the final result on the last line as 'Answer: <number>'. "
          "If you need to, you can use the calculate tool.")
CALCULATE = {"type": "function", "function": {"name": "calculate", "description": "Evaluate an arithmetic expression",
                                              "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                             "required": ["expression"]}}}
HISTORY = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What is 23 + 14?"}, {"role": "assistant", "content": "Answer: 37"},
    {"role": "user", "content": "What is 123 + 456?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "123 + 456"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "579"},
    {"role": "assistant", "content": "Answer: 579"},
    {"role": "user", "content": "What is 8 + 51?"}, {"role": "assistant", "content": "Answer: 59"},
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args()
    rng = random.Random(0)
    problems = [(rng.randint(100, 999), rng.randint(100, 999)) for _ in range(args.problems)]
    engine = Engine(max_batch_size=64)
    tools = plan([CALCULATE], "auto", None, None).tools
    prompts = [engine.chat_prompt_ids(HISTORY + [{"role": "user", "content": f"What is {a} + {b}?"}], [CALCULATE]) for a, b in problems]
    print(f"prompt length {len(prompts[0])} tokens")
    for name, params in [("greedy", SamplingParams(max_tokens=40, temperature=0)),
                         ("sampled T=1", SamplingParams(max_tokens=40, temperature=1.0, n=args.samples, seed=0))]:
        began = time.monotonic()
        replies = [c.text for g in engine.generate(prompts, params) for c in g.completions]
        calls = [parse_reply(text, tools) for text in replies]
        rate = sum(bool(r.tool_calls) for r in calls) / len(calls)
        looks = sum("<tool_call>" in text for text in replies) / len(replies)
        print(f"{name}: {rate:.3f} of {len(replies)} replies call the tool ({looks:.3f} write <tool_call>), "
              f"{time.monotonic() - began:.0f} s; e.g. {replies[0]!r}")
    engine.close()


if __name__ == "__main__":
    main()
