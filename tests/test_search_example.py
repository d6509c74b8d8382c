"""The search example's pieces: its corpus from the `countryinfo` package, BM25 retrieval over it, the agent's tools
and grader. The agent itself runs against a scripted upstream: search, read, answer, each a recorded call."""

from __future__ import annotations

import math
from typing import Any

import pytest

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.rollout.runner import Runner
from examples.search.agent import is_correct, read, search, search_agent
from examples.search.bm25 import BM25, tokenize
from examples.search.corpus import KINDS, Article, articles, make_splits
from tests.conftest import Served, Upstream


def test_the_corpus_is_every_country_with_the_four_asked_fields_in_a_fixed_order() -> None:
    corpus = articles()
    assert len(corpus) > 200 and [a.title for a in corpus] == sorted(a.title for a in corpus)
    norway = next(a for a in corpus if a.title == "Norway")
    assert norway.facts == {"capital": "Oslo", "calling_code": "47", "currency": "NOK", "domain": ".no"}
    assert all(value in norway.text for value in norway.facts.values())


def test_the_held_out_questions_are_about_countries_training_never_sees() -> None:
    train, val = make_splits()
    assert {q["country"] for q in train}.isdisjoint({q["country"] for q in val})
    assert len(val) == 4 * len({q["country"] for q in val}) and {q["kind"] for q in val} == set(KINDS)
    assert make_splits() == (train, val)  # deterministic


def test_bm25_ranks_the_article_a_question_names_first_for_every_held_out_question() -> None:
    index = BM25(articles())
    _, val = make_splits()
    assert all(index.search(q["question"], 1)[0].title == q["country"] for q in val)


def test_bm25_scores_as_okapi_bm25_by_hand_and_finds_nothing_for_unknown_words() -> None:
    documents = [Article("doc1", "apple banana", {}), Article("doc2", "apple cherry cherry", {})]
    index = BM25(documents)  # lengths 3 and 4 (titles count), average 3.5; k1 1.5, b 0.75
    tf_part = 2 * 2.5 / (2 + 1.5 * (0.25 + 0.75 * 4 / 3.5))
    assert index.score("cherry", 1) == pytest.approx(math.log(2) * tf_part)  # idf: ln(1 + 1.5 / 1.5)
    assert index.score("cherry", 0) == 0.0 and index.score("apple", 1) < index.score("cherry", 1)  # rarer: more
    assert [a.title for a in index.search("cherry apple")] == ["doc2", "doc1"]
    assert index.search("zzzz unknown") == []
    assert tokenize("What is the capital of Chad?") == ["capital", "chad"]


def test_the_tools_answer_as_the_agent_expects_and_answers_compare_loosely() -> None:
    assert search("calling code of Norway").startswith("Results: Norway")
    assert "Internet domain: .no." in read(" norway. ")
    assert read("Atlantis").startswith("There is no article titled 'Atlantis'")
    assert is_correct("+47", "47") and is_correct(" .No. ", ".no") and not is_correct(None, "47")


async def test_the_agent_searches_reads_and_answers_each_step_a_recorded_call(upstream: Upstream, served: Served) -> None:
    question = {"question": "What is the currency code of Peru?", "answer": "PEN"}
    for reply in ("search: currency Peru", "read: Peru", "Answer: PEN"):
        served_reply: dict[str, Any] = {"id": "c", "object": "chat.completion", "model": "policy", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}]}
        upstream.fake.answers.append(served_reply)
    store = served.store
    queued = await store.enqueue_rollout(question)
    llm = ag.LLM(base_url=served.url + "/v1", model="policy", proxied=True)
    await store.add_resources({"llm": llm})
    await Runner(search_agent, store, max_rollouts=1).run()
    await served.gateway.flush()
    rollout = await store.get_rollout(queued.rollout_id)
    spans = await store.query_spans(queued.rollout_id)
    calls = [s for s in spans if sc.is_llm_call(s)]
    assert rollout.reward == 1.0 and len(calls) == 3
    assert "Currency: PEN" in calls[-1].attributes[sc.GEN_AI_INPUT_MESSAGES]  # it read the article before answering
