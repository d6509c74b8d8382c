"""The gateway, driven by the real `openai` client, in front of a fake OpenAI-compatible upstream."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from agentgrad.gateway import Backend, Gateway, parse_backend
from agentgrad.rollout.gateway_env import GatewayEnvHook
from agentgrad.rollout.runner import Runner
from agentgrad.semconv import is_llm_call, recorded_choices
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from agentgrad.types import LLM, Span
from tests.conftest import UPSTREAM_KEY, Served, Upstream
from tests.fake_upstream import VERSION, FakeUpstream, logprob, render

CLIENT_KEY = "sk-agent-side-key-5678"


def client(base_url: str, **kwargs: object) -> openai.OpenAI:
    options: dict[str, object] = {"max_retries": 0, **kwargs}
    return openai.OpenAI(base_url=base_url, api_key=CLIENT_KEY, **options)  # type: ignore[arg-type]


async def llm_spans_of(served: Served, rollout_id: str | None) -> list[Span]:
    await served.gateway.flush()
    return [s for s in await served.store.query_spans(rollout_id) if is_llm_call(s)]


async def test_a_chat_call_is_recorded_with_token_ids_logprobs_usage_and_version(served: Served) -> None:
    store = served.store
    rollout = await store.start_rollout("task")
    route = f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    answer = client(route).chat.completions.create(model="policy", messages=messages, temperature=0.5, max_tokens=20)

    assert answer.choices[0].message.content == "echo: hi there"
    raw = answer.model_dump()  # the client gets what it asked for: nothing the gateway added
    assert raw["choices"][0]["logprobs"] is None and "token_ids" not in str(raw)

    (span,) = await llm_spans_of(served, rollout.rollout_id)
    a = span.attributes
    assert span.attempt_id == rollout.attempt.attempt_id and span.name == "chat policy" and span.status.code == "OK"
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.system"] == "vllm"
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "policy"
    assert a["gen_ai.request.temperature"] == 0.5 and a["gen_ai.request.max_tokens"] == 20
    assert json.loads(a["gen_ai.input.messages"]) == messages
    assert json.loads(a["gen_ai.output.messages"]) == [{"role": "assistant", "content": "echo: hi there"}]
    assert a["gen_ai.response.finish_reasons"] == ["stop"] and a["gen_ai.response.id"] == "chatcmpl-fake"
    assert a["agentgrad.llm.prompt_token_ids"] == list(render(messages).encode())
    assert bytes(a["agentgrad.llm.response_token_ids"]).decode() == "echo: hi there"
    assert a["agentgrad.llm.response_logprobs"] == [logprob(b) for b in b"echo: hi there"]
    assert a["gen_ai.usage.input_tokens"] == len(render(messages)) and a["gen_ai.usage.output_tokens"] == 14
    assert a["agentgrad.llm.weights_version"] == VERSION and a["agentgrad.llm.latency_ms"] > 0
    assert a["server.address"] == "127.0.0.1"


async def test_a_client_that_asks_for_logprobs_and_token_ids_gets_them(served: Served, upstream: Upstream) -> None:
    answer = client(served.url + "/v1").chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "x"}],
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    raw = answer.model_dump()
    assert [e["logprob"] for e in raw["choices"][0]["logprobs"]["content"]] == [logprob(b) for b in b"echo: x"]
    assert raw["choices"][0]["token_ids"] == list(b"echo: x") and raw["prompt_token_ids"] == list(b"<user>x")
    assert upstream.fake.requests[-1]["logprobs"] is True and upstream.fake.requests[-1]["return_token_ids"] is True


async def test_a_stream_reaches_the_client_chunk_by_chunk_and_is_recorded_whole(
    served: Served, upstream: Upstream
) -> None:
    gate = upstream.fake.stream_gate = threading.Event()
    rollout = await served.store.start_rollout("task")
    route = f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"
    stream = client(route).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "stream me please"}], stream=True
    )
    chunks = iter(stream)
    first_pieces = [next(chunks).choices[0].delta.content, next(chunks).choices[0].delta.content]
    assert not gate.is_set()  # the upstream is still holding the rest back: nothing was buffered
    gate.set()
    rest = list(chunks)
    assert all(c.choices for c in rest)  # the usage chunk the gateway asked for is not passed on
    text = "".join(filter(None, first_pieces + [c.choices[0].delta.content for c in rest]))
    assert text == "echo: stream me please"
    assert all(c.choices[0].logprobs is None for c in rest)
    assert upstream.fake.requests[-1]["stream_options"] == {"include_usage": True}

    (span,) = await llm_spans_of(served, rollout.rollout_id)
    a = span.attributes
    assert a["agentgrad.llm.stream"] is True
    assert json.loads(a["gen_ai.output.messages"]) == [{"role": "assistant", "content": text}]
    assert bytes(a["agentgrad.llm.response_token_ids"]).decode() == text
    assert a["agentgrad.llm.response_logprobs"] == [logprob(b) for b in text.encode()]
    assert a["agentgrad.llm.prompt_token_ids"] == list(b"<user>stream me please")
    assert a["gen_ai.usage.output_tokens"] == len(text) and a["gen_ai.response.finish_reasons"] == ["stop"]
    assert 0 < a["agentgrad.llm.time_to_first_token_ms"] <= a["agentgrad.llm.latency_ms"]


async def test_a_streamed_tool_call_is_assembled_from_its_pieces(served: Served) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    stream = client(served.url + "/v1").chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "add 12 and 30"}],
        tools=tools,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].choices == []  # asked for by the client: kept
    (span,) = await llm_spans_of(served, None)
    (message,) = json.loads(span.attributes["gen_ai.output.messages"])
    assert message["tool_calls"] == [
        {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 12, "b": 30}'}}
    ]
    assert json.loads(span.attributes["gen_ai.tool.definitions"]) == tools
    assert span.attributes["gen_ai.response.finish_reasons"] == ["tool_calls"]


async def test_each_of_n_choices_keeps_its_own_token_ids_and_logprobs(served: Served) -> None:
    answer = client(served.url + "/v1").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "q"}], n=3
    )
    assert [c.message.content for c in answer.choices] == [f"{i}: echo: q" for i in range(3)]
    (span,) = await llm_spans_of(served, None)
    assert span.attributes["agentgrad.llm.n"] == 3 and span.attributes["gen_ai.request.choice.count"] == 3
    choices = recorded_choices(span)
    assert [bytes(c.response_token_ids or []).decode() for c in choices] == [f"{i}: echo: q" for i in range(3)]
    assert [c.response_logprobs for c in choices] == [[logprob(b) for b in f"{i}: echo: q".encode()] for i in range(3)]
    assert all(c.prompt_token_ids == list(b"<user>q") and c.finish_reason == "stop" for c in choices)
    assert [c.message["content"] for c in choices] == [f"{i}: echo: q" for i in range(3)]  # type: ignore[index]


async def test_completions_plain_and_streamed_record_the_legacy_logprobs(served: Served) -> None:
    oai = client(served.url + "/v1")
    plain = oai.completions.create(model="policy", prompt="2+2=", n=2, max_tokens=5)
    assert [c.text for c in plain.choices] == ["0: echo: 2+2=", "1: echo: 2+2="] and plain.choices[0].logprobs is None
    streamed = "".join(c.choices[0].text for c in oai.completions.create(model="policy", prompt="ab", stream=True))
    assert streamed == "echo: ab"
    first, second = await llm_spans_of(served, None)
    assert first.name == "text_completion policy" and first.attributes["agentgrad.llm.prompt"] == "2+2="
    assert [bytes(c.response_token_ids or []).decode() for c in recorded_choices(first)] == [
        "0: echo: 2+2=",
        "1: echo: 2+2=",
    ]
    assert recorded_choices(first)[1].response_logprobs == [logprob(b) for b in b"1: echo: 2+2="]
    assert second.attributes["agentgrad.llm.prompt_token_ids"] == list(b"ab")
    assert bytes(second.attributes["agentgrad.llm.response_token_ids"]).decode() == "echo: ab"
    assert second.attributes["agentgrad.llm.response_logprobs"] == [logprob(b) for b in b"echo: ab"]


async def test_429_and_5xx_are_retried_until_the_upstream_answers(served: Served, upstream: Upstream) -> None:
    upstream.fake.fail_next(503)
    upstream.fake.fail_next(429, headers={"retry-after": "0"})
    answer = client(served.url + "/v1").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "x"}]
    )
    assert answer.choices[0].message.content == "echo: x" and len(upstream.fake.requests) == 3
    (span,) = await llm_spans_of(served, None)
    assert span.status.code == "OK" and span.attributes["agentgrad.llm.retries"] == 2


async def test_an_upstream_that_keeps_failing_gives_the_agent_an_openai_error_and_an_error_span(
    served: Served, upstream: Upstream
) -> None:
    upstream.fake.fail_next(503, times=10)
    with pytest.raises(openai.InternalServerError) as caught:  # the client's own retries are told off
        client(served.url + "/v1", max_retries=2).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.status_code == 503 and "fake upstream failure 503" in caught.value.message
    assert len(upstream.fake.requests) == served.gateway.max_retries + 1
    (span,) = await llm_spans_of(served, None)
    assert span.status.code == "ERROR" and "fake upstream failure 503" in (span.status.description or "")
    assert span.attributes["agentgrad.llm.retries"] == served.gateway.max_retries
    assert json.loads(span.attributes["gen_ai.input.messages"]) == [{"role": "user", "content": "x"}]


async def test_a_client_error_upstream_is_passed_back_with_its_reason_at_once(
    served: Served, upstream: Upstream
) -> None:
    upstream.fake.fail_next(400)
    with pytest.raises(openai.BadRequestError) as caught:
        client(served.url + "/v1").chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["message"].endswith("max_tokens must be at least 1")  # type: ignore[index]
    assert caught.value.code == "bad_max_tokens" and len(upstream.fake.requests) == 1


async def test_an_unreachable_upstream_is_a_502_that_names_it() -> None:
    store = MemoryStore()
    gateway = Gateway(store, {"gone": "http://127.0.0.1:9/v1"}, retry_backoff_s=0.001, max_retries=1)
    with ServerThread(gateway) as server:
        with pytest.raises(openai.APIStatusError) as caught:
            client(server.url + "/v1").chat.completions.create(
                model="gone", messages=[{"role": "user", "content": "x"}]
            )
        assert (
            caught.value.status_code == 502
            and "'gone' at http://127.0.0.1:9/v1/chat/completions is unreachable" in caught.value.message
        )
        await gateway.flush()
        (span,) = await store.query_spans(None)
        assert span.status.code == "ERROR" and span.attributes["error.type"] == "upstream_unreachable"


async def test_an_unknown_model_is_a_404_listing_the_known_ones(served: Served) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client(served.url + "/v1").chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert "model 'gpt-9' is not served by this gateway; known models: ['policy']" in caught.value.message
    assert caught.value.code == "model_not_found"
    assert [m.id for m in client(served.url + "/v1").models.list()] == ["policy"]


async def test_a_default_backend_serves_every_other_model_under_its_upstream_name(upstream: Upstream) -> None:
    gateway = Gateway(MemoryStore(), default=Backend(upstream.url, api_key=UPSTREAM_KEY, model="served-name"))
    with ServerThread(gateway) as server:
        answer = client(server.url + "/v1").chat.completions.create(
            model="anything", messages=[{"role": "user", "content": "x"}]
        )
    assert answer.model == "served-name" and upstream.fake.requests[-1]["model"] == "served-name"


async def test_api_keys_and_authorization_headers_never_reach_a_span(served: Served, upstream: Upstream) -> None:
    rollout = await served.store.start_rollout("task")
    route = f"{served.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"
    client(route).chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    list(
        client(route).chat.completions.create(model="policy", messages=[{"role": "user", "content": "y"}], stream=True)
    )
    upstream.fake.fail_next(503, times=10)
    with pytest.raises(openai.InternalServerError):
        client(route).chat.completions.create(model="policy", messages=[{"role": "user", "content": "z"}])
    spans = await llm_spans_of(served, rollout.rollout_id)
    assert len(spans) == 3
    dumped = json.dumps([s.model_dump() for s in spans])
    assert UPSTREAM_KEY not in dumped and CLIENT_KEY not in dumped and "Bearer" not in dumped
    # the upstream got the gateway's key, never the agent's
    assert {h["authorization"] for h in upstream.fake.headers} == {f"Bearer {UPSTREAM_KEY}"}
    assert UPSTREAM_KEY not in repr(served.gateway.__dict__) and UPSTREAM_KEY not in repr(
        Backend("http://x/v1", api_key=UPSTREAM_KEY)
    )


async def test_concurrent_calls_land_in_their_rollouts_by_path_and_by_header(served: Served) -> None:
    store = served.store
    rollouts = [await store.start_rollout(i) for i in range(8)]

    shared = client(served.url + "/v1")  # with_options copies share its connection pool

    def call(i: int) -> None:
        r = rollouts[i % len(rollouts)]
        if i % 2:
            oai = shared.with_options(
                base_url=f"{served.url}/rollouts/{r.rollout_id}/attempts/{r.attempt.attempt_id}/v1"
            )
        else:
            oai = shared.with_options(
                default_headers={"x-agentgrad-rollout-id": r.rollout_id, "x-agentgrad-attempt-id": r.attempt.attempt_id}
            )
        stream = i % 3 == 0
        result = oai.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": f"{r.rollout_id} call {i}"}], stream=stream
        )
        if stream:
            list(result)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(call, range(64)))
    client(served.url + "/v1").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "nobody's"}]
    )

    for r in rollouts:
        spans = await llm_spans_of(served, r.rollout_id)
        assert len(spans) == 8
        for span in spans:
            (message,) = json.loads(span.attributes["gen_ai.input.messages"])
            assert message["content"].startswith(r.rollout_id + " call ")
            assert span.attempt_id == r.attempt.attempt_id
    (outside,) = await llm_spans_of(served, None)
    assert outside.rollout_id is None and "nobody's" in outside.attributes["gen_ai.input.messages"]


async def test_a_call_routed_to_an_unknown_attempt_is_kept_outside_any_rollout(served: Served) -> None:
    real = await served.store.start_rollout("task")
    oai_bad = client(f"{served.url}/rollouts/ro-nope/attempts/at-nope/v1")
    oai_good = client(f"{served.url}/rollouts/{real.rollout_id}/attempts/{real.attempt.attempt_id}/v1")
    await asyncio.gather(
        *[
            asyncio.to_thread(o.chat.completions.create, model="policy", messages=[{"role": "user", "content": "x"}])
            for o in (oai_bad, oai_good, oai_bad, oai_good)
        ]
    )
    assert len(await llm_spans_of(served, real.rollout_id)) == 2  # the bad route did not take its batch down
    outside = await llm_spans_of(served, None)
    assert len(outside) == 2 and all(s.attributes["agentgrad.rollout_id"] == "ro-nope" for s in outside)


def test_bad_requests_get_a_4xx_in_openai_shape_that_says_what_was_wrong(served: Served) -> None:
    url = served.url
    cases = [
        (httpx.post(url + "/v1/chat/completions", content=b"{not json"), 400, "not valid JSON"),
        (httpx.post(url + "/v1/chat/completions", json={"messages": []}), 400, "'model' string"),
        (httpx.post(url + "/v1/chat/completions", json=[1, 2]), 400, "JSON object"),
        (httpx.get(url + "/v1/chat/completions"), 405, "takes POST"),
        (httpx.post(url + "/v1/embeddings", json={"model": "policy"}), 404, "no gateway route"),
        (
            httpx.post(url + "/v1/chat/completions", json={"model": "policy"}, headers={"x-agentgrad-rollout-id": "r"}),
            400,
            "or neither",
        ),
    ]
    for response, status, message in cases:
        assert response.status_code == status, response.text
        assert message in response.json()["error"]["message"]


def test_a_body_over_the_limit_is_a_413(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agentgrad.gateway.app.MAX_BODY_BYTES", 1000)
    response = httpx.post(
        served.url + "/v1/chat/completions",
        json={"model": "policy", "messages": [{"role": "user", "content": "x" * 2000}]},
    )
    assert response.status_code == 413 and "limit of 1000 bytes" in response.json()["error"]["message"]


def test_with_a_token_calls_without_it_are_refused(upstream: Upstream) -> None:
    with ServerThread(
        Gateway(MemoryStore(), {"policy": Backend(upstream.url, api_key=UPSTREAM_KEY)}, token="tok")
    ) as server:
        with pytest.raises(openai.AuthenticationError, match="gateway's token as the API key"):
            client(server.url + "/v1").models.list()
        ok = openai.OpenAI(base_url=server.url + "/v1", api_key="tok").chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}]
        )
        assert ok.choices[0].message.content == "echo: x"


async def test_mounted_on_a_host_app_at_the_root_or_under_a_prefix(upstream: Upstream) -> None:
    store = MemoryStore()
    gateway = Gateway(store, {"policy": Backend(upstream.url, api_key=UPSTREAM_KEY)})
    host = Starlette(
        routes=[
            Route("/health", lambda request: PlainTextResponse("ok")),
            *gateway.routes(),
            Mount("/gateway", gateway),
        ]
    )
    rollout = await store.start_rollout("t")
    with ServerThread(host) as server:
        assert httpx.get(server.url + "/health").text == "ok"
        for base in (server.url + "/v1", server.url + "/gateway/v1"):
            llm = LLM(base_url=base, model="policy", proxied=True).for_attempt(
                rollout.rollout_id, rollout.attempt.attempt_id
            )
            openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key).chat.completions.create(
                model=llm.model, messages=[{"role": "user", "content": base}]
            )
        await gateway.flush()
        await gateway.aclose()  # what the host's lifespan does: mounted apps get no lifespan events
    spans = await store.query_spans(rollout.rollout_id)
    assert [json.loads(s.attributes["gen_ai.input.messages"])[0]["content"] for s in spans] == [
        server.url + "/v1",
        server.url + "/gateway/v1",
    ]


def test_backend_specs_from_the_command_line() -> None:
    name, backend = parse_backend("gpt=https://api.openai.com/v1,key_env=OPENAI_API_KEY,token_ids=false,system=openai")
    assert name == "gpt" and backend.url == "https://api.openai.com/v1" and backend.api_key_env == "OPENAI_API_KEY"
    assert backend.token_ids is False and backend.logprobs is None and not backend.asks_logprobs  # by system
    assert parse_backend("p=http://h:8000/v1,system=agentgrad")[1].asks_token_ids
    assert parse_backend("p=http://h:8000/v1,token_ids=true")[1].asks_token_ids
    with pytest.raises(ValueError, match="unknown option 'colour'"):
        parse_backend("m=http://h/v1,colour=red")
    with pytest.raises(ValueError, match="expected NAME=URL"):
        parse_backend("http://h/v1")


def test_a_backend_whose_key_variable_is_unset_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(ValueError, match=r"reads its API key from \$NO_SUCH_KEY_VAR, which is not set"):
        Gateway(MemoryStore(), {"m": Backend("http://h/v1", api_key_env="NO_SUCH_KEY_VAR")})


class SlowSpanWrites(MemoryStore):
    """A store slow enough to write LLM spans that any written "later" would miss their rollout's end."""

    async def add_spans(self, spans):  # type: ignore[no-untyped-def]
        if any(is_llm_call(s) for s in spans):
            await asyncio.sleep(0.3)
        return await super().add_spans(spans)


