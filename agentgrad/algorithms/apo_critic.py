"""APO's critic and editor: the textual gradient of a prompt from its failed runs, and rewrites along it, asked of
an OpenAI-compatible endpoint: by default the agent's own model, through its gateway, where the calls are recorded
as `apo-critic` and `apo-editor` and marked as no training data. The search (`apo.APO`) and the joint run
(`joint.Joint`) ask through one `Critic`; what it sends and reads back is `apo_text.py`'s.

A rewrite that cannot replace the prompt (`apo_text.check_rewrite`: a dropped placeholder, say) goes back to the
editor with the reason, `repair_tries` times: a small local editor drops a placeholder it keeps once told.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from typing import Any

from agentgrad import semconv as sc
from agentgrad.algorithms.apo_config import APOConfig
from agentgrad.algorithms.apo_text import (
    CALLERS,
    Messages,
    between_markers,
    check_rewrite,
    critic_messages,
    editor_messages,
    lenient,
    repair_request,
)
from agentgrad.redact import redact, redact_known
from agentgrad.store.base import Store
from agentgrad.types import LLM, NamedResources, PromptTemplate, Rollout, RolloutStatus

log = logging.getLogger(__name__)


class APOError(RuntimeError):
    """APO cannot go on: the critic/editor endpoint refuses the calls, or the agent fails on every task."""


@dataclass(frozen=True)
class Tally:
    """What became of one round's critic and editor replies and rewrites: counts that add up across the round."""

    candidates: int = 0  # rewrites published as snapshots
    rejected: int = 0  # of them, those `check_rewrite` (or a repeated template) rejected
    unusable: int = 0  # critic/editor replies that could not be used (malformed, or an API error): each cost a try
    skipped: int = 0  # critiques and rewrites given up after `max_tries` unusable replies
    no_failures: int = 0  # prompts of the beam whose training runs all succeeded: nothing for the critic to read
    repaired: int = 0  # rewrites `check_rewrite` refused that the editor, told why, wrote again usably

    def __add__(self, other: Tally) -> Tally:
        return Tally(*(a + b for a, b in zip(astuple(self), astuple(other))))


@dataclass(frozen=True)
class Reply:
    """A critic's or editor's answer: the text between its markers (None when there is none), and its counts."""

    text: str | None
    tally: Tally


def agent_llm(resources: NamedResources) -> LLM:
    """The agent's only LLM resource, whose endpoint and model the critic and editor use by default."""
    llms = [r for r in resources.values() if isinstance(r, LLM)]
    if len(llms) != 1:
        raise ValueError(
            f"APO calls the critic and editor at the agent's LLM endpoint by default, but the resources hold "
            f"{len(llms)} LLM resources: pass APO(base_url=..., critic_model=...)"
        )
    return llms[0]


