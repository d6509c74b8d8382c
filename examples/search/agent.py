"""A search agent: it searches the corpus, reads an article and answers, in several turns, with the `openai` client.

The agent knows nothing of training beyond `@ag.rollout` and the `llm` it is handed. It speaks a text
protocol that the small model copies from one worked exchange shown as earlier turns:

    search: <words>     the titles of the best articles (BM25, `bm25.py`) come back as the next user turn
    read: <title>       the article's text comes back
    Answer: <answer>    the end; the reward is 1 when it matches the gold answer

Up to `MAX_TURNS` model calls; a reply with none of the three ends the episode unanswered.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from openai import OpenAI

import agentgrad as ag
from examples.calc_agent import client_for
from examples.search.bm25 import BM25
from examples.search.corpus import articles

SYSTEM_PROMPT = ("Answer the question about a country. Write 'search: <words>' to find articles, "
                 "'read: <title>' to read one, and finally 'Answer: <answer>'.")
EXAMPLE: list[dict[str, str]] = [
    {"role": "user", "content": "What is the internet domain of Norway?"},
    {"role": "assistant", "content": "search: internet domain Norway"},
    {"role": "user", "content": "Results: Norway; Svalbard and Jan Mayen; Bouvet Island"},
    {"role": "assistant", "content": "read: Norway"},
    {"role": "user", "content": "Norway is a country in Northern Europe. Its capital is Oslo. Population: 5165800. "
                                "Calling code: +47. Currency: NOK. Internet domain: .no."},
    {"role": "assistant", "content": "Answer: .no"},
]
"""One worked exchange (search, read, answer) as earlier turns: the model copies its shape."""
MAX_TURNS = 4
SEARCH = re.compile(r"search:\s*(.+)", re.IGNORECASE)
READ = re.compile(r"read:\s*(.+)", re.IGNORECASE)
ANSWER = re.compile(r"Answer:\s*(.+)", re.IGNORECASE)
RESULTS = 3


@cache
def index() -> BM25:
    return BM25(articles())


def search(query: str) -> str:
    """The search tool's reply: the titles of the best articles."""
    found = index().search(query, RESULTS)
    return "Results: " + "; ".join(a.title for a in found) if found else "Results: nothing found"


def read(title: str) -> str:
    """The read tool's reply: the article of that title (case and spaces aside), or what went wrong."""
    wanted = " ".join(title.strip().strip(".'\"").lower().split())
    for article in articles():
        if article.title.lower() == wanted:
            return article.text
    return f"There is no article titled {title.strip()!r}; search first, then read one of the results."


def normalize(answer: str) -> str:
    """An answer as compared: lower case, spaces collapsed, a calling code's '+' and a trailing period dropped."""
    return " ".join(answer.strip().rstrip(".").lstrip("+").lower().split())


def is_correct(answer: str | None, gold: str) -> bool:
    return answer is not None and normalize(answer) == normalize(gold)


def run_episode(client: OpenAI, model: str, question: str, sampling: dict[str, Any]) -> tuple[str | None, list[str]]:
    """The agent's turns on one question: (its answer or None, the tools it used in order)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}, *EXAMPLE,
                                      {"role": "user", "content": question}]
    used: list[str] = []
    for _ in range(MAX_TURNS):
        response = client.chat.completions.create(model=model, messages=messages, **sampling)
        reply = (response.choices[0].message.content or "").strip()
        messages.append({"role": "assistant", "content": reply})
        first_line = reply.splitlines()[0] if reply else ""
        if answer := ANSWER.match(first_line):
            return answer.group(1).strip(), used
        if query := SEARCH.match(first_line):
            used.append("search")
            messages.append({"role": "user", "content": search(query.group(1))})
        elif title := READ.match(first_line):
            used.append("read")
            messages.append({"role": "user", "content": read(title.group(1))})
        else:
            return None, used
    return None, used


@ag.rollout
def search_agent(task: dict[str, Any], llm: ag.LLM) -> float:
    answer, used = run_episode(client_for(llm), llm.model, task["question"], dict(llm.sampling_parameters))
    ag.emit_annotation({"search.read_article": "read" in used, "search.answered": answer is not None})
    return 1.0 if is_correct(answer, task["answer"]) else 0.0
