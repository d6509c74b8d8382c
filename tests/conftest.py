"""Fixtures shared across the suite. The SmolLM2 engine is loaded once per session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    """SmolLM2-135M-Instruct in fp32 (sampling and training on the same weights), CPU."""
    from agentgrad.engine import Engine

    engine = Engine(sampling_dtype="float32", device="cpu")
    yield engine
    engine.close()
