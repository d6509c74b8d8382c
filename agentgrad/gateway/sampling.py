"""The trainer's sampling, applied where the calls pass.

An algorithm that trains the model behind the gateway (GRPO, SFT) decides how its rollouts sample:
training rollouts at its temperature, top-p and `max_tokens`, validation greedy. Agents written for
their frameworks set their own values (LangChain examples pin `temperature=0`), which would make
every rollout of a group identical, or validation noisy. The gateway looks up each call's rollout
mode and rewrites the request's sampling settings: with `source="trainer"` the trainer's values
replace the agent's; with `source="agent"` they only fill what the agent left unset. The span
records what was used (`gen_ai.request.*`) and what the agent asked for (`semconv.AGENT_REQUEST_PARAMS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agentgrad import semconv as sc

SamplingSource = Literal["trainer", "agent"]
SAMPLING_SOURCES = ("trainer", "agent")
SETTINGS = ("temperature", "top_p", "max_tokens")
"""The settings a sampling plan may set (the names of chat completions)."""
_MAX_TOKENS_KEYS = {
    sc.CHAT_COMPLETIONS_API: ("max_tokens", "max_completion_tokens"),
    sc.COMPLETIONS_API: ("max_tokens",),
    sc.RESPONSES_API: ("max_output_tokens",),
}
"""Where each API takes its output cap; chat completions take either name (the one the agent set; else `max_tokens`)."""
SEEDED_APIS = (sc.CHAT_COMPLETIONS_API, sc.COMPLETIONS_API)
"""The APIs whose requests take a `seed` (OpenAI's Responses and Anthropic's Messages take none)."""


@dataclass(frozen=True)
class SamplingPlan:
    """Sampling settings per rollout mode (`{"train": {"temperature": 1.0, ...}, "val": {"temperature": 0.0}}`)
    and whose values win (`source`). A mode not in `by_mode` (or a call outside any rollout) is left as it is."""

    by_mode: Mapping[str, Mapping[str, float | int]] = field(default_factory=dict)
    source: SamplingSource = "trainer"

    def __post_init__(self) -> None:
        if self.source not in SAMPLING_SOURCES:
            raise ValueError(
                f"sampling is 'trainer' (the trainer's settings override the agent's) or 'agent' "
                f"(the agent's own settings are kept), not {self.source!r}"
            )
        for mode, settings in self.by_mode.items():
            unknown = set(settings) - set(SETTINGS)
            if unknown:
                raise ValueError(f"sampling for mode {mode!r} sets {sorted(unknown)}; it can set {', '.join(SETTINGS)}")

    @classmethod
    def for_training(
        cls, temperature: float, top_p: float, max_tokens: int, source: SamplingSource = "trainer"
    ) -> SamplingPlan:
        """What GRPO and SFT apply: training calls at their temperature, top-p and cap; validation greedy."""
        return cls(
            {
                "train": {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens},
                "val": {"temperature": 0.0, "max_tokens": max_tokens},
            },
            source,
        )


def apply_sampling(
    api: str,
    request: dict[str, Any],
    settings: Mapping[str, float | int],
    source: SamplingSource,
    seed: int | None = None,
) -> dict[str, Any]:
    """Rewrite `request` (in place) with `settings`, and `seed` where its API takes one (the call's seed from its
    rollout, `semconv.SAMPLING_SEED`); returns the span attributes saying what the agent asked for."""
    attributes: dict[str, Any] = {sc.SAMPLING_SOURCE: source}
    if seed is not None and api in SEEDED_APIS:
        settings = {**settings, "seed": seed}
    for name, value in settings.items():
        keys = _MAX_TOKENS_KEYS.get(api, ("max_tokens",)) if name == "max_tokens" else (name,)
        key = next((k for k in keys if request.get(k) is not None), keys[0])
        asked = request.get(key)
        if asked is not None:
            attributes[sc.AGENT_REQUEST_PARAMS[name]] = asked
            if source == "agent":
                continue
        request[key] = value
    return attributes
