"""Runners on another host reach the store and the gateway by the address the servers advertise.

The second host is a network namespace the test makes (`tests/netns.py`: `ip netns`, a veth pair, an address
of its own on each side): it shares no loopback with this one, so only what is served on the advertised
address is reachable from it, as from another machine.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentgrad import semconv as sc
from agentgrad.serving import Listen, ServerThread, free_port
from agentgrad.store.client import StoreClient
from agentgrad.train.trainer import Trainer
from agentgrad.types import LLM, RolloutStatus
from tests.fake_upstream import FakeUpstream
from tests.helpers import healthy, wait_until
from tests.netns import SecondHost
from tests.netns import second_host as make_second_host
from tests.postgres_server import fresh_schema_url

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
TOKEN = "hosts-apart-token-1234"


@pytest.fixture(scope="module")
def second_host() -> Iterator[SecondHost]:
    """A network namespace (`make test` installs iproute2; CI runs as root): without one, `NoSecondHost` fails the
    tests with what is missing, never skips them."""
    with make_second_host() as host:
        yield host


@pytest.mark.slow
def test_runners_on_a_second_host_reach_store_and_gateway_by_the_advertised_address(
    second_host: SecondHost, tmp_path: Path
) -> None:
    fake = FakeUpstream()
    with ServerThread(fake.app) as upstream:  # on this host's loopback: only the gateway reaches it
        port = free_port(second_host.here)
        url = f"http://{second_host.here}:{port}"
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentgrad.cli",
                "serve",
                "--store",
                fresh_schema_url(),
                "--host",
                second_host.here,
                "--port",
                str(port),
                "--token",
                TOKEN,
                "--default",
                upstream.url + "/v1",
            ],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        runner = None
        try:
            assert server.stdout is not None
            assert f"agentgrad store server on {url}/api/" in server.stdout.readline().decode()
            server_log: list[str] = []  # read on, so the pipe never fills; shown if the test fails
            threading.Thread(target=lambda: server_log.extend(line.decode() for line in server.stdout), daemon=True).start()
            wait_until(lambda: healthy(url), "the store server to start")
            loopback_probe = second_host.run(
                sys.executable,
                "-c",
                f"import socket; socket.create_connection(('127.0.0.1', {upstream.port}), 2)",
                stderr=subprocess.DEVNULL,
            )
            assert loopback_probe.wait(30) != 0  # this host's loopback is not the second host's
            runner_log = tmp_path / "runner.log"
            with runner_log.open("wb") as runner_err:  # the runner keeps its own copy of the file
                runner = second_host.run(
                    sys.executable,
                    "-m",
                    "agentgrad.cli",
                    "runner",
                    "--store",
                    url,
                    "--agent",
                    "tests.process_agents:asks_llm",
                    "--workers",
                    "2",
                    env={**ENV, "AGENTGRAD_TOKEN": TOKEN},
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=runner_err,
                )

            async def algorithm() -> list[tuple[str, float | None, list[str]]]:
                store = StoreClient(url, token=TOKEN)
                await store.add_resources({"llm": LLM(base_url=f"{url}/v1", model="policy", proxied=True)})
                rollouts = await store.enqueue_rollouts([{"input": {"q": f"question {i}"}} for i in range(6)])
                done = await store.wait_for_rollouts([r.rollout_id for r in rollouts], timeout=120)
                seen = []
                for rollout in done:
                    spans = await store.query_spans(rollout.rollout_id)
                    names = [
                        str(s.attributes.get(sc.GEN_AI_OPERATION, s.attributes.get(sc.MESSAGE_BODY, ""))) for s in spans
                    ]
                    seen.append((rollout.status.value, rollout.reward, names))
                await store.close()
                return seen

            seen = asyncio.run(algorithm())
        finally:
            for process in (runner, server):
                if process is not None:
                    process.terminate()
                    process.wait(30)
    assert len(seen) == 6
    logs = f"runner: {runner_log.read_text()[-2000:]}\nserver: {''.join(server_log)[-2000:]}"
    for status, reward, names in seen:
        assert (status, reward) == (RolloutStatus.SUCCEEDED.value, 1.0)
        assert "chat" in names, logs  # the gateway recorded the model call into the attempt (the runner's flush)
        assert any(name.startswith(f"{url}/rollouts/") for name in names)  # the URL the agent got: the advertised one
    assert len(fake.requests) == 6


def test_the_trainer_advertises_the_address_it_is_told_and_refuses_to_listen_beyond_loopback_without_a_token() -> None:
    trainer = Trainer(host="0.0.0.0", advertise="10.9.8.7", token=TOKEN, gateway_port=4999)
    assert trainer.gateway_url == "http://10.9.8.7:4999/v1"
    assert Trainer(gateway_port=4999).gateway_url == "http://127.0.0.1:4999/v1"
    with pytest.raises(ValueError, match="without a token"):
        Trainer(host="0.0.0.0")
    assert Listen("0.0.0.0", token=TOKEN).advertised not in ("0.0.0.0", "127.0.0.1")
