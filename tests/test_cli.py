"""The CLI as a user runs it: a subprocess on a store file."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

import agentgrad as ag
from agentgrad.serving import ServerThread
from agentgrad.store import SqliteStore
from tests.helpers import free_port


def agentgrad_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "agentgrad.cli", *args], capture_output=True, text=True, env=env, timeout=60)


def test_rollouts_ls_and_show_print_what_the_store_holds(tmp_path: Path) -> None:
    path = tmp_path / "run.db"

    def agent(task: dict) -> float:
        with ag.operation("solve", question=task["q"]) as op:
            op.set_output("4")
        if task["q"] == "boom":
            raise RuntimeError("exploded on purpose")
        return 1.0

    ag.Trainer(n_runners=2, store=SqliteStore(path)).fit(agent, [{"q": "2+2"}, {"q": "boom"}])
    rollouts = asyncio.run(SqliteStore(path).query_rollouts())

    listing = agentgrad_cli("rollouts", "ls", "--store", str(path))
    assert listing.returncode == 0, listing.stderr
    for rollout in rollouts:
        assert rollout.rollout_id in listing.stdout
    assert "succeeded" in listing.stdout and "failed" in listing.stdout and "1.000" in listing.stdout

    failed = next(r for r in rollouts if r.input["q"] == "boom")
    shown = agentgrad_cli("rollouts", "show", failed.rollout_id, "--store", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "RuntimeError: exploded on purpose" in shown.stdout
    assert "agentgrad.rollout" in shown.stdout and "solve" in shown.stdout and "agentgrad.exception" in shown.stdout
    assert '{"question": "boom"}' in shown.stdout

    only_failed = agentgrad_cli("rollouts", "ls", "--store", str(path), "--status", "failed")
    assert failed.rollout_id in only_failed.stdout and "succeeded " not in only_failed.stdout.split("by status")[0]


def test_serve_hosts_the_gateway_and_the_dashboard_next_to_the_store(tmp_path: Path, upstream) -> None:  # type: ignore[no-untyped-def]
    path, port = tmp_path / "served.db", free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "agentgrad.cli", "serve", "--store", str(path), "--port", str(port),
         "--backend", f"policy={upstream.url},key_env=FAKE_UPSTREAM_KEY"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "FAKE_UPSTREAM_KEY": "sk-upstream-secret-1234", "COLUMNS": "200"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/api/health").status_code == 200:
                    break
            except httpx.ConnectError:
                assert time.monotonic() < deadline and process.poll() is None, "the server did not come up"
                time.sleep(0.05)
        assert "<html" in httpx.get(url + "/").text.lower()
        reply = openai.OpenAI(base_url=url + "/v1", api_key="unused").chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content
    finally:
        process.terminate()
        out, err = process.communicate(timeout=30)
    assert "dashboard: " + url in out and "gateway: " + url + "/v1" in out, out + err
    spans = asyncio.run(SqliteStore(path).query_spans(None))  # the gateway flushed on shutdown
    assert [s.attributes["gen_ai.request.model"] for s in spans] == ["policy"]


def test_unknown_ids_and_missing_files_are_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    SqliteStore(path)
    missing = agentgrad_cli("rollouts", "show", "ro-nothere", "--store", str(path))
    assert missing.returncode == 2 and "no rollout with id 'ro-nothere'" in missing.stdout
    no_file = agentgrad_cli("rollouts", "ls", "--store", str(tmp_path / "absent.db"))
    assert no_file.returncode == 2 and "no store file" in no_file.stdout
    assert not (tmp_path / "absent.db").exists()


@pytest.mark.parametrize("routed_by", ["--backend", "--routes"])
def test_the_gateway_command_serves_records_into_a_store_file_and_flushes_on_shutdown(
    tmp_path: Path, routed_by: str
) -> None:
    from tests.fake_upstream import FakeUpstream

    path = tmp_path / "gateway.db"
    SqliteStore(path)
    port = free_port()
    fake = FakeUpstream(api_key="sk-from-env")
    model = "policy" if routed_by == "--backend" else "echo-policy"  # the routing file's pattern is echo-*
    with ServerThread(fake.app) as upstream:
        env = {**os.environ, "UPSTREAM_KEY": "sk-from-env"}
        if routed_by == "--backend":
            routing = ["--backend", f"policy={upstream.url}/v1,key_env=UPSTREAM_KEY"]
        else:
            (tmp_path / "routes.toml").write_text(
                f'[upstreams.echo]\nurl = "{upstream.url}/v1"\nkey_env = "UPSTREAM_KEY"\nmodels = ["echo-*"]\n'
                "timeout_s = 30\n"
            )
            routing = ["--routes", str(tmp_path / "routes.toml")]
        process = subprocess.Popen(
            [sys.executable, "-m", "agentgrad.cli", "gateway", "--store", str(path), "--port", str(port), *routing],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert process.stdout is not None
            assert "agentgrad gateway on http://127.0.0.1" in process.stdout.readline()
            for _ in range(200):  # the line is printed just before the server binds
                try:
                    httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
            assert client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}]).choices[0].message.content == "echo: hi"
        finally:
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    (span,) = asyncio.run(SqliteStore(path).query_spans(None))
    assert span.attributes["gen_ai.request.model"] == model and "sk-from-env" not in span.model_dump_json()


def test_the_gateway_command_refuses_other_hosts_without_a_token_and_bad_backends(tmp_path: Path) -> None:
    off_loopback = agentgrad_cli("gateway", "--store", "memory", "--host", "0.0.0.0", "--backend", "m=http://h/v1")
    assert off_loopback.returncode == 2 and "without a token" in off_loopback.stdout and "--token" in off_loopback.stdout
    bad = agentgrad_cli("gateway", "--store", "memory", "--backend", "http://h/v1")
    assert bad.returncode == 2 and "expected NAME=URL" in bad.stdout
    routes = tmp_path / "routes.toml"
    routes.write_text('[upstreams.hosted]\nurl = "http://h/v1"\napi_key = "sk-secret"\nmodels = ["m"]\n')
    keyed = agentgrad_cli("gateway", "--store", "memory", "--routes", str(routes))
    assert keyed.returncode == 2 and "key_env" in keyed.stdout and "sk-secret" not in keyed.stdout
    routes.write_text('[upstreams.hosted]\nurl = "http://h/v1"\nmodels = ["m"]\n')
    twice = agentgrad_cli("gateway", "--store", "memory", "--routes", str(routes), "--backend", "m=http://other/v1")
    assert twice.returncode == 2 and "routed by both" in twice.stdout
