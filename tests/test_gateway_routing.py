"""Several upstreams behind one gateway: a routing file sends model names and patterns to their upstreams (both
recorded), a rate limit queues then refuses past its bound (on an injected clock), and the response cache answers
a judge again but is refused for the policy."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from agentgrad.gateway import Backend, Gateway
from agentgrad.gateway.ab import ABSplit
from agentgrad.gateway.routing import Limiter, load_routes
from agentgrad.gateway.upstreams import GatewayError, RateLimit
from agentgrad.semconv import is_llm_call
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from agentgrad.types import Span
from tests.fake_anthropic import KEY, FakeAnthropic
from tests.fake_judge import FakeJudge
from tests.fake_upstream import FakeUpstream

HELLO = [{"role": "user", "content": "hi"}]


def spans(gateway: Gateway, store: MemoryStore) -> list[Span]:
    """The calls recorded, read once the gateway's server stopped (its shutdown writes every span)."""
    return sorted((s for s in asyncio.run(store.query_spans(None)) if is_llm_call(s)), key=lambda s: s.start_time)


@pytest.fixture
def upstreams(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, str, FakeJudge]]:
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", KEY)
    judge = FakeJudge()
    with (
        ServerThread(FakeUpstream().app) as policy,
        ServerThread(FakeAnthropic().app) as claude,
        ServerThread(judge.app) as judges,
    ):
        yield policy.url + "/v1", claude.url + "/v1", judges.url + "/v1", judge


def test_a_routing_file_sends_two_models_to_two_upstreams_and_both_are_recorded(
    tmp_path: Path, upstreams: tuple[str, str, str, FakeJudge]
) -> None:
    policy, claude, _, _ = upstreams
    routes = tmp_path / "routes.toml"
    routes.write_text(f"""
[upstreams.policy]
url = "{policy}"
system = "vllm"
models = ["policy"]

[upstreams.claude]
url = "{claude}"
system = "anthropic"
key_env = "FAKE_ANTHROPIC_KEY"
models = ["claude-*"]
timeout_s = 30
max_retries = 1
requests_per_minute = 600
""")
    store = MemoryStore()
    gateway = Gateway(store, load_routes(routes))
    with ServerThread(gateway) as server:
        chat = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
            model="policy", messages=HELLO
        )  # type: ignore[arg-type]
        message = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0).messages.create(
            model="claude-haiku-4-5", max_tokens=16, messages=HELLO
        )  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
                model="gpt-4o", messages=HELLO
            )  # type: ignore[arg-type]
    assert chat.choices[0].message.content == "echo: hi" and message.content[0].text == "echo: hi"  # type: ignore[union-attr]
    first, second, _ = spans(gateway, store)
    assert first.attributes["gen_ai.system"] == "vllm" and first.attributes["agentgrad.llm.response_token_ids"]
    assert second.attributes["gen_ai.system"] == "anthropic"
    assert second.attributes["gen_ai.request.model"] == "claude-haiku-4-5"


TWO_ARMS = (
    '[upstreams.a]\nurl = "http://x/v1"\nmodel = "step-1"\n[upstreams.b]\nurl = "http://x/v1"\nmodel = "step-3"\n'
)
"""Two upstreams that serve no model of their own: the arms of an A/B split."""


def test_a_split_in_the_routing_file_serves_its_model_between_its_two_upstreams(tmp_path: Path) -> None:
    routes = tmp_path / "routes.toml"
    routes.write_text(TWO_ARMS + '[ab.policy]\narms = ["a", "b"]\nshare = { b = 0.25 }\nseed = 3\n')
    (split,) = load_routes(routes).values()
    assert isinstance(split, ABSplit) and split.arms == ["a", "b"] and split.share == {"a": 0.75, "b": 0.25}
    assert split.seed == 3 and split.upstreams["b"].backend.model == "step-3"
    assert Gateway(MemoryStore(), load_routes(routes)).models == ["policy"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[upstreams.a]\nurl = "http://x/v1"\nmodels = ["m"]\nrpm = 5', "unknown keys ['rpm']"),
        ('[upstreams.a]\nurl = "http://x/v1"\nmodels = ["m"]\napi_key = "sk-1"', "name its environment variable"),
        (
            '[upstreams.a]\nurl = "http://x/v1"\nmodels = ["m"]\n[upstreams.b]\nurl = "http://y/v1"\nmodels = ["m"]',
            "routed twice",
        ),
        (
            '[upstreams.a]\nurl = "http://x/v1"\nsystem = "vllm"\nmodels = ["m"]\ncache = true',
            "never come from a cache",
        ),
        (
            '[upstreams.a]\nurl = "http://x/v1"\nmodels = ["m"]\nrequests_per_minute = 0',
            "requests_per_minute is a number",
        ),
        ('[upstreams.a]\nurl = "http://x/v1"', "models is a list"),
        (f'{TWO_ARMS}[ab.policy]\narms = ["a", "c"]', "arms name ['c'], which are not [upstreams.NAME] tables"),
        ('[upstreams.a]\nurl = "http://x/v1"\n[ab.policy]\narms = ["a"]', "two arms"),
        (f'{TWO_ARMS}[ab.policy]\narms = ["a", "b"]\nshare = {{ b = 0.7, a = 0.7 }}', "add up to 1"),
        (f'{TWO_ARMS}[ab.policy]\narms = ["a", "b"]\nshares = {{ b = 0.5 }}', "unknown keys ['shares']"),
        (f'{TWO_ARMS}[ab."p-*"]\narms = ["a", "b"]', "not a pattern"),
        (f'{TWO_ARMS}[upstreams.c]\nurl = "http://z/v1"\n[ab.policy]\narms = ["a", "b"]', "upstreams.c.models"),
        (
            f'{TWO_ARMS}[upstreams.c]\nurl = "http://z/v1"\nmodels = ["policy"]\n[ab.policy]\narms = ["a", "b"]',
            "routed twice",
        ),
    ],
)
def test_a_bad_routing_file_is_refused_naming_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    routes = tmp_path / "routes.toml"
    routes.write_text(text)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_routes(routes)


