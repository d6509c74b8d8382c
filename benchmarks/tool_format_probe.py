"""Does the model sample a tool call when one worked example in its history used the tool?

GRPO can only reinforce what the model sometimes does: the demo needs a history under which
greedy decoding rarely calls the calculator and sampling sometimes does. This probe renders the
demo's history (a tool demonstration in the middle, direct answers around it) in two formats:

- `function`: the engine's built-in tool-call format for this model (`tools=[calculate]`, the
  assistant's call as `tool_calls`, the result as a `tool` message), i.e. what `agentgrad engine
  serve` renders: for SmolLM2 the pythonic format (`agentgrad/engine/tools.py`);
- `text`: the text protocol `calculate: <expression>` and a user turn `Result: N`.

For each it prints the greedy and the sampled (temperature 1) call rates and accuracies on
three-digit additions; a call counts when the engine's parser reads it as one.

    python benchmarks/tool_format_probe.py --problems 64 --samples 4

Measured here (teacher-forced probability that the reply starts with the call, SmolLM2-135M,
demo history, a loaded 2-core machine): pythonic `[calculate(expression="` ~0.10 (greedy
answers directly), text `calculate:` 0.13 (greedy answers directly); Hermes
`<tool_call>\\n{"name": "calculate"` and SmolLM2's model-card `<tool_call>[{"name": "calculate"`
< 0.001 (it writes `<tool_response>` instead: 0/160 sampled calls with Hermes). With the tool
demonstration *last* (system, one worked exchange, the question) pythonic calls are greedy
(4/4); with instructions alone no format is ever called (P < 0.001 for pythonic, JSON, Hermes
and the model-card list; the model starts "To ...").
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time

from agentgrad.engine import Engine
from agentgrad.engine.params import SamplingParams
from agentgrad.engine.tools import functions, parse_reply

SYSTEM = ("Solve the problem and give the final result on the last line as 'Answer: <number>'. "
          "If you need to, you can write 'calculate: <expression>' to use a calculator.")
SYSTEM_FUNCTION = ("Solve the problem and give the final result on the last line as 'Answer: <number>'. "
                   "If you need to, you can call the calculate tool.")
TOOL = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression such as '12 + 7'.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def history(fmt: str, question: str) -> list[dict]:
    call = [{"id": "call_1", "type": "function",
             "function": {"name": "calculate", "arguments": json.dumps({"expression": "123 + 456"})}}]
    middle = ([{"role": "assistant", "content": None, "tool_calls": call},
               {"role": "tool", "tool_call_id": "call_1", "content": "579"}] if fmt == "function" else
              [{"role": "assistant", "content": "calculate: 123 + 456"}, {"role": "user", "content": "Result: 579"}])
    return [{"role": "system", "content": SYSTEM_FUNCTION if fmt == "function" else SYSTEM},
            {"role": "user", "content": "What is 23 + 14?"}, {"role": "assistant", "content": "Answer: 37"},
            {"role": "user", "content": "What is 123 + 456?"}, *middle, {"role": "assistant", "content": "Answer: 579"},
            {"role": "user", "content": "What is 8 + 51?"}, {"role": "assistant", "content": "Answer: 59"},
            {"role": "user", "content": question}]


def called(fmt: str, text: str) -> bool:
    if fmt == "function":
        return bool(parse_reply(text, functions([TOOL])).tool_calls)
    return re.search(r"calculate:", text, re.I) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4, help="sampled replies per problem")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    problems = [(rng.randint(100, 999), rng.randint(100, 999)) for _ in range(args.problems)]
    engine = Engine()
    for fmt in ("function", "text"):
        prompts = [engine.chat_prompt_ids(history(fmt, f"What is {a} + {b}?"), [TOOL] if fmt == "function" else None)
                   for a, b in problems]
        for name, params in (("greedy", SamplingParams(max_tokens=40, temperature=0.0)),
                             ("sampled", SamplingParams(max_tokens=40, temperature=1.0, n=args.samples, seed=args.seed))):
            began = time.perf_counter()
            texts = [(c.text, a + b) for g, (a, b) in zip(engine.generate(prompts, params), problems) for c in g.completions]
            calls = [t for t, _ in texts if called(fmt, t)]
            right = sum(f"Answer: {s}" in t for t, s in texts)
            print(f"{fmt:8} {name:7} prompt {len(prompts[0])} tokens: calls {len(calls)}/{len(texts)} "
                  f"({len(calls) / len(texts):.3f}), direct answers right {right}/{len(texts)} "
                  f"[{time.perf_counter() - began:.0f}s]", flush=True)
            for text in (calls or [t for t, _ in texts])[:3]:
                print("   e.g.", repr(text[:120]))
    engine.close()


if __name__ == "__main__":
    main()
