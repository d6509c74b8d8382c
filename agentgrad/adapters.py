"""Adapters: the spans of an attempt turned into training data.

- `llm_calls`: the model calls of an attempt, in order, with their exact token ids and logprobs.
- `to_triplets`: one (prompt, response, reward) per call, under a credit-assignment policy.
- `to_trajectories`: consecutive calls merged into one token sequence when each prompt continues
  the previous prompt + response token for token; tokens the model did not write (tool results,
  user turns) are masked out of the loss. A prompt that does not continue starts a new sequence.
  With `skip_forced` (RL), tokens a grammar forced (the only one it allowed) are masked out too:
  the policy made no choice there (docs/constrained-decoding.md).
- `to_chats`: the conversations as chat messages, for SFT and for a critic to read.

`agent_match` (a regular expression, `re.search`) keeps the calls of one agent of a multi-agent
system: it is matched against the name the call was made under (`with ag.agent("writer")`, the
`x-agentgrad-agent` header or the `/agents/{name}` route; recorded as `agentgrad.agent.name`).
A call made under no name is matched by the model it asked for (`gen_ai.request.model`), for
systems that give each agent its own model alias; a named call is never matched by its model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentgrad import semconv as sc
from agentgrad.semconv import is_llm_call, is_trainable, recorded_choices
from agentgrad.types import Span, Triplet

Credit = Literal["final", "discounted", "matched"]


@dataclass
class LLMCall:
    """One choice of a recorded model call (a call with n > 1 gives several)."""

    span: Span
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float] | None
    response_allowed_tokens: list[int] | None = None  # under a grammar: per token, how many it allowed (1: forced)

    @property
    def forced(self) -> list[bool]:
        """Per response token, whether a grammar forced it (allowed it alone); all False without a grammar."""
        allowed = self.response_allowed_tokens
        if allowed is None or len(allowed) != len(self.response_token_ids):
            return [False] * len(self.response_token_ids)
        return [count == 1 for count in allowed]

    @property
    def temperature(self) -> float:
        return sc.temperature(self.span)

    @property
    def input_messages(self) -> list[dict[str, Any]]:
        return sc.input_messages(self.span)

    @property
    def output_messages(self) -> list[dict[str, Any]]:
        return sc.output_messages(self.span)

    @property
    def agent(self) -> str | None:
        return sc.agent_name(self.span)


def _order(span: Span) -> tuple[float, int]:
    return (span.start_time, span.sequence_id)


def agent_of(span: Span) -> str:
    """What `agent_match` is matched against: the agent's name, else (unnamed calls) the model name."""
    return sc.agent_name(span) or str(span.attributes.get(sc.GEN_AI_REQUEST_MODEL) or "")


def llm_calls(spans: Sequence[Span], agent_match: str | None = None) -> list[LLMCall]:
    """Model calls that recorded token ids, in the order they were made (each choice of a call with n > 1)."""
    pattern = re.compile(agent_match) if agent_match else None
    calls = []
    for span in sorted(spans, key=_order):
        if not is_llm_call(span) or not is_trainable(span) or span.status.code == "ERROR":
            continue
        if pattern is not None and not pattern.search(agent_of(span)):
            continue
        for choice in recorded_choices(span):
            if choice.prompt_token_ids and choice.response_token_ids is not None:
                calls.append(
                    LLMCall(
                        span,
                        choice.prompt_token_ids,
                        choice.response_token_ids,
                        choice.response_logprobs,
                        choice.response_allowed_tokens,
                    )
                )
    return calls


def reward_spans(spans: Sequence[Span]) -> list[Span]:
    """The attempt's reward spans in the order they ended; a role's own rewards (`emit_reward(agent=)`) are not."""
    return sorted(
        (s for s in spans if s.name == sc.REWARD_SPAN and sc.reward(s) is not None and sc.reward_agent(s) is None),
        key=lambda s: (s.end_time or s.start_time, s.sequence_id),
    )


def final_reward(spans: Sequence[Span]) -> float | None:
    """The last reward the attempt reported, or None."""
    rewards = reward_spans(spans)
    return sc.reward(rewards[-1]) if rewards else None


def to_triplets(
    spans: Sequence[Span],
    *,
    reward: float | None = None,
    credit: Credit = "final",
    gamma: float = 0.9,
    agent_match: str | None = None,
) -> list[Triplet]:
    """One triplet per model call. `reward` is the rollout's final reward (default: the last reward span).

    - `final`: every call gets the final reward.
    - `discounted`: a call k calls before the end gets `gamma**k` times the final reward.
    - `matched`: each reward span pays the calls made since the previous reward span; calls after
      the last one get the final reward.
    """
    if credit not in ("final", "discounted", "matched"):
        raise ValueError(f"credit is 'final', 'discounted' or 'matched', not {credit!r}")
    calls = llm_calls(spans, agent_match)
    final = final_reward(spans) if reward is None else reward
    credits: list[float | None]
    if credit == "final":
        credits = [final] * len(calls)
    elif credit == "discounted":
        credits = [None if final is None else final * gamma ** (len(calls) - 1 - i) for i in range(len(calls))]
    else:
        credits = [None] * len(calls)
        rewards = reward_spans(spans)
        pending = list(range(len(calls)))
        for reward_span in rewards:
            at = reward_span.end_time or reward_span.start_time
            paid = [i for i in pending if (calls[i].span.end_time or calls[i].span.start_time) <= at]
            for i in paid:
                credits[i] = sc.reward(reward_span)
            pending = [i for i in pending if i not in paid]
        for i in pending:
            credits[i] = final
    return [
        Triplet(
            prompt_token_ids=call.prompt_token_ids,
            response_token_ids=call.response_token_ids,
            response_logprobs=call.response_logprobs,
            reward=value,
            rollout_id=call.span.rollout_id,
            attempt_id=call.span.attempt_id,
            span_id=call.span.span_id,
        )
        for call, value in zip(calls, credits)
    ]


