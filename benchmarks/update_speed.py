"""The GRPO update's speed against a plain transformers (+ peft) loop on the same batch, in one process.

    .venv/bin/python benchmarks/update_speed.py --models smollm2-135m --rounds 3
    flock /tmp/agentgrad-big.lock .venv/bin/python benchmarks/update_speed.py --models qwen2.5-coder-0.5b

"ours" is `grpo_update` as `LocalUpdate.step` runs it (the engine's trainable model under `Engine.training()`,
the demo's micro-batches, the clipped loss with the token mean over the step, gradient clipping, one AdamW step).
"plain" is what one writes with transformers: the same sequences right-padded per micro-batch, the model's full
logits, log-softmax and gather, the same loss, backward, clipping and AdamW step, on a model loaded with
`from_pretrained` (its default SDPA attention) and wrapped by peft the same way for LoRA. Both see the same
batch and start from the same weights; rounds alternate (ours, plain, ours, ...) so a busy machine slows both
alike; round 0 of each is a warm-up and is left out. tokens/s counts every token of every sequence (prompt and
response) per wall second of the whole update (forward, backward, optimizer); CPU seconds are printed beside it
because the machine may be shared. Shapes, per model, as its demo trains:

- smollm2-135m (`agentgrad demo`): full weights, 8 tasks x 8 rollouts, the calculator prompt with its tool,
  40 response tokens, micro-batches of 32.
- qwen2.5-coder-0.5b (`agentgrad demo --task sql`): LoRA rank 16 on every linear projection, 4 questions x 4
  rollouts, the SQL agent's system prompt with a database schema, 128 response tokens, micro-batches of 4.
  `--gradient-checkpointing` turns it on in both (the sql demo leaves it off; `GRPOConfig.gradient_checkpointing`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentgrad.adapters import Trajectory
from agentgrad.algorithms.grpo import GRPOConfig
from agentgrad.algorithms.grpo_update import grpo_update, policy_loss
from agentgrad.engine import Engine
from agentgrad.engine.model import BUILTIN_FOLDERS, cache_dir

Batch = list[tuple[Trajectory, float]]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the examples' agents and prompts


@dataclass(frozen=True)
class Shape:
    """What one model's demo trains on: a batch of `tasks` x `group` sequences, and how it updates."""

    tasks: int
    group: int
    response_tokens: int
    micro_batch: int
    lora_rank: int
    sampling_dtype: str | None


SHAPES = {
    "smollm2-135m": Shape(tasks=8, group=8, response_tokens=40, micro_batch=32, lora_rank=0, sampling_dtype=None),
    "qwen2.5-coder-0.5b": Shape(
        tasks=4, group=4, response_tokens=128, micro_batch=4, lora_rank=16, sampling_dtype="float32"
    ),
}


def prompt_messages(model: str, rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """One task's first prompt as its demo's agent writes it (messages, tools)."""
    if model == "qwen2.5-coder-0.5b":
        from examples.sql import db
        from examples.sql.agent import INSTRUCTIONS

        question = rng.choice(db.load_questions("train"))
        tool = {
            "type": "function",
            "function": {
                "name": "run_sql",
                "description": "Run one SQLite query on the database and return its rows, or the error.",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
            },
        }
        system = INSTRUCTIONS.format(schema=db.schema(question["db"]))
        return [{"role": "system", "content": system}, {"role": "user", "content": question["question"]}], [tool]
    from examples.calc_agent import CALCULATE_TOOL, build_messages

    question = f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}?"
    return build_messages(question, "function"), [CALCULATE_TOOL]


def make_batch(engine: Engine, model: str, shape: Shape, seed: int = 0) -> Batch:
    """`shape.tasks` prompts, each with `shape.group` random responses; advantages of either sign."""
    rng = random.Random(seed)
    vocabulary = len(engine.tokenizer)
    batch: Batch = []
    for _ in range(shape.tasks):
        messages, tools = prompt_messages(model, rng)
        prompt = engine.chat_prompt_ids(messages, tools=tools)
        for member in range(shape.group):
            response = [rng.randrange(1000, min(vocabulary, 30000)) for _ in range(shape.response_tokens)]
            trajectory = Trajectory(
                prompt + response,
                [0] * len(prompt) + [1] * len(response),
                [0.0] * len(prompt) + [-1.0] * len(response),
                len(prompt),
            )
            batch.append((trajectory, 1.0 if member % 2 else -1.0))
    return batch


