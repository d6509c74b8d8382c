"""Route support tickets to a team: a small agent whose prompt APO improves.

The agent asks an OpenAI-compatible model which team should handle a ticket and gets reward 1
when the reply is exactly the team's name. The seed prompt does not say how to answer, nor that
a refund for a lost or damaged parcel is a shipping matter, so a model following it misses often;
APO's critic reads those misses and its editor writes the rules into the prompt.

    OPENAI_API_KEY=... agentgrad apo --base-url https://api.openai.com/v1 --model gpt-4o-mini

or from Python:

    trainer = ag.Trainer(ag.APO(rounds=3), n_runners=4,
                         resources={"prompt": seed_prompt, "llm": ag.LLM(base_url=..., model=..., api_key_env="OPENAI_API_KEY")})
    result = trainer.fit(route_ticket, train_data, val_data)   # result.prompt is the best prompt

The agent reads its prompt from the `prompt` resource, so it runs unchanged under `Baseline`.
This file is what `agentgrad apo --agent-file` expects: it defines `agent`, `seed_prompt`,
`train_data` and `val_data`.
"""

from __future__ import annotations

import functools
import random

from openai import OpenAI

import agentgrad as ag

TEAMS = ("billing", "technical", "account", "shipping")

ISSUES = {
    "billing": [
        "I was charged twice for my subscription this month",
        "my last invoice shows the wrong amount",
        "I want a refund for the annual plan I cancelled",
        "the VAT on my invoice is wrong",
        "my card was declined although it is valid",
        "please change the billing address on my invoices",
    ],
    "technical": [
        "the app crashes when I open the settings page",
        "I get error 500 when I upload a file",
        "the sync between my phone and my laptop stopped working",
        "the CSV export produces an empty file",
        "notifications no longer arrive on Android",
        "the dashboard loads forever since the last update",
    ],
    "account": [
        "I cannot log in since I changed my email address",
        "please delete my account and all my data",
        "I want to add a colleague to our team account",
        "the password reset link never arrives",
        "how do I turn on two-factor authentication",
        "I want to rename our organisation",
    ],
    "shipping": [
        "my parcel has not arrived after two weeks",
        "the tracking number does not work",
        "can you deliver to a pickup point instead of my home",
        "the courier left my package at the wrong address",
        "I need to change the delivery date",
        "how long does shipping to Canada take",
        # refunds for parcels: shipping handles them, which a model rarely guesses
        "I want a refund because my parcel arrived damaged",
        "the parcel was lost, please refund me",
        "the box came crushed and the items are broken, I want my money back",
        "my order never arrived and I want a refund",
        "half of the items were missing from the parcel, refund them please",
        "the package was stolen from my doorstep, can I get my money back",
    ],
}

FRAMES = ("Hi, {issue}.", "Hello support, {issue}. Thanks!", "{issue} - please help", "Urgent: {issue}!")

seed_prompt = ag.PromptTemplate(
    template="Which team should handle this support ticket: billing, technical, account or shipping?\n\n"
    "Ticket: {ticket}"
)


def tickets() -> list[dict[str, str]]:
    """Every ticket, in a fixed shuffled order: each issue in two phrasings."""
    data = [
        {"ticket": FRAMES[(i + k) % len(FRAMES)].format(issue=issue), "team": team}
        for team, issues in ISSUES.items()
        for i, issue in enumerate(issues)
        for k in (0, 2)
    ]
    random.Random(0).shuffle(data)
    return data


def answer_of(reply: str) -> str:
    """The reply as a team name: case, surrounding spaces and a final period do not matter."""
    return reply.strip().rstrip(".").strip().lower()


@functools.lru_cache(maxsize=64)
def openai_client(base_url: str, api_key: str) -> OpenAI:
    """One client per endpoint, shared by the rollouts: making one costs ~25 ms of CPU."""
    return OpenAI(base_url=base_url, api_key=api_key)


@ag.rollout
def route_ticket(task: dict, prompt: ag.PromptTemplate, llm: ag.LLM) -> float:
    """Ask the model which team handles the ticket; reward 1 for exactly the right team's name."""
    client = openai_client(llm.base_url, llm.api_key)
    with ag.operation("route", ticket=task["ticket"]) as op:
        reply = client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": prompt.format(ticket=task["ticket"])}],
            **llm.sampling_parameters,
        )
        text = reply.choices[0].message.content or ""
        op.set_output(text)
    return 1.0 if answer_of(text) == task["team"] else 0.0


# what `agentgrad apo --agent-file` reads
agent = route_ticket
train_data = tickets()[:36]
val_data = tickets()[36:]
