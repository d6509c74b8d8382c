"""The engine served on loopback for the API tests (one server per test module)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from agentgrad.engine import Engine
from agentgrad.engine.server import create_engine_app
from agentgrad.serving import ServerThread


@pytest.fixture(scope="module")
def engine_url(engine: Engine) -> Iterator[str]:
    with ServerThread(create_engine_app(engine)) as server:
        yield server.url


@pytest.fixture(scope="module")
def api(engine_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine_url + "/v1", api_key="unused", max_retries=0, timeout=900)