@dataclass
class Trajectory:
    """A token sequence of one or more model calls; `loss_mask[i]` is 1 where the model wrote token i."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]  # of each model-written token when sampled; 0.0 elsewhere
    prompt_length: int  # index of the first model-written token
    reward: float | None = None
    rollout_id: str | None = None
    attempt_id: str | None = None
    span_ids: list[str] = field(default_factory=list)
    temperature: float = 1.0
    call_starts: list[int] = field(default_factory=list)  # per call of span_ids, where its response begins

    @property
    def response_length(self) -> int:
        return sum(self.loss_mask)


def to_trajectories(
    spans: Sequence[Span], *, reward: float | None = None, agent_match: str | None = None, skip_forced: bool = False
) -> list[Trajectory]:
    """Merge consecutive calls whose prompt continues the previous prompt + response exactly.

    `skip_forced` (what RL wants): a token a grammar forced gets `loss_mask` 0. Its recorded logprob
    is the model's before the grammar's mask, but it was never sampled from that distribution, and
    under the mask its probability was 1 whatever the weights: it carries no policy gradient.
    Supervised fine-tuning keeps it (the model learns to write the format unconstrained).
    """
    final = final_reward(spans) if reward is None else reward
    trajectories: list[Trajectory] = []
    current: Trajectory | None = None
    for call in llm_calls(spans, agent_match):
        logprobs = call.response_logprobs or [0.0] * len(call.response_token_ids)
        written = [0 if skip_forced and forced else 1 for forced in call.forced]
        prompt = call.prompt_token_ids
        if (
            current is not None
            and len(prompt) >= len(current.token_ids)
            and prompt[: len(current.token_ids)] == current.token_ids
        ):
            extra = prompt[len(current.token_ids) :]
            current.call_starts.append(len(current.token_ids) + len(extra))
            current.token_ids += extra + call.response_token_ids
            current.loss_mask += [0] * len(extra) + written
            current.logprobs += [0.0] * len(extra) + logprobs
            current.span_ids.append(call.span.span_id)
            continue
        current = Trajectory(
            token_ids=list(prompt) + call.response_token_ids,
            loss_mask=[0] * len(prompt) + written,
            logprobs=[0.0] * len(prompt) + list(logprobs),
            prompt_length=len(prompt),
            reward=final,
            rollout_id=call.span.rollout_id,
            attempt_id=call.span.attempt_id,
            span_ids=[call.span.span_id],
            temperature=call.temperature,
            call_starts=[len(prompt)],
        )
        trajectories.append(current)
    return [t for t in trajectories if t.response_length > 0]


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """A recorded message as a chat-template message: role and content, and its tool calls or the call it answers.

    Clients send back fields of their own (`refusal`, `audio`, `function_call`: None); keeping only these
    makes the reply recorded for one call equal the same message re-sent in the next call's history.
    """
    out: dict[str, Any] = {"role": message.get("role", "assistant"), "content": message.get("content") or ""}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": call.get("type") or "function",
                "function": {
                    "name": (call.get("function") or {}).get("name"),
                    "arguments": (call.get("function") or {}).get("arguments") or "",
                },
            }
            for call in calls
        ]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def to_chats(spans: Sequence[Span], agent_match: str | None = None) -> list[list[dict[str, Any]]]:
    """Each conversation as chat messages (tool calls and tool results kept): a call's input messages plus its
    reply; a call whose input extends the previous conversation replaces it."""
    chats: list[list[dict[str, Any]]] = []
    pattern = re.compile(agent_match) if agent_match else None
    for span in sorted(spans, key=_order):
        if span.attributes.get(sc.GEN_AI_OPERATION) != sc.CHAT or span.status.code == "ERROR" or not is_trainable(span):
            continue
        if pattern is not None and not pattern.search(agent_of(span)):
            continue
        messages = [chat_message(m) for m in sc.input_messages(span) if isinstance(m, dict)]
        outputs = sc.output_messages(span)
        if not outputs:
            continue
        chat = [*messages, chat_message(outputs[0])]
        if chats and messages[: len(chats[-1])] == chats[-1]:
            chats[-1] = chat
        else:
            chats.append(chat)
    return chats


def final_answer(spans: Sequence[Span], agent_match: str | None = None) -> str:
    """The last assistant message of a rollout's conversation: its text, or its tool calls as JSON (what a judge
    reads)."""
    chats = to_chats(spans, agent_match)
    if not chats or not chats[-1]:
        return ""
    content = chats[-1][-1].get("content")
    return content if isinstance(content, str) and content else json.dumps(chats[-1][-1].get("tool_calls") or content)
