"""A deterministic judge model behind an OpenAI-compatible chat endpoint (a hosted judge cannot be reached in tests).

It grades what `agentgrad.rollout.judging` asks in the format asked: a response scores one point per word,
up to 10, and the reply says so before its `SCORE` line(s). The model `mute-judge` forgets the
score; `forgetful-judge` scores every response of a group but the last. Every score it gave is kept
in `given`, every request (with its headers) in `requests`.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


def words(text: str) -> int:
    return min(len(text.split()), 10)


@dataclass
class FakeJudge:
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    given: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        with self.lock:
            self.requests.append(body)
            self.headers.append(dict(request.headers))
        prompt = body["messages"][-1]["content"]
        responses = re.split(r"### Response \d+\n", prompt.split("## Responses\n", 1)[1])[1:] if "## Responses\n" in prompt else None
        if responses is None:
            scores = [words(prompt.split("## Response\n", 1)[1])]
            lines = [f"SCORE: {scores[0]}"]
        else:
            scores = [words(r) for r in responses]
            lines = [f"SCORE {i}: {s}" for i, s in enumerate(scores, 1)]
            if body["model"] == "forgetful-judge":
                lines.pop()
        if body["model"] == "mute-judge":
            lines = []
        with self.lock:
            self.given.extend(scores[: len(lines)])
        text = "\n".join([f"One point per word: {scores}.", *lines])
        return JSONResponse({
            "id": f"chatcmpl-judge-{len(self.requests)}", "object": "chat.completion", "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(text), "total_tokens": len(prompt) + len(text)},
        })
