"""A deterministic OpenAI-compatible server that plays the ticket router's model, the critic and the editor.

It stands in for a paid LLM API in the APO tests, over real HTTP, so that some prompts truly
score higher than others:
- `agent-model` knows every ticket's team, but answers with a whole sentence unless the prompt
  asks for one word (FORMAT_RULE), and sends parcel refunds to billing unless the prompt says
  they go to shipping (REFUND_RULE). So: seed 0, with FORMAT_RULE 0.75-ish, with both rules 1.
- `critic-model` reads the failed runs it is shown and names the rule that is missing.
- `editor-model` edits along the critique, differently for each edit style APO asks for: the
  smallest change adds the right rule, an explicit rule adds a useless one, a whole rewrite
  drops the `{ticket}` placeholder (which APO must reject). Told why its rewrite cannot be used, it
  writes the same again, or with `repairs` set, puts the placeholder back on a last line.
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

FORMAT_RULE = "Answer with the team name only, in one word."
REFUND_RULE = "Refund requests for lost or damaged parcels go to shipping."
USELESS_RULE = "Be polite and concise."
MALFORMED_REPLIES = (
    ("I think the prompt is mostly fine, but it could be clearer.", "stop"),  # no markers
    ("", "stop"),  # empty
    ("<critique>The prompt should say <new_prompt>Which team", "length"),  # cut off
)


def is_parcel_refund(ticket: str, team: str) -> bool:
    return team == "shipping" and ("refund" in ticket or "money back" in ticket)


@dataclass
class FakeLLM:
    """The server's behaviour and what it was asked. `malformed[model]`: how many of the next replies of
    that model are malformed."""

    answers: dict[str, str]  # ticket -> team
    base_url: str = ""  # set once served
    malformed: dict[str, int] = field(default_factory=dict)
    leak_key: dict[str, int] = field(default_factory=dict)  # the next replies of a model quote its API key, unusably
    repairs: bool = False  # the editor, told its rewrite dropped a placeholder, puts it back
    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, model: str) -> list[str]:
        """The last user message of every request to `model`."""
        with self.lock:
            return [r["messages"][-1]["content"] for r in self.requests if r["model"] == model]

    def reply(self, model: str, messages: list[dict[str, Any]]) -> tuple[str, str]:
        prompt = messages[-1]["content"]
        with self.lock:
            if self.malformed.get(model, 0) > 0:
                self.malformed[model] -= 1
                earlier = sum(1 for r in self.requests if r["model"] == model) - 1  # this request is recorded already
                return MALFORMED_REPLIES[earlier % len(MALFORMED_REPLIES)]
        if model == "agent-model":
            return self.route(prompt), "stop"
        if model == "critic-model":
            return critique(prompt), "stop"
        if prompt.startswith("That template cannot be used"):
            return repair(messages, self.repairs), "stop"
        return edit(prompt), "stop"

    def route(self, prompt: str) -> str:
        ticket = next((t for t in self.answers if t in prompt), None)
        if ticket is None:
            return "I cannot find a ticket in your message."
        team = self.answers[ticket]
        if is_parcel_refund(ticket, team) and "lost or damaged parcels" not in prompt.lower():
            team = "billing"
        return team.capitalize() if "one word" in prompt.lower() else f"The {team} team should handle this ticket."


def critique(prompt: str) -> str:
    failures = prompt.split("## Failed runs", 1)[1]
    if "team should handle this ticket." in failures:  # an answer, not the prompt's own question
        text = "The agent answers with a whole sentence; the prompt should ask for the team name only, in one word."
    elif "refund" in failures or "money back" in failures:
        text = "Refunds for lost or damaged parcels are sent to billing; the prompt should say they belong to shipping."
    else:
        text = "I see no pattern in these failures."
    return f"Looking at the runs.\n<critique>\n{text}\n</critique>"


def edit(prompt: str) -> str:
    template = re.search(r"<template>\n(.*)\n</template>", prompt, re.S).group(1)  # type: ignore[union-attr]
    critique_text = prompt.split("## Critique\n", 1)[1].split("\n## How to edit", 1)[0]
    rule = FORMAT_RULE if "one word" in critique_text else REFUND_RULE if "parcels" in critique_text else USELESS_RULE
    if "smallest change" in prompt:
        new = f"{template}\n{rule}"
    elif "explicit rule" in prompt:
        new = f"{template}\n{USELESS_RULE}"
    else:  # a whole rewrite that forgets the ticket
        new = f"You route support tickets to billing, technical, account or shipping. {rule}"
    return f"Here is the new template:\n<new_prompt>\n{new}\n</new_prompt>"


def repair(messages: list[dict[str, Any]], repairs: bool) -> str:
    """The editor's answer to being told why its rewrite cannot be used: the same rewrite, or (`repairs`) with the
    original template's placeholder on a last line."""
    rewrite = re.search(r"<new_prompt>\n(.*)\n</new_prompt>", messages[-2]["content"], re.S).group(1)  # type: ignore[union-attr]
    original = re.search(r"<template>\n(.*)\n</template>", messages[1]["content"], re.S).group(1)  # type: ignore[union-attr]
    placeholder = re.search(r"\{\{ *ticket *\}\}|\{ticket\}", original).group(0)  # type: ignore[union-attr]
    new = f"{rewrite}\nTicket: {placeholder}" if repairs else rewrite
    return f"<new_prompt>\n{new}\n</new_prompt>"


def app(fake: FakeLLM) -> Starlette:
    async def chat_completions(request: Request) -> JSONResponse:
        body = await request.json()
        model = body.get("model")
        if model not in ("agent-model", "critic-model", "editor-model"):
            error = {"message": f"The model {model!r} does not exist", "type": "invalid_request_error",
                     "code": "model_not_found"}
            return JSONResponse({"error": error}, status_code=404)
        with fake.lock:
            fake.requests.append(body)
        content, finish_reason = fake.reply(model, body["messages"])
        with fake.lock:
            if fake.leak_key.get(model, 0) > 0:
                fake.leak_key[model] -= 1
                key = request.headers.get("authorization", "").removeprefix("Bearer ")
                content, finish_reason = f"I will not critique anything for key {key}.", "stop"
        return JSONResponse({
            "id": f"chatcmpl-{len(fake.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })

    return Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"])])
