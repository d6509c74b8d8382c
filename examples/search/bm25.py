"""The search tool: Okapi BM25 over the corpus's articles, in memory, deterministic (ties go to the earlier title)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from examples.search.corpus import Article

_WORD = re.compile(r"[a-z0-9]+")
STOPWORDS = frozenset("a an and the of in is its what which who does do to for".split())


def tokenize(text: str) -> list[str]:
    """Lower-case words and numbers, stop words left out."""
    return [word for word in _WORD.findall(text.lower()) if word not in STOPWORDS]


class BM25:
    """Okapi BM25 (k1, b as usual) over the articles' titles and texts."""

    def __init__(self, documents: Sequence[Article], k1: float = 1.5, b: float = 0.75) -> None:
        self.documents = list(documents)
        self.k1, self.b = k1, b
        self.terms = [Counter(tokenize(f"{d.title} {d.text}")) for d in self.documents]
        self.lengths = [sum(t.values()) for t in self.terms]
        self.average_length = sum(self.lengths) / max(len(self.lengths), 1)
        frequency = Counter(term for terms in self.terms for term in terms)
        n = len(self.documents)
        self.idf = {term: math.log(1 + (n - df + 0.5) / (df + 0.5)) for term, df in frequency.items()}

    def score(self, query: str, index: int) -> float:
        terms, length = self.terms[index], self.lengths[index]
        total = 0.0
        for word in tokenize(query):
            count = terms.get(word, 0)
            if count:
                norm = self.k1 * (1 - self.b + self.b * length / self.average_length)
                total += self.idf[word] * count * (self.k1 + 1) / (count + norm)
        return total

    def search(self, query: str, k: int = 3) -> list[Article]:
        """The `k` best-scoring articles with a score above 0, best first."""
        scored = [(self.score(query, i), -i) for i in range(len(self.documents))]
        best = sorted((s for s in scored if s[0] > 0), reverse=True)[:k]
        return [self.documents[-i] for _, i in best]
