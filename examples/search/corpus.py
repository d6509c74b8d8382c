"""The search agent's corpus and questions: one short article per country, from the data `countryinfo` ships.

The PyPI package `countryinfo` (MIT) holds a JSON file per country (capital, calling codes, currencies,
internet domains, region, population, area); nothing is fetched at run time. `articles()` writes one
article per country from those fields, in the same sentences for every country, so an answer is found
by reading, not by knowing: SmolLM2-135M knows a few capitals and no calling codes or domains.
`make_splits()` asks four kinds of question per country and splits by country, so no held-out
question is about a country training saw.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

KINDS = {  # kind -> (question, the article's field)
    "capital": ("What is the capital of {name}?", "capital"),
    "calling_code": ("What is the international calling code of {name}?", "calling_code"),
    "currency": ("What is the currency code of {name}?", "currency"),
    "domain": ("What is the internet domain of {name}?", "domain"),
}


@dataclass(frozen=True)
class Article:
    """One document of the corpus: a country's name (its title) and a few sentences about it."""

    title: str
    text: str
    facts: dict[str, str]


@cache
def articles() -> tuple[Article, ...]:
    """Every country with the four fields the questions ask about, sorted by name (deterministic)."""
    folder = files("countryinfo") / "data"
    found = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".json"):
            continue
        data: dict[str, Any] = json.loads(entry.read_text(encoding="utf-8"))
        if not all(data.get(key) for key in ("name", "capital", "callingCodes", "currencies", "tld", "subregion")):
            continue
        facts = {"capital": str(data["capital"]), "calling_code": str(data["callingCodes"][0]),
                 "currency": str(data["currencies"][0]), "domain": str(data["tld"][0])}
        text = (f"{data['name']} is a country in {data['subregion']}. Its capital is {facts['capital']}. "
                f"Population: {data.get('population', 'unknown')}. Calling code: +{facts['calling_code']}. "
                f"Currency: {facts['currency']}. Internet domain: {facts['domain']}.")
        found.append(Article(str(data["name"]), text, facts))
    return tuple(sorted(found, key=lambda a: a.title))


def make_splits(held_out_share: float = 0.3, seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) questions with gold answers, split by country; the same for the same seed."""
    countries = list(articles())
    random.Random(seed).shuffle(countries)
    cut = int(len(countries) * held_out_share)

    def questions(part: list[Article]) -> list[dict[str, Any]]:
        asked = [{"question": template.format(name=a.title), "answer": a.facts[field], "kind": kind, "country": a.title}
                 for a in part for kind, (template, field) in KINDS.items()]
        random.Random(seed + 1).shuffle(asked)
        return asked

    return questions(countries[cut:]), questions(countries[:cut])
