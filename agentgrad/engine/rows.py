"""What a request is while the engine generates it: its rows (one per completion), each row's tokens,
text and stop rules, and what it resolves to (`Generation`).

A row's text is decoded as it grows only where something reads it before the end: stop strings, `finish_after`
markers, a streaming callback. Otherwise it is decoded once when the row finishes: two tokenizer decodes a row at
every step were the largest share of the engine thread's own time at 64 rows and more (`docs/gpu.md`)."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from agentgrad.engine.detokenize import TextState, extend, full_text
from agentgrad.engine.params import SamplingParams

log = logging.getLogger(__name__)


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (end of turn or a stop string), "length", or "cancelled" (`Engine.cancel`)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # per token, when asked for
    allowed_tokens: list[int] | None = (
        None  # per token, how many tokens the grammar allowed (1: forced); None: no grammar
    )


@dataclass
class Generation:
    prompt_token_ids: list[int]
    completions: list[Completion]
    version: int
    adapter: str | None = None  # the adapter that served it (`adapters.py`); None: the engine serves one set of weights


TokenCallback = Callable[[int, int, float, str, list[tuple[int, float]]], None]
"""Streaming: called from the engine thread with (choice index, token id, logprob, new text, top logprobs)."""


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: concurrent.futures.Future[Generation]
    on_token: TokenCallback | None
    version: int = 0
    adapter: str | None = None  # the LoRA adapter serving it, or "base" (`adapters.py`); None: no adapters here
    rows: list[Row] = field(default_factory=list)
    cancelled: bool = False

    def generation(self) -> Generation:
        """What the request resolves to; a row that never finished was cancelled."""
        completions = [
            Completion(
                row.token_ids,
                row.logprobs,
                row.final_text(),
                row.finish_reason or "cancelled",
                row.top,
                row.allowed if row.matcher is not None else None,
            )
            for row in self.rows
        ]
        return Generation(self.prompt_ids, completions, self.version, self.adapter)

    def fail(self, exc: BaseException) -> None:
        """End the rows still generating with "error", and the future with `exc`."""
        for row in self.rows:
            row.finish_reason = row.finish_reason or "error"
        if not self.future.done():
            self.future.set_exception(exc)


@dataclass
class Row:
    """One sequence being generated (a request with n=4 has four)."""

    request: Request
    index: int
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    allowed: list[int] = field(default_factory=list)  # per token, how many the grammar allowed (constrained rows)
    matcher: Any = None  # an llguidance matcher when the request has a grammar
    text: str = ""
    decoded: TextState = field(default_factory=TextState)  # where `text` was last complete, to decode from there
    streamed: int = 0
    finish_reason: str | None = None
    kept: bool = False  # its keys and values went to the prefix cache (or were not to)
    tokenizer: Any = None  # what decodes `text` when it is wanted only at the end (`final_text`)
    text_tokens: int = 0  # how many of `token_ids` `text` is the text of
    ended_on_eos: bool = False  # its last token ended the turn (and is no part of the text)

    def watched(self) -> bool:
        """Whether the text is read while the row generates (stop strings, `finish_after`, streaming)."""
        params = self.request.params
        return bool(params.stop or params.finish_after or self.request.on_token is not None)

    def final_text(self) -> str:
        """The completion's text, decoded now where nothing read it as it grew (an end-of-turn token left out)."""
        end = len(self.token_ids) - int(self.ended_on_eos)
        if self.text_tokens < end and self.tokenizer is not None:
            self.text, self.text_tokens = full_text(self.tokenizer, self.token_ids[:end]), end
        return self.text

    def append(
        self, token: int, logprob: float, top: list[tuple[int, float]], tokenizer: Any, eos: set[int], max_len: int
    ) -> None:
        """Add a sampled token, extend the text where it is watched, and finish the row at an end of turn, a stop
        string, its `max_tokens`, or the model's length (`max_len` tokens with the prompt)."""
        params = self.request.params
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if params.top_logprobs:
            self.top.append(top)
        self.tokenizer = tokenizer
        if token in eos and not params.ignore_eos:
            self.finish_reason, self.ended_on_eos = "stop", True
        else:
            if self.watched():
                self._watch(tokenizer)
            if self.finish_reason is None and (
                (params.max_tokens is not None and len(self.token_ids) >= params.max_tokens)
                or len(self.request.prompt_ids) + len(self.token_ids) >= max_len
            ):
                self.finish_reason = "length"
        if self.request.on_token is not None:
            self.stream(token, logprob, top)

    def _watch(self, tokenizer: Any) -> None:
        """Extend the text by the last token and end the row at a stop string or a `finish_after` marker."""
        params = self.request.params
        checked = len(self.decoded.stable_text)  # text before this cannot change: a stop ends after it
        self.text = extend(tokenizer, self.decoded, self.token_ids)  # the full decode's text, in time linear
        self.text_tokens = len(self.token_ids)
        for stop in params.stop:
            at = self.text.find(stop, max(0, checked - len(stop) + 1))
            if at >= 0:
                self.text, self.finish_reason = self.text[:at], "stop"
                break
        for marker in params.finish_after:
            if self.finish_reason is None and self.text.find(marker, max(0, checked - len(marker) + 1)) >= 0:
                self.finish_reason = "stop"

    def stream(self, token: int, logprob: float, top: list[tuple[int, float]]) -> None:
        """Send the text that is certain: hold back a partial character or a possible stop string."""
        text = self.text
        if self.finish_reason is None:
            holdback = max((len(s) - 1 for s in self.request.params.stop), default=0)
            safe = len(text) - holdback
            if text.endswith("\ufffd"):
                safe = min(safe, len(text) - 1)
            text = text[: max(safe, self.streamed)]
        delta, self.streamed = text[self.streamed :], len(text)
        try:
            self.request.on_token(self.index, token, logprob, delta, top)  # type: ignore[misc]
        except Exception:
            log.exception("a streaming callback failed")