@dataclass(frozen=True)
class Critic:
    """The critic and editor of a run: the endpoint's client, the model that plays each, APO's settings."""

    client: Any  # openai.AsyncOpenAI
    critic_model: str
    editor_model: str
    config: APOConfig

    @classmethod
    def of(cls, config: APOConfig, resources: NamedResources) -> Critic:
        """At `config`'s endpoint and models, by default those of the agent's LLM resource among `resources`."""
        from openai import AsyncOpenAI

        base_url, api_key, critic_model = config.base_url, config.api_key, config.critic_model
        if base_url is None or critic_model is None:
            llm = agent_llm(resources)
            if base_url is None:
                base_url, api_key = llm.base_url, api_key or llm.api_key
            critic_model = critic_model or llm.model
        # a local endpoint takes no key: "none" where neither the settings nor OPENAI_API_KEY name one
        client = AsyncOpenAI(base_url=base_url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none")
        return cls(client, critic_model, config.editor_model or critic_model, config)

    async def close(self) -> None:
        await self.client.close()

    async def criticize(self, store: Store, prompt: PromptTemplate, runs: Sequence[Rollout]) -> Reply:
        """The critic's textual gradient of `prompt` from its failed runs (their spans read from `store`); no text
        when none failed or the critic gave no usable reply."""
        threshold = self.config.success_threshold
        failed = sorted(
            (r for r in runs if r.status is not RolloutStatus.SUCCEEDED or r.reward is None or r.reward < threshold),
            key=lambda r: r.reward if r.status is RolloutStatus.SUCCEEDED and r.reward is not None else float("-inf"),
        )[: self.config.critic_examples]
        if not failed:
            return Reply(None, Tally(no_failures=1))
        spans_of = await store.query_spans_of([run.rollout_id for run in failed])
        messages = critic_messages(prompt, [(run, spans_of[run.rollout_id]) for run in failed], len(runs))
        return await self.ask(self.critic_model, messages, "critique", self.config.critic_temperature)

    async def edit(self, prompt: PromptTemplate, critique: str, style: str) -> Reply:
        """The editor's rewrite of `prompt` along `critique`; a rewrite `check_rewrite` refuses goes back to the editor
        with the reason (`repair_tries` times); no text when it gave no usable reply."""
        messages = editor_messages(prompt, critique, style)
        temperature = self.config.editor_temperature
        reply = await self.ask(self.editor_model, messages, "new_prompt", temperature)
        text, tally = reply.text, reply.tally
        reason = None if text is None else check_rewrite(prompt, prompt.model_copy(update={"template": text}))
        for _ in range(self.config.repair_tries):
            if text is None or reason is None:
                break
            messages = [
                *messages,
                {"role": "assistant", "content": f"<new_prompt>\n{text}\n</new_prompt>"},
                {"role": "user", "content": repair_request(prompt, reason)},
            ]
            again = await self.ask(self.editor_model, messages, "new_prompt", temperature)
            tally += again.tally
            if again.text is None:  # keep the rewrite refused: its refusal is recorded where it is published
                break
            text, reason = again.text, check_rewrite(prompt, prompt.model_copy(update={"template": again.text}))
            tally += Tally(repaired=int(reason is None))
        return Reply(text, tally)

    async def ask(self, model: str, messages: Messages, tag: str, temperature: float) -> Reply:
        """The text between `<tag>` markers of the model's reply, tried up to `max_tries` times.

        A malformed reply or a passing API error costs a try; a wrong model name or key stops the run.
        """
        import openai

        # through a gateway (the policy's own, say) the call is recorded under the critic's or editor's name, and
        # marked as no training data, so GRPO never trains on it
        headers = {sc.NOT_TRAINED_HEADER: "apo", sc.AGENT_HEADER: CALLERS[tag]}
        cfg = self.config
        limit = {"max_tokens": cfg.max_tokens} if cfg.max_tokens else {}
        for attempt in range(1, cfg.max_tries + 1):
            try:
                reply = await self.client.chat.completions.create(
                    model=model, messages=messages, temperature=temperature, extra_headers=headers, **limit
                )
                choice = reply.choices[0] if reply.choices else None
                if choice is not None and choice.finish_reason == "length" and not cfg.lenient_replies:
                    raise ValueError(f"the reply was cut off at the token limit before </{tag}>")
                content = redact_known(choice.message.content or "") if choice else None
                text = lenient(content, tag) if cfg.lenient_replies else between_markers(content, tag)
                return Reply(text, Tally(unusable=attempt - 1))  # the tries before this one were unusable
            except openai.APIStatusError as exc:
                if exc.status_code in (401, 403, 404):  # wrong key, URL or model name: no retry will help
                    raise APOError(redact(f"APO cannot call model {model!r} at {self.client.base_url}: {exc}")) from exc
                problem = f"{type(exc).__name__}: {exc}"
            except (openai.APIError, ValueError) as exc:
                problem = str(exc)
            log.warning("APO %s reply from %s unusable (try %d of %d): %s", tag, model, attempt, cfg.max_tries,
                        redact(problem))  # fmt: skip
        return Reply(None, Tally(unusable=cfg.max_tries, skipped=1))
