"""Several upstreams behind one gateway: model patterns, a routing file, rate limits and a response cache.

`load_routes("routes.toml")` reads a file mapping model names or glob patterns (`claude-*`) to
upstreams, each with its own URL, key source, API (`system`), timeouts, retries, rate limit and
cache; `Gateway(store, load_routes(path))` serves them. One agent can then call the trained model
for one role and a hosted model for another, and both are recorded.

```toml
[upstreams.policy]          # the model being trained
url = "http://127.0.0.1:8000/v1"
system = "agentgrad"
models = ["policy"]

[upstreams.claude]          # a hosted judge
url = "https://api.anthropic.com/v1"
system = "anthropic"
key_env = "ANTHROPIC_API_KEY"
models = ["claude-*"]
timeout_s = 60
max_retries = 2
requests_per_minute = 50
tokens_per_minute = 40000
max_queued = 100
cache = true
```

An `[ab.MODEL]` table splits calls for `MODEL` between two upstreams of the file (`ab.ABSplit`, sticky per
rollout), such as two adapters of one engine, each upstream naming its adapter as the `model` sent upstream;
an upstream that serves only as an arm needs no `models`:

```toml
[upstreams.step-1]
url = "http://127.0.0.1:8000/v1"
system = "agentgrad"
model = "step-1"            # `agentgrad engine serve --adapter step-1=runs/ckpt/step-1 ...`

[upstreams.step-3]
url = "http://127.0.0.1:8000/v1"
system = "agentgrad"
model = "step-3"

[ab.policy]
arms = ["step-1", "step-3"] # upstream names; each rollout's calls go to one of them
share = { step-3 = 0.2 }    # optional: the default is an even split
seed = 0                    # optional: another seed deals the rollouts out differently
```

A `RateLimit` queues a call until its upstream has room (requests and tokens per minute, token
buckets) and refuses with a 429 once `max_queued` calls already wait. The `ResponseCache` answers a
repeated non-streamed request to an upstream with `cache = true`; it is off by default and refused
for an upstream that returns token ids (the policy: its samples must be fresh).
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
import tomllib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agentgrad.gateway.ab import ABSplit
from agentgrad.gateway.upstreams import Backend, GatewayError, RateLimit

CACHE_ENTRIES = 4096
"""Answers a response cache keeps (least recently used out first)."""
CHARS_PER_TOKEN = 4
"""How a request's prompt is counted against a tokens-per-minute limit before it runs (an estimate)."""


def request_tokens(request: Mapping[str, Any], body_size: int) -> int:
    """What a call is counted as against a tokens-per-minute limit: its prompt (estimated) and its output cap."""
    cap = next((request[k] for k in ("max_tokens", "max_completion_tokens", "max_output_tokens") if request.get(k)), 0)
    return body_size // CHARS_PER_TOKEN + (cap if isinstance(cap, int) else 0)