async def test_the_runner_hands_agents_their_route_and_has_the_gateway_spans_stored_before_the_attempt_ends(
    upstream: Upstream,
) -> None:
    store = SlowSpanWrites()
    with ServerThread(Gateway(store, {"policy": Backend(upstream.url, api_key=UPSTREAM_KEY)})) as server:
        await store.add_resources({"llm": LLM(base_url=server.url + "/v1", model="policy", proxied=True)})

        def agent(task: str, llm: LLM) -> float:
            oai = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
            answer = oai.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task}])
            return float(answer.choices[0].message.content == f"echo: {task}")

        queued = await store.enqueue_rollouts([{"input": f"task {i}"} for i in range(3)])
        await Runner(agent, store, max_rollouts=3, concurrency=3).run()
        for rollout in queued:
            finished = await store.get_rollout(rollout.rollout_id)
            assert finished.status.value == "succeeded" and finished.reward == 1.0
            (span,) = [s for s in await store.query_spans(rollout.rollout_id) if is_llm_call(s)]
            assert json.loads(span.attributes["gen_ai.input.messages"])[0]["content"] == rollout.input


async def test_a_stream_that_breaks_off_ends_with_an_openai_error_and_an_error_span_of_what_came(
    served: Served, upstream: Upstream
) -> None:
    upstream.fake.break_stream_after = 3
    stream = client(served.url + "/v1").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "a long answer"}], stream=True
    )
    received = []
    with pytest.raises(openai.APIError, match="broke off the stream"):
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    (span,) = await llm_spans_of(served, None)
    assert span.status.code == "ERROR" and span.attributes["error.type"] == "stream_interrupted"
    assert json.loads(span.attributes["gen_ai.output.messages"])[0]["content"] == "".join(received) != ""


