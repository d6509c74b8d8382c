"""What one generation asks of the engine: the sampling parameters, checked before the request joins a batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MAX_SEED = 2**63 - 1
"""Seeds are OpenAI's int64; each of a request's `n` rows seeds its own generator with `seed + index`."""
MAX_TOP_LOGPROBS = 20


@dataclass
class SamplingParams:
    max_tokens: int | None = None  # None: up to the model's context left over after the prompt (OpenAI's convention)
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    n: int = 1
    seed: int | None = None
    presence_penalty: float = 0.0  # subtracted once from the logit of every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in what was generated so far
    logit_bias: dict[int, float] = field(default_factory=dict)
    top_logprobs: int = 0  # how many alternatives to report per token, from the distribution sampled
    grammar: str | None = None  # an llguidance grammar the completion must match (`constraints.py`)
    finish_after: list[str] = field(default_factory=list)  # end the row once one of these is written, kept in the text
    ignore_eos: bool = False  # benchmarks: always generate max_tokens

    def check(self, max_batch_size: int, vocab_size: int | None = None) -> None:
        """Raise ValueError naming the bad value."""
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0 <= self.temperature <= 100:
            raise ValueError(f"temperature must be between 0 and 100, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 1 <= self.n <= max_batch_size:
            raise ValueError(f"n must be between 1 and the engine's batch size {max_batch_size}, got {self.n}")
        if any(not isinstance(s, str) or not s for s in self.stop + self.finish_after):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED - self.n:
            raise ValueError(f"seed must be between 0 and 2**63 - 1 - n, got {self.seed}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be between -2 and 2, got {getattr(self, name)}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.top_logprobs}")
        for token, bias in self.logit_bias.items():
            if vocab_size is not None and not 0 <= token < vocab_size:
                raise ValueError(f"logit_bias names token {token}; this model's token ids are 0 to {vocab_size - 1}")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias values must be between -100 and 100, got {bias} for token {token}")


def check_prompt(prompt_ids: Sequence[int], max_model_len: int, vocab_size: int) -> None:
    """Raise ValueError for a prompt the model cannot take: empty, too long, or an id outside its vocabulary."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if len(prompt_ids) >= max_model_len:
        raise ValueError(f"the prompt has {len(prompt_ids)} tokens; this model takes at most {max_model_len - 1}")
    bad = next((t for t in prompt_ids if type(t) is not int or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"token id {bad!r} is not in this model's vocabulary (0 to {vocab_size - 1})")
