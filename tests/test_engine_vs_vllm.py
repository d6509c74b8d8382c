"""`benchmarks/engine_vs_vllm.py` measures both servers as a client sees them: every round sends the identical JSON
bodies to each over HTTP, the first server alternating from round to round and the prompts changing, and the engine
honours vLLM's `ignore_eos` and `return_token_ids`. Here against the engine's own server and a stand-in for vLLM that
records what it gets."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentgrad.engine.server import create_engine_app
from agentgrad.serving import ServerThread

pytestmark = pytest.mark.model

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "engine_vs_vllm.py"


def _benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("engine_vs_vllm", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _recording(app: Any, name: str, log: list[tuple[str, dict]]) -> Any:
    """`app`, with every request body it receives appended to `log` under `name`."""

    async def recorded(scope: dict, receive: Any, send: Any) -> None:
        chunks: list[bytes] = []

        async def tap() -> dict:
            message = await receive()
            if scope["type"] == "http" and message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body") and chunks[0]:
                    log.append((name, json.loads(b"".join(chunks))))
            return message

        await app(scope, tap, send)

    return recorded


async def _stand_in(request: Request) -> JSONResponse:
    """vLLM's answer to `/v1/completions` with `return_token_ids`: the new tokens' ids in each choice."""
    body = await request.json()
    return JSONResponse({"choices": [{"text": "", "token_ids": list(range(body["max_tokens"]))}]})


def test_both_servers_get_the_identical_requests_first_in_turn(engine: Any) -> None:
    bench = _benchmark()
    log: list[tuple[str, dict]] = []
    vllm = Starlette(routes=[Route("/v1/completions", _stand_in, methods=["POST"])])
    with (
        ServerThread(_recording(create_engine_app(engine), "engine", log)) as ours,
        ServerThread(_recording(vllm, "vllm", log)) as theirs,
        httpx.Client(timeout=300) as client,
    ):
        servers = [
            bench.Server("engine", ours.url + "/v1", None, "2"),
            bench.Server("vllm", theirs.url + "/v1", None, "1"),
        ]
        seconds, tokens = bench.interleaved(
            client, servers, lambda r: bench.bodies(engine.tokenizer, engine.name, 3, 40, 4, r), rounds=2
        )
    assert len(seconds) == 2 and all(set(s) == {"engine", "vllm"} for s in seconds)
    assert [name for name, _ in log] == ["engine"] * 3 + ["vllm"] * 6 + ["engine"] * 3  # round 2: vLLM first
    sent = [sorted(json.dumps(body, sort_keys=True) for _, body in log[i : i + 3]) for i in range(0, 12, 3)]
    assert sent[0] == sent[1] and sent[2] == sent[3]  # each round: the very same bodies to both
    assert sent[0] != sent[2]  # the next round's prompts are new: no prefix cache carries a round over
    body = log[0][1]
    assert len(body["prompt"]) == 40 and body["ignore_eos"] and body["return_token_ids"] and body["temperature"] == 0
    assert all(len(t) == 4 for t in tokens["engine"])  # exactly max_tokens: the engine honoured ignore_eos