class Limiter:
    """One upstream's `RateLimit` as token buckets refilled continuously; `clock` and `sleep` are injectable."""

    def __init__(
        self,
        name: str,
        limit: RateLimit,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.name, self.limit, self.clock, self.sleep = name, limit, clock, sleep
        self.requests = limit.requests_per_minute or 0.0
        self.tokens = limit.tokens_per_minute or 0.0
        self.updated = clock()
        self.queued = 0
        self._turn = asyncio.Lock()

    def _refill(self) -> None:
        now = self.clock()
        minutes, self.updated = (now - self.updated) / 60, now
        if self.limit.requests_per_minute:
            self.requests = min(
                self.limit.requests_per_minute, self.requests + minutes * self.limit.requests_per_minute
            )
        if self.limit.tokens_per_minute:
            self.tokens = min(self.limit.tokens_per_minute, self.tokens + minutes * self.limit.tokens_per_minute)

    def _wait_s(self, tokens: float) -> float:
        """Seconds until both buckets hold what this call needs (0: now)."""
        waits = [0.0]
        if self.limit.requests_per_minute and self.requests < 1:
            waits.append((1 - self.requests) * 60 / self.limit.requests_per_minute)
        if self.limit.tokens_per_minute and self.tokens < tokens:
            waits.append((tokens - self.tokens) * 60 / self.limit.tokens_per_minute)
        return max(waits)

    def _take(self, tokens: int) -> None:
        if self.limit.requests_per_minute:
            self.requests -= 1
        if self.limit.tokens_per_minute:
            self.tokens -= tokens

    async def acquire(self, tokens: int) -> None:
        """Return once the call may go (in arrival order); a 429 `GatewayError` when `max_queued` calls already wait."""
        tokens = min(tokens, int(self.limit.tokens_per_minute or tokens))  # a call bigger than a minute's budget
        if not self._turn.locked():
            self._refill()
            if self._wait_s(tokens) <= 0:
                self._take(tokens)
                return
        if self.queued >= self.limit.max_queued:
            raise GatewayError(
                429,
                f"upstream {self.name!r} is at its rate limit ({self._describe()}) and {self.queued} call(s) already "
                f"wait for it (max_queued={self.limit.max_queued}); retry later or raise the limit",
                "rate_limit_error",
                "rate_limited",
            )
        self.queued += 1
        try:
            async with self._turn:
                while True:
                    self._refill()
                    wait = self._wait_s(tokens)
                    if wait <= 0:
                        break
                    await self.sleep(wait)
                self._take(tokens)
        finally:
            self.queued -= 1

    def _describe(self) -> str:
        parts = [
            f"{value:g} {unit} per minute"
            for value, unit in (
                (self.limit.requests_per_minute, "requests"),
                (self.limit.tokens_per_minute, "tokens"),
            )
            if value
        ]
        return ", ".join(parts) or "no limit"


@dataclass
class ResponseCache:
    """Non-streamed answers by (upstream, API, request body), least recently used out past `max_entries`."""

    max_entries: int = CACHE_ENTRIES
    hits: int = 0
    _entries: OrderedDict[tuple[str, str, bytes], bytes] = field(default_factory=OrderedDict)

    def get(self, key: tuple[str, str, bytes]) -> bytes | None:
        payload = self._entries.get(key)
        if payload is not None:
            self._entries.move_to_end(key)
            self.hits += 1
        return payload

    def put(self, key: tuple[str, str, bytes], payload: bytes) -> None:
        self._entries[key] = payload
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


def check_cacheable(name: str, backend: Backend) -> None:
    """A cache only for upstreams that are not trained: one that returns token ids serves the policy."""
    if backend.cache and backend.asks_token_ids:
        raise ValueError(
            f"backend {name!r} has cache=True but returns token ids (system {backend.system!r}): it serves the "
            "policy, whose samples must never come from a cache; cache only judges and critics"
        )


def matching(model: str, patterns: Mapping[str, Any]) -> Any | None:
    """The value of the first glob pattern (`claude-*`) that `model` matches, in the order given."""
    for pattern, value in patterns.items():
        if fnmatch.fnmatchcase(model, pattern):
            return value
    return None


def is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


_BACKEND_FIELDS = {f.name for f in fields(Backend)}
_OPTIONS = {"models", "key_env", "requests_per_minute", "tokens_per_minute", "max_queued"}


_SPLIT_KEYS = {"arms", "share", "seed"}
_NUMBER = (int, float)
_KINDS: dict[str, tuple[Any, str]] = {
    **{key: (str, "a string") for key in ("url", "key_env", "model", "system", "tool_parser")},
    **{key: (bool, "true or false") for key in ("token_ids", "logprobs", "cache")},
    **{key: (_NUMBER, "a number of seconds") for key in ("connect_timeout_s", "first_byte_timeout_s", "timeout_s")},
    **{key: (_NUMBER, "a number per minute") for key in ("requests_per_minute", "tokens_per_minute")},
    "max_retries": (int, "a whole number"),
    "max_queued": (int, "a whole number"),
    "headers": (dict, "a table of header names and values"),
}
"""What each key of an `[upstreams.NAME]` table holds: a routing file set on a live gateway is checked whole."""
_POSITIVE = {"connect_timeout_s", "first_byte_timeout_s", "timeout_s"}


def load_routes(path: str | Path) -> dict[str, Backend | ABSplit]:
    """Model names and patterns → backends, and model names → A/B splits, from a TOML routing file (see the
    module's docstring); `Gateway(store, load_routes(path))` serves both."""
    try:
        table = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read the routing file {path}: {exc}") from None
    return parse_routes(table, path)


def parse_routes(table: Any, path: str | Path) -> dict[str, Backend | ABSplit]:
    """The same from a routing file already parsed (TOML, or the same tables as JSON: what
    `agentgrad gateway routes set` sends); `path` names it in errors."""
    if not isinstance(table, dict):
        raise ValueError(f"{path}: a routing file is a table with [upstreams.NAME] tables, not {type(table).__name__}")
    unknown = set(table) - {"upstreams", "ab"}
    if unknown:
        raise ValueError(f"{path}: unknown top-level keys {sorted(unknown)}; a routing file has upstreams and ab")
    upstreams = table.get("upstreams")
    if not isinstance(upstreams, dict) or not upstreams:
        raise ValueError(f"{path}: no [upstreams.NAME] tables; each names a url and the models it serves")
    if not all(isinstance(spec, dict) for spec in upstreams.values()):
        raise ValueError(f"{path}: each upstreams.NAME is a table with a url and the models it serves")
    splits = table.get("ab", {})
    if not isinstance(splits, dict):
        raise ValueError(f"{path}: ab is a table of splits, [ab.MODEL] with arms = [UPSTREAM, UPSTREAM]")
    arms = {arm for spec in splits.values() if isinstance(spec, dict) for arm in spec.get("arms") or []}
    missing = sorted(str(arm) for arm in arms if arm not in upstreams)
    if missing:
        raise ValueError(
            f"{path}: [ab] arms name {missing}, which are not [upstreams.NAME] tables: {sorted(upstreams)}"
        )
    routes: dict[str, Backend | ABSplit] = {}
    backends: dict[str, Backend] = {}
    for name, spec in upstreams.items():
        backends[name] = _backend(path, name, spec, arm=name in arms)
        for model in spec.get("models", []):
            if model in routes:
                raise ValueError(f"{path}: model {model!r} is routed twice (upstreams.{name} and another)")
            routes[model] = backends[name]
    for model, spec in splits.items():
        if model in routes:
            raise ValueError(f"{path}: model {model!r} is routed twice (ab.{model} and an upstream's models)")
        routes[model] = _split(path, model, spec, backends)
    return routes


def _backend(path: str | Path, name: str, spec: dict[str, Any], arm: bool) -> Backend:
    """The backend of one `[upstreams.NAME]` table; `arm`: an A/B split uses it, so it may serve no model itself."""
    unknown = set(spec) - _BACKEND_FIELDS - _OPTIONS
    if unknown:
        known = sorted((_BACKEND_FIELDS | _OPTIONS) - {"api_key", "rate_limit"})
        raise ValueError(f"{path}: upstreams.{name} has unknown keys {sorted(unknown)}; known: {known}")
    if "api_key" in spec:
        raise ValueError(f"{path}: upstreams.{name} holds a key; name its environment variable with key_env")
    models = spec.get("models", [] if arm else None)
    if not isinstance(models, list) or not (models or arm) or not all(isinstance(m, str) for m in models):
        raise ValueError(
            f"{path}: upstreams.{name}.models is a list of model names or patterns like 'claude-*' "
            "(it may be left out only by an upstream that is an arm of an [ab.MODEL] split)"
        )
    for key, value in spec.items():
        kind, shape = _KINDS.get(key, (object, ""))
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise ValueError(f"{path}: upstreams.{name}.{key} is {shape}, not {value!r}")
        if key in _POSITIVE and not value > 0:
            raise ValueError(f"{path}: upstreams.{name}.{key} is a number above 0, not {value!r}")
    options = {k: v for k, v in spec.items() if k in _BACKEND_FIELDS}
    if "key_env" in spec:
        options["api_key_env"] = spec["key_env"]
    limits = {k: spec[k] for k in ("requests_per_minute", "tokens_per_minute", "max_queued") if k in spec}
    try:
        backend = Backend(**options, rate_limit=RateLimit(**limits) if limits else None)
        check_cacheable(name, backend)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: upstreams.{name}: {exc}") from None
    return backend


def _split(path: str | Path, model: str, spec: Any, backends: Mapping[str, Backend]) -> ABSplit:
    """The A/B split of one `[ab.MODEL]` table over upstreams of the same file."""
    where = f"{path}: ab.{model}"
    if not isinstance(spec, dict):
        raise ValueError(f"{where} is a table: arms = [UPSTREAM, UPSTREAM], optional share and seed")
    if is_pattern(model):
        raise ValueError(f"{where}: a split serves one model name, not a pattern")
    unknown = set(spec) - _SPLIT_KEYS
    if unknown:
        raise ValueError(f"{where} has unknown keys {sorted(unknown)}; known: {sorted(_SPLIT_KEYS)}")
    arms = spec.get("arms")
    if not isinstance(arms, list) or not all(isinstance(a, str) for a in arms):
        raise ValueError(f'{where}.arms is a list of two upstream names, like arms = ["step-1", "step-3"]')
    share, seed = spec.get("share"), spec.get("seed", 0)
    if share is not None and not (
        isinstance(share, dict) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in share.values())
    ):
        raise ValueError(
            f"{where}.share is a table of arm shares, like share = {{ {arms[-1] if arms else 'b'} = 0.2 }}"
        )
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"{where}.seed is an integer, got {seed!r}")
    try:
        return ABSplit(model, {arm: backends[arm] for arm in arms}, share=share, seed=seed)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