class Clock:
    """Time that moves only when a waiting call sleeps (and then only once the test lets it)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.wake = asyncio.Event()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await self.wake.wait()
        self.now += seconds


async def test_a_rate_limit_queues_calls_past_it_then_refuses_past_its_bound() -> None:
    clock = Clock()
    limiter = Limiter("claude", RateLimit(requests_per_minute=2, max_queued=1), clock, clock.sleep)
    await limiter.acquire(10)
    await limiter.acquire(10)  # two a minute: both go at once
    third = asyncio.ensure_future(limiter.acquire(10))
    await asyncio.sleep(0)
    assert not third.done() and clock.sleeps == [30.0]  # queued until the bucket holds one more request
    with pytest.raises(GatewayError) as refused:
        await limiter.acquire(10)  # one already waits: past the bound
    assert refused.value.status == 429 and "max_queued=1" in refused.value.message
    clock.wake.set()
    await third
    assert clock.now == 30.0 and limiter.queued == 0


async def test_a_tokens_per_minute_limit_waits_for_the_tokens_a_call_needs() -> None:
    clock = Clock()
    clock.wake.set()
    limiter = Limiter("judge", RateLimit(tokens_per_minute=600, max_queued=4), clock, clock.sleep)
    await limiter.acquire(500)
    await limiter.acquire(400)  # 100 left: waits for 300 more, 30 s at 10 a second
    assert clock.sleeps == [pytest.approx(30.0)]


def test_a_gateway_refuses_a_call_past_a_full_rate_limit_with_a_recorded_429(
    upstreams: tuple[str, str, str, FakeJudge],
) -> None:
    _, _, judges, _ = upstreams
    store = MemoryStore()
    limited = Backend(judges, rate_limit=RateLimit(requests_per_minute=1, max_queued=0))
    gateway = Gateway(store, {"judge": limited})
    with ServerThread(gateway) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "## Response\nok"}])
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "## Response\nok"}])
    assert "rate limit (1 requests per minute)" in refused.value.message
    _, span = spans(gateway, store)
    assert span.attributes["error.type"] == "rate_limited" and span.attributes["http.response.status_code"] == 429


def test_the_cache_answers_a_judge_again_and_is_never_used_for_the_policy(
    upstreams: tuple[str, str, str, FakeJudge],
) -> None:
    policy, _, judges, fake = upstreams
    store = MemoryStore()
    gateway = Gateway(store, {"judge": Backend(judges, cache=True), "policy": Backend(policy, system="vllm")})
    ask = [{"role": "user", "content": "## Response\none two"}]
    with ServerThread(gateway) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        first = client.chat.completions.create(model="judge", messages=ask)  # type: ignore[arg-type]
        again = client.chat.completions.create(model="judge", messages=ask)  # type: ignore[arg-type]
        other = client.chat.completions.create(model="judge", messages=ask, temperature=0.5)  # type: ignore[arg-type]
        client.chat.completions.create(model="policy", messages=HELLO)  # type: ignore[arg-type]
        client.chat.completions.create(model="policy", messages=HELLO)  # type: ignore[arg-type]
    assert again.choices[0].message.content == first.choices[0].message.content and other.choices
    assert len(fake.requests) == 2  # the repeat came from the cache; a different request did not
    recorded = spans(gateway, store)
    assert [s.attributes.get("agentgrad.llm.cache_hit") for s in recorded] == [None, True, None, None, None]
    assert (
        json.loads(recorded[1].attributes["gen_ai.output.messages"])[0]["content"] == first.choices[0].message.content
    )
    assert gateway.cache.hits == 1
    with pytest.raises(ValueError, match="never come from a cache"):
        Gateway(store, {"policy": Backend(policy, system="vllm", cache=True)})
