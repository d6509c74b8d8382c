"""Chat prompts as token ids, continuing the ids an earlier turn was sampled as.

A model often samples a tokenization that re-tokenizing the same text would not give (`")]` as two
tokens). When an agent sends a reply back unedited with its tool results or next question after it,
the next prompt should continue the previous prompt + completion token for token, so a tool round
merges into one trajectory (`adapters.to_trajectories`). This remembers what each chat prompt rendered
to and what was sampled for it, by text, and reuses those exact ids; an edited history falls back to
tokenizing it all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

SAMPLED_TURNS = 512
"""How many recent chat completions are remembered, to render them again with the ids sampled."""


class SampledTurns:
    """The recent chat prompts (ids -> rendered text) and completions (text -> the ids sampled), least
    recently used first; safe to use from request threads and the engine thread at once."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._rendered: OrderedDict[tuple[int, ...], str] = OrderedDict()
        self._sampled: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()
        self._lossless: bool | None = None

    def prompt_ids(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of a chat, ready for the assistant's turn: the model's chat template, with tools and
        tool calls rendered by it where it supports them, else in this model's built-in format (`tools.py`);
        the longest remembered turn the text starts with keeps the ids it was sampled as."""
        from agentgrad.engine.tools import format_for, render_history, template_supports_tools

        if template_supports_tools(self.tokenizer):
            rendered, tools_arg = list(messages), list(tools) if tools else None
        else:
            rendered = render_history(list(messages), list(tools) if tools else None, format_for(self.tokenizer))
            tools_arg = None
        text = self.tokenizer.apply_chat_template(rendered, tools=tools_arg, add_generation_prompt=True, tokenize=False)
        if not isinstance(text, str) or not self.lossless():
            ids = self.tokenizer.apply_chat_template(
                rendered, tools=tools_arg, add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return list(ids)
        with self._lock:
            known = max((k for k in self._sampled if text.startswith(k)), key=len, default="")
            head = list(self._sampled[known]) if known else []
            if known:
                self._sampled.move_to_end(known)
        ids = head + (self._tokenize(text[len(known) :]) if len(known) < len(text) else [])
        with self._lock:
            self._rendered[tuple(ids)] = text
            self._rendered.move_to_end(tuple(ids))
            while len(self._rendered) > SAMPLED_TURNS:
                self._rendered.popitem(last=False)
        return ids

    def remember(self, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]]) -> None:
        """The ids sampled for a prompt `prompt_ids` made, by the text each prompt + completion renders to."""
        with self._lock:
            text = self._rendered.get(tuple(prompt_ids))
        if text is None:
            return
        turns = {text + self._detokenize(ids): list(prompt_ids) + list(ids) for ids in completions if ids}
        with self._lock:
            for key, ids in turns.items():
                self._sampled[key] = ids
                self._sampled.move_to_end(key)
            while len(self._sampled) > SAMPLED_TURNS:
                self._sampled.popitem(last=False)

    def lossless(self) -> bool:
        """Whether decoding ids gives back the exact text they came from (byte-level BPE does), which
        remembering sampled turns by their text relies on; checked once."""
        if self._lossless is None:
            probe = '<|im_start|>x\n [f(a="1 + 2")]  é\n\n\tdone.<|im_end|>\n'
            ids = self._tokenize(probe)
            self._lossless = self._detokenize(ids) == probe and self._tokenize(self._detokenize(ids)) == ids
        return self._lossless

    def _tokenize(self, text: str) -> list[int]:
        """Ids of rendered chat text, as `apply_chat_template(tokenize=True)` makes them."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _detokenize(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False))