def plain_model(model: str, shape: Shape) -> torch.nn.Module:
    """The model as `from_pretrained` gives it (fp32, SDPA), with peft's LoRA where the demo trains one."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(cache_dir() / "models" / BUILTIN_FOLDERS[model], dtype=torch.float32)
    if shape.lora_rank:
        from peft import LoraConfig, get_peft_model

        loaded = get_peft_model(
            loaded, LoraConfig(r=shape.lora_rank, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
        )
    return loaded


def plain_update(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, config: GRPOConfig, pad: int
) -> None:
    """One GRPO step the plain way: right-padded micro-batches, full logits, log-softmax, gather, same loss."""
    total = sum(t.response_length for t, _ in batch)
    optimizer.zero_grad(set_to_none=True)
    for start in range(0, len(batch), config.micro_batch_size):
        micro = batch[start : start + config.micro_batch_size]
        width = max(len(t.token_ids) for t, _ in micro)
        ids = torch.tensor([t.token_ids + [pad] * (width - len(t.token_ids)) for t, _ in micro])
        attention = torch.tensor([[1] * len(t.token_ids) + [0] * (width - len(t.token_ids)) for t, _ in micro])
        scored = torch.tensor([t.loss_mask[1:] + [0] * (width - len(t.token_ids)) for t, _ in micro], dtype=torch.float)
        old = torch.tensor([t.logprobs[1:] + [0.0] * (width - len(t.token_ids)) for t, _ in micro])
        advantages = torch.tensor([[a] for _, a in micro])
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        new = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        token_loss, _ = policy_loss(new, old, advantages, config.clip_eps)
        ((token_loss * scored).sum() / total).backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], config.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@dataclass
class Timing:
    wall: list[float] = dataclasses.field(default_factory=list)
    cpu: list[float] = dataclasses.field(default_factory=list)


def timed(run: Callable[[], None], into: Timing) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    into.wall.append(time.perf_counter() - wall)
    into.cpu.append(time.process_time() - cpu)


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def bench_model(model: str, shape: Shape, rounds: int, checkpointing: bool, only: Sequence[str]) -> None:
    engine = Engine(model, sampling_dtype=shape.sampling_dtype)
    if shape.lora_rank:  # as LocalPolicy does for lora_rank > 0
        from peft import LoraConfig, get_peft_model

        engine.replace_model(
            get_peft_model(
                engine.model,
                LoraConfig(r=shape.lora_rank, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0),
            )
        )
    config = GRPOConfig(micro_batch_size=shape.micro_batch, gradient_checkpointing=checkpointing)
    batch = make_batch(engine, model, shape)
    pad = engine.tokenizer.pad_token_id
    tokens = sum(len(t.token_ids) for t, _ in batch)
    ours_optimizer = torch.optim.AdamW(trainable(engine.model), lr=1e-5)
    if checkpointing:  # as LocalUpdate does
        engine.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    plain = plain_model(model, shape) if "plain" in only else None
    if plain is not None:
        plain.load_state_dict(engine.model.state_dict())  # the same starting weights (adapters included)
        if checkpointing:
            plain.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        plain.train()
        plain_optimizer = torch.optim.AdamW(trainable(plain), lr=1e-5)

    def ours() -> None:
        with engine.training() as trained:
            grpo_update(trained, ours_optimizer, batch, config, pad)

    times = {"ours": Timing(), "plain": Timing()}
    loads = []
    for round_ in range(rounds + 1):
        if "ours" in only:
            timed(ours, times["ours"])
        if plain is not None:
            timed(lambda: plain_update(plain, plain_optimizer, batch, config, pad), times["plain"])
        loads.append(os.getloadavg()[0])
        print(
            f"  round {round_}{' (warm-up)' if round_ == 0 else ''}: "
            + ", ".join(f"{name} {t.wall[-1]:.2f} s" for name, t in times.items() if t.wall)
            + f", load {loads[-1]:.2f}",
            flush=True,
        )
    prompt = len(batch[0][0].token_ids) - shape.response_tokens
    what = f"LoRA r{shape.lora_rank}" if shape.lora_rank else "full weights"
    print(
        f"{model} ({what}{', gradient checkpointing' if checkpointing else ''}): {len(batch)} sequences x "
        f"({prompt} prompt + {shape.response_tokens} response) = {tokens} tokens, micro-batches of {shape.micro_batch}"
    )
    print(f"{'':6} {'tokens/s':>9} {'wall s':>8} {'cpu s':>7}")
    medians = {}
    for name, t in times.items():
        if len(t.wall) > 1:
            wall, cpu = statistics.median(t.wall[1:]), statistics.median(t.cpu[1:])
            medians[name] = wall
            print(f"{name:6} {tokens / wall:9.0f} {wall:8.2f} {cpu:7.2f}")
    if len(medians) == 2:
        print(f"ours / plain: {medians['plain'] / medians['ours']:.2f}x tokens/s")
    print(f"load average over the rounds: {statistics.fmean(loads[1:]):.2f} (cores: {os.cpu_count()})", flush=True)
    engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models", default="smollm2-135m,qwen2.5-coder-0.5b", help="comma-separated: " + ", ".join(SHAPES)
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each (after one warm-up)")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="in both loops")
    parser.add_argument("--only", default="ours,plain", help="ours, plain or both (to profile one)")
    parser.add_argument("--tasks", type=int, help="tasks per batch instead of the demo's (a shorter run)")
    parser.add_argument("--group", type=int, help="sequences per task instead of the demo's")
    parser.add_argument("--micro-batch", type=int, help="sequences per forward/backward instead of the demo's")
    args = parser.parse_args()
    torch.manual_seed(0)
    for model in args.models.split(","):
        if model not in SHAPES:
            raise SystemExit(f"unknown model {model!r}: choose from {', '.join(SHAPES)}")
        shape = SHAPES[model]
        shape = dataclasses.replace(
            shape,
            tasks=args.tasks or shape.tasks,
            group=args.group or shape.group,
            micro_batch=args.micro_batch or shape.micro_batch,
        )
        bench_model(model, shape, args.rounds, args.gradient_checkpointing, args.only.split(","))


if __name__ == "__main__":
    main()
