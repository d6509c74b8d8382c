"""Recorded vs recomputed logprobs with and without constrained decoding (issue 19, item 3).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/constrained_logprobs.py [--prompts 4] [--n 8]

The engine (sampling in its default dtype: bf16 on a CPU with AVX512-bf16, as in training)
generates free replies, replies under a JSON schema and forced tool calls; the fp32 trainer
then scores the same ids without any grammar (`sequence_logprobs`), as GRPO's first step does.
Printed per case: the mean |recorded - recomputed| logprob and the mean k3 KL (GRPO's `train/kl`
at step 1), over the tokens GRPO trains on (forced tokens left out where the engine reports them),
and how many tokens were forced. Runs on checkouts before and after the change.
"""

from __future__ import annotations

import argparse

import torch

from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.chat import plan
from agentgrad.engine.tools import format_for
from agentgrad.engine.training import ScoredSequence, sequence_logprobs

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
CALC = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
QUESTIONS = ["Describe a person as JSON.", "What is 12 * 7?", "Who wrote Hamlet?", "What is 345 + 678?"]


def measure(engine: Engine, case: str, questions: list[str], n: int, max_tokens: int) -> tuple[float, float, int, int]:
    tools = [CALC] if case == "tool" else None
    the_plan = plan(tools, "required" if case == "tool" else None, None,
                    {"type": "json_schema", "json_schema": {"schema": PERSON}} if case == "schema" else None, format_for(engine.tokenizer))
    diff = kl = 0.0
    tokens = forced = 0
    for index, question in enumerate(questions):
        prompt = engine.chat_prompt_ids([{"role": "user", "content": question}], the_plan.rendered_tools)
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=index, n=n, grammar=the_plan.grammar)
        generation = engine.generate([prompt], params)[0]
        sequences = [ScoredSequence(prompt + c.token_ids, len(prompt)) for c in generation.completions]
        with torch.no_grad():
            recomputed = sequence_logprobs(engine.model, sequences, 1.0, engine.tokenizer.pad_token_id)
        for completion, new in zip(generation.completions, recomputed):
            allowed = getattr(completion, "allowed_tokens", None) or [0] * len(completion.token_ids)
            for old, value, count in zip(completion.logprobs, new.tolist(), allowed):
                if count == 1:
                    forced += 1
                    continue
                log_ratio = value - old
                diff += abs(log_ratio)
                kl += float(torch.tensor(-log_ratio).exp() - 1 + log_ratio)
                tokens += 1
    return diff / tokens, kl / tokens, tokens, forced


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    engine = Engine(device="cpu")
    print(f"sampling dtype {engine.sampling_dtype}, {args.prompts} prompts x {args.n} samples, temperature 1")
    for case in ("free", "schema", "tool"):
        diff, kl, tokens, forced = measure(engine, case, QUESTIONS[: args.prompts], args.n, args.max_tokens)
        print(f"{case:7s} mean |recorded - recomputed| {diff:.4f}  mean k3 KL {kl:.4f}  ({tokens} tokens scored, {forced} forced left out)")
    engine.close()


if __name__ == "__main__":
    main()
