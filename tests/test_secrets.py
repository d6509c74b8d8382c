"""Keys stay where they are configured: an upstream that echoes the gateway's key, or a backend URL
with a password in it, leaves no trace in the SQLite file, any API answer, any span or the log."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import httpx
import openai
import pytest

from agentgrad.gateway import Backend, Gateway
from agentgrad.redact import redact, remember_secret
from agentgrad.serving import ServerThread
from agentgrad.store import SqliteStore
from agentgrad.store.server import create_app
from tests.conftest import UPSTREAM_KEY, Upstream

URL_PASSWORD = "hunter2-url-password"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_no_key_appears_in_the_store_file_an_api_answer_a_span_or_the_log_when_an_upstream_echoes_it(
    tmp_path: Path, upstream: Upstream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    upstream.fake.echo_key_in_errors = True
    store = SqliteStore(tmp_path / "store.db")
    backends = {
        "policy": Backend(upstream.url, api_key_env="FAKE_UPSTREAM_KEY"),
        "gone": Backend(f"http://agent:{URL_PASSWORD}@127.0.0.1:{closed_port()}/v1"),  # unreachable
    }
    gateway = Gateway(store, backends, max_retries=1, retry_backoff_s=0.001)
    answers: list[str] = []
    with ServerThread(create_app(store, extra_routes=gateway.routes(), on_shutdown=[gateway.aclose])) as server:
        api = server.url + "/api"
        llm = {"resource_type": "llm", "base_url": server.url + "/v1", "model": "policy", "proxied": True,
               "api_key_env": "FAKE_UPSTREAM_KEY"}
        published = httpx.post(api + "/resources", json={"resources": {"llm": llm}})
        assert published.status_code == 200, published.text
        refused = httpx.post(api + "/resources", json={"resources": {"llm": {**llm, "api_key": UPSTREAM_KEY}}})
        assert refused.status_code == 422 and "api_key_env" in refused.text
        answers += [published.text, refused.text]

        rollout = asyncio.run(store.start_rollout("task"))
        route = f"{server.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"
        client = openai.OpenAI(base_url=route, api_key="agent-side", max_retries=0)
        upstream.fake.fail_next(503, times=2)  # retried once, then relayed: the upstream's text names the key
        upstream.fake.fail_next(400)
        for model in ("policy", "policy", "gone"):
            with pytest.raises(openai.APIStatusError) as failed:
                client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
            answers.append(failed.value.response.text)
        assert "for Bearer [redacted]" in answers[-3]  # the echo was there, and redacted
        assert "[redacted]@127.0.0.1" in answers[-1]
        asyncio.run(gateway.flush())
        for path in ("/resources", "/resources/latest", f"/rollouts/{rollout.rollout_id}", "/stats"):
            answers.append(httpx.get(api + path).text)
        answers.append(httpx.get(api + "/spans", params={"rollout_id": rollout.rollout_id}).text)
        spans = asyncio.run(store.query_spans(rollout.rollout_id))
    asyncio.run(store.close())

    assert [s.status.code for s in spans] == ["ERROR", "ERROR", "ERROR"]
    files = b"".join(path.read_bytes() for path in tmp_path.iterdir() if path.is_file())
    for secret in (UPSTREAM_KEY, URL_PASSWORD):
        assert secret.encode() not in files
        for text in answers + [s.model_dump_json() for s in spans] + [caplog.text]:
            assert secret not in text


def test_redact_removes_keys_tokens_url_passwords_and_remembered_secrets() -> None:
    remember_secret("plain-configured-secret-42")
    text = redact(
        "upstream said: key sk-proj-AbC123xyz789 is invalid; Authorization: Bearer eyJhbGciOi.J9.sig "
        "at https://bob:pa55word@api.example/v1?api_key=AIzaSyX&x=1 (plain-configured-secret-42)"
    )
    for leaked in ("sk-proj-AbC123xyz789", "eyJhbGciOi", "pa55word", "AIzaSyX", "plain-configured-secret-42"):
        assert leaked not in text
    assert "https://[redacted]@api.example/v1" in text and "upstream said" in text
    assert redact("model 'policy' answered 503: overloaded") == "model 'policy' answered 503: overloaded"


@pytest.mark.parametrize(("stream", "chunk_chars"), [(False, 1000), (True, 1000), (True, 4), (True, 1)],
                         ids=["plain", "streamed whole", "streamed in 4-character pieces", "streamed a character at a time"])
def test_a_key_the_upstream_echoes_in_a_200_answer_reaches_neither_the_agent_nor_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool, chunk_chars: int
) -> None:
    from tests.fake_upstream import FakeUpstream

    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    fake = FakeUpstream(api_key=UPSTREAM_KEY, chunk_chars=chunk_chars)
    fake.echo_key_in_answers = True
    store = SqliteStore(tmp_path / "store.db")
    with ServerThread(fake.app) as up:
        gateway = Gateway(store, {"policy": Backend(up.url + "/v1", api_key_env="FAKE_UPSTREAM_KEY", system="vllm")})
        with ServerThread(create_app(store, extra_routes=gateway.routes(), on_shutdown=[gateway.aclose])) as server:
            rollout = asyncio.run(store.start_rollout("task"))
            route = f"{server.url}/rollouts/{rollout.rollout_id}/attempts/{rollout.attempt.attempt_id}/v1"
            client = openai.OpenAI(base_url=route, api_key="agent-side", max_retries=0)
            # the agent pastes the key into its request too: recorded redacted, in this direction as well
            messages = [{"role": "user", "content": f"hi, is {UPSTREAM_KEY} valid?"}]
            if stream:
                parts = client.chat.completions.create(model="policy", messages=messages, stream=True)  # type: ignore[call-overload]
                answer = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
            else:
                answer = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content
            asyncio.run(gateway.flush())
            shown = httpx.get(server.url + "/api/spans", params={"rollout_id": rollout.rollout_id}).text
        spans = asyncio.run(store.query_spans(rollout.rollout_id))
    asyncio.run(store.close())
    assert "(you called with Bearer [redacted])" in (answer or "")  # the echo was there
    (span,) = spans
    assert span.status.code == "OK" and "[redacted]" in span.attributes["gen_ai.output.messages"]
    assert "is [redacted] valid" in span.attributes["gen_ai.input.messages"]
    files = b"".join(path.read_bytes() for path in tmp_path.iterdir() if path.is_file())
    assert UPSTREAM_KEY.encode() not in files
    for text in (answer or "", shown, span.model_dump_json()):
        assert UPSTREAM_KEY not in text


def test_the_cli_redacts_every_log_line_and_console_message(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    import io

    from agentgrad.redact import RedactingConsole, redact_logs

    remember_secret("configured-secret-9876")
    redact_logs()
    later = io.StringIO()  # a handler configured after the CLI started (the runner's basicConfig) is covered too
    logger = logging.getLogger("agentgrad.somewhere")
    logger.addHandler(logging.StreamHandler(later))
    try:
        logger.warning("reply unusable: %r", "echo configured-secret-9876 sk-abcdef123456")
    finally:
        logger.handlers.clear()
    RedactingConsole().print("store at https://user:pa55word@host/api, key configured-secret-9876")
    out = capsys.readouterr().out
    for leaked in ("configured-secret-9876", "sk-abcdef123456", "pa55word"):
        assert leaked not in out + caplog.text + later.getvalue()
    assert out.count("[redacted]") == 2 and later.getvalue().count("[redacted]") == 2


def test_a_stream_is_held_back_only_while_its_text_may_begin_a_known_secret() -> None:
    import json

    from agentgrad.gateway.secrets import StreamRedactor

    remember_secret("zz-stream-secret-77")

    def event(text: str, index: int = 0) -> bytes:
        return f"data: {json.dumps({'choices': [{'index': index, 'delta': {'content': text}}]})}\n\n".encode()

    def content(out: bytes) -> str:
        return "".join(json.loads(line[5:])["choices"][0]["delta"]["content"]
                       for line in out.decode().split("\n\n") if line.startswith("data:"))

    redactor = StreamRedactor("chat.completions")
    assert redactor.push(event("say ")) == event("say ")  # nothing like a secret: relayed at once, as it came
    assert redactor.push(event("zz-str")) == b""  # may begin one: held
    assert redactor.push(event("ange")) == event("zz-str") + event("ange")  # did not: relayed unchanged
    assert redactor.push(event("zz-stream-se")) == b""
    assert content(redactor.push(event("cret-77 ok"))) == "[redacted] ok"  # completed: redacted, then relayed
    redactor.push(event("zz-stream"))
    redactor.push(event("zz-stream-secret-77", index=1))  # another choice, whole
    assert "[redacted]" in content(redactor.flush())  # the end of the stream: everything held goes
    tail = StreamRedactor("chat.completions")
    out = b"".join(tail.push(event(c)) for c in "x zz-stream-secret-77!") + tail.flush()
    assert content(out) == "x [redacted]!"