async def test_the_env_hook_also_has_the_gateway_spans_stored_before_the_attempt_ends(
    upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    store = SlowSpanWrites()
    with ServerThread(Gateway(store, {"policy": Backend(upstream.url, api_key=UPSTREAM_KEY)})) as server:

        def agent(task: str) -> float:
            answer = openai.OpenAI().chat.completions.create(
                model="policy", messages=[{"role": "user", "content": task}]
            )
            return float(answer.choices[0].message.content == f"echo: {task}")

        (queued,) = await store.enqueue_rollouts([{"input": "task"}])
        await Runner(agent, store, hooks=[GatewayEnvHook(server.url + "/v1")], max_rollouts=1).run()
        assert (await store.get_rollout(queued.rollout_id)).reward == 1.0
        assert len([s for s in await store.query_spans(queued.rollout_id) if is_llm_call(s)]) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_a_strict_hosted_api_gets_exactly_the_request_the_client_sent_and_the_span_says_ids_are_absent(
    stream: bool,
) -> None:
    strict = FakeUpstream(api_key=UPSTREAM_KEY, strict=True)
    store = MemoryStore()
    with ServerThread(strict.app) as up:
        gateway = Gateway(store, {"gpt": Backend(up.url + "/v1", api_key=UPSTREAM_KEY)})  # system "openai"
        with ServerThread(gateway) as server:
            oai = client(server.url + "/v1")
            messages = [{"role": "user", "content": "hi"}]
            if stream:
                text = "".join(c.choices[0].delta.content or "" for c in oai.chat.completions.create(
                    model="gpt", messages=messages, stream=True) if c.choices)  # type: ignore[arg-type]
                reply = oai.responses.create(model="gpt", input="hi", stream=True)
                assert [e.type for e in reply][-1] == "response.completed"
            else:
                text = oai.chat.completions.create(model="gpt", messages=messages).choices[0].message.content or ""  # type: ignore[arg-type]
                assert oai.responses.create(model="gpt", input="hi").output_text == "echo: hi"
            assert text == "echo: hi"
            sent = {"model": "gpt", "messages": messages, **({"stream": True} if stream else {})}
            assert strict.requests[0] == sent
            assert strict.requests[1] == {"model": "gpt", "input": "hi", **({"stream": True} if stream else {})}
            await gateway.flush()
    spans = [s for s in await store.query_spans(None) if is_llm_call(s)]
    assert len(spans) == 2 and all(s.status.code == "OK" for s in spans)
    for span in spans:
        assert span.attributes["agentgrad.llm.token_ids_absent"] == "not_requested"
        assert "agentgrad.llm.response_token_ids" not in span.attributes


def test_the_strict_fake_refuses_what_openai_refuses_so_asking_it_for_token_ids_would_fail(upstream: Upstream) -> None:
    strict = FakeUpstream(strict=True)
    with ServerThread(strict.app) as up:
        with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: return_token_ids"):
            client(up.url + "/v1").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], extra_body={"return_token_ids": True})


async def test_an_upstream_asked_for_token_ids_that_returns_none_is_recorded_as_not_returned(
    upstream: Upstream,
) -> None:
    store = MemoryStore()
    gateway = Gateway(store, {"m": Backend(upstream.url, api_key=UPSTREAM_KEY, token_ids=True)}, retry_backoff_s=0.001)
    with ServerThread(gateway) as server:
        upstream.fake.drop_token_ids = True
        client(server.url + "/v1").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        await gateway.flush()
    (span,) = [s for s in await store.query_spans(None) if is_llm_call(s)]
    assert upstream.fake.requests[-1]["return_token_ids"] is True
    assert span.attributes["agentgrad.llm.token_ids_absent"] == "not_returned"
