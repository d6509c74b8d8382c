"""The trainer's sampling, applied where the calls pass.

An algorithm that trains the model behind the gateway (GRPO, SFT) decides how its rollouts sample:
training rollouts at its temperature, top-p and `max_tokens`, validation greedy. Agents written for
their frameworks set their own values (LangChain examples pin `temperature=0`), which would make
every rollout of a group identical, or validation noisy. The gateway looks up each call's rollout
mode and rewrites the request's sampling settings: with `source="trainer"` the trainer's values
replace the agent's; with `source="agent"` they only fill what the agent left unset. The span
records what was used (`gen_ai.request.*`) and what the agent asked for (`semconv.AGENT_REQUEST_PARAMS`).

A gateway holds one `RolloutSampling`: its plan (`Gateway.set_sampling`), each rollout's mode and seed (read from
the store once per rollout) and each attempt's count of calls, which makes each call's seed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agentgrad import semconv as sc
from agentgrad.store import Store

log = logging.getLogger(__name__)

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
MODE_CACHE_SIZE = 65536
"""Rollout modes remembered for the sampling plan; past it the cache starts over (each id is read once more)."""


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


class RolloutSampling:
    """A gateway's sampling plan and what applying it per call needs: each rollout's mode and seed, read from the
    store once, and each attempt's count of calls, which offsets its next call's seed."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.plan: SamplingPlan | None = None
        """Applied to every call made inside a rollout (`Gateway.set_sampling`); None: calls keep their own."""
        self._modes: dict[str, tuple[str | None, int | None]] = {}  # rollout id -> its mode and sampling seed
        self._calls: dict[str, int] = {}  # attempt id -> model calls so far: the next call's offset from the seed
        self._overridden: set[tuple[str, str]] = set()  # (mode, setting) already said to override the agent's value

    async def apply(
        self, api: str, request: dict[str, Any], rollout_id: str, attempt_id: str | None
    ) -> dict[str, Any] | None:
        """Rewrite `request` (in place) with the plan's settings for its rollout's mode and the call's seed; returns
        the span attributes (`apply_sampling`), or None where no plan or no settings for that mode apply."""
        plan = self.plan
        if plan is None:
            return None
        mode, seed = await self._mode_of(rollout_id)
        settings = plan.by_mode.get(mode or "")
        if not settings:
            return None
        attributes = apply_sampling(api, request, settings, plan.source, self._call_seed(seed, attempt_id))
        if plan.source == "trainer":
            self._say_overridden(mode or "", settings, attributes)
        return attributes

    def _say_overridden(self, mode: str, settings: Mapping[str, float | int], attributes: Mapping[str, Any]) -> None:
        """Warn, once per mode and setting, that the plan replaced a value the agent asked for: an agent that samples
        some calls on purpose (a retry at a higher temperature) otherwise learns it only from the spans."""
        for name, value in settings.items():
            asked = attributes.get(sc.AGENT_REQUEST_PARAMS[name])
            if asked is None or asked == value or (mode, name) in self._overridden:
                continue
            self._overridden.add((mode, name))
            log.warning(
                "the trainer's sampling sets %s=%s on %r calls, replacing the %s the agent asked for (further "
                "replacements are not logged; the spans record both): sampling='agent' keeps the agent's values",
                name,
                value,
                mode,
                asked,
            )

    async def _mode_of(self, rollout_id: str) -> tuple[str | None, int | None]:
        """The mode of a rollout (`train`, `val`, ...) and its sampling seed (`semconv.SAMPLING_SEED`), read from
        the store once per rollout; (None, None) if unknown."""
        if rollout_id not in self._modes:
            if len(self._modes) >= MODE_CACHE_SIZE:
                self._modes.clear()
                self._calls.clear()
            try:
                rollout = await self.store.get_rollout(rollout_id)
            except Exception as exc:  # an unknown rollout (a hand-made route), or the store unreachable for now
                log.debug("no mode for rollout %s: %s", rollout_id, exc)
                return None, None
            seed = rollout.metadata.get(sc.SAMPLING_SEED)
            self._modes[rollout_id] = (rollout.mode, seed if isinstance(seed, int) else None)
        return self._modes[rollout_id]

    def _call_seed(self, seed: int | None, attempt_id: str | None) -> int | None:
        """The seed of an attempt's next model call: the rollout's seed plus the calls the attempt made before it
        (calls an agent makes concurrently take their offsets in the order they arrive)."""
        if seed is None or attempt_id is None:
            return None
        index = self._calls.get(attempt_id, 0)
        self._calls[attempt_id] = index + 1
        return seed + index
