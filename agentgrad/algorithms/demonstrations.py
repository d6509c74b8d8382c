"""Demonstrations: conversations written in advance that a policy is fine-tuned on before RL (a warm start).

A demonstration is a chat in OpenAI's fine-tuning format, `{"messages": [...], "tools": [...]}`: the messages as an
agent sends them (system, user, assistant with `tool_calls`, tool; text content), and an assistant message with
`"weight": 0` is context, not trained. Each is rendered with the policy's own chat template exactly as the engine renders the
agent's calls, its assistant turns written as the model writes them (its tool-call format, then its end-of-turn
token), so the fine-tune teaches the tokens the agent's calls will sample. Why: RL reinforces what the policy
already samples; a behaviour it almost never samples (a 0.5B model fixing its failed SQL query) has to be shown
first.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentgrad.adapters import Trajectory
from agentgrad.algorithms.config import LoopConfig
from agentgrad.algorithms.nll import Kept, sft_update
from agentgrad.algorithms.updates import LocalUpdate, Update
from agentgrad.engine.tools import calls_text, format_for, template_history
from agentgrad.engine.turns import SampledTurns

Demonstration = Mapping[str, Any]
"""`{"messages": [...], "tools": [...]}` (tools optional), OpenAI's chat fine-tuning format."""


ROLES = ("system", "developer", "user", "assistant", "tool")


class DemonstrationError(ValueError):
    """A demonstration that cannot be rendered: which one, and what is wrong with it."""


def written(message: Mapping[str, Any], tokenizer: Any) -> str:
    """An assistant message as the model writes it: its text, then its tool calls in the model's own format."""
    calls = [(c["function"]["name"], c["function"].get("arguments", {})) for c in message.get("tool_calls") or []]
    parts = [message.get("content") or ""] + ([calls_text(calls, format_for(tokenizer))] if calls else [])
    return "\n".join(part for part in parts if part)


def to_trajectory(demonstration: Demonstration, tokenizer: Any, index: int = 0) -> Trajectory:
    """One demonstration as one token sequence: every assistant turn its model-written tokens (`loss_mask` 1 unless
    its weight is 0), the rest context; each turn's prompt continues the ids before it, as the engine keeps them."""
    messages = demonstration.get("messages") if isinstance(demonstration, Mapping) else None
    if not isinstance(messages, list) or not messages:
        raise DemonstrationError(f"demonstration {index}: no 'messages' list (OpenAI's format: {{'messages': [...]}})")
    tools = demonstration.get("tools") or None
    end = tokenizer.eos_token_id
    turns = SampledTurns(tokenizer)  # the engine's own renderer: a turn's ids continue the ones sampled before it
    ids: list[int] = []
    mask: list[int] = []
    first_trained: int | None = None
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ROLES:
            raise DemonstrationError(f"demonstration {index}, message {i}: a chat message has a role "
                                     f"(system, user, assistant, tool), got {str(message)[:80]!r}")  # fmt: skip
        if message["role"] != "assistant":
            continue
        context = [{k: v for k, v in m.items() if k != "weight"} for m in messages[:i]]
        prompt = turns.prompt_ids(template_history(context), tools)
        if prompt[: len(ids)] != ids:
            raise DemonstrationError(f"demonstration {index}, message {i}: its prompt does not continue the turns "
                                     "before it under this model's chat template")  # fmt: skip
        mask += [0] * (len(prompt) - len(ids))
        reply = [*tokenizer.encode(written(message, tokenizer), add_special_tokens=False), end]
        trained = message.get("weight", 1) != 0
        if trained and first_trained is None:
            first_trained = len(prompt)
        ids = prompt + reply
        mask += [int(trained)] * len(reply)
        turns.remember(prompt, [reply])
    if first_trained is None:
        raise DemonstrationError(f"demonstration {index}: no assistant message to train (each has weight 0, or none)")
    return Trajectory(ids, mask, [0.0] * len(ids), first_trained)


def to_trajectories(demonstrations: Sequence[Demonstration], tokenizer: Any) -> list[Trajectory]:
    """`to_trajectory` of each (a file of OpenAI's JSONL: `[json.loads(line) for line in open(path)]`)."""
    return [to_trajectory(d, tokenizer, i) for i, d in enumerate(demonstrations)]


def warm_start(update: LocalUpdate, trajectories: Sequence[Trajectory], cfg: LoopConfig) -> dict[str, float]:
    """SFT on the demonstrations' trajectories before the first step (`cfg.warm_start_*`), in this process (the loop
    refuses other updates, `one_process_only`); the engine then serves the new weights. The mean loss, how many
    demonstrations and trained tokens."""
    data = Kept(list(trajectories), f"{cfg.seed}/warm-start")

    def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, pad_token_id: int) -> dict[str, float]:
        batches = data.batches(cfg.warm_start_epochs, cfg.warm_start_batch_size)
        frozen = cfg.warm_start_frozen_context
        losses = [
            sft_update(model, optimizer, b, cfg.max_grad_norm, pad_token_id, frozen_context=frozen) for b in batches
        ]
        return {
            "loss": statistics.fmean(losses),
            "demonstrations": float(len(data.trajectories)),
            "trained_tokens": float(sum(t.response_length for t in data.trajectories)),
        }

    return update.warm_start(train, cfg.warm_start_learning_rate)


def one_process_only(update: Update) -> str:
    """Why a warm start cannot run on this update: demonstrations are fine-tuned by the one-process update."""
    return (
        f"demonstrations warm-start the policy in one process; this run's update is {type(update).__name__} "
        "(train_processes > 1 or one adapter per role): drop the demonstrations, or fine-tune on them in a run of "
        "its own first"
    )
