"""Reading a server's `/metrics` as Prometheus would: its text parsed by `prometheus_client`'s own parser."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str, token: str | None = None) -> Samples:
    """Every sample `url/metrics` exposes, by (sample name, labels); fails on a refusal or text Prometheus
    would not parse."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    answer = httpx.get(url + "/metrics", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: Samples, sample: str, /, **labels: str) -> float:
    """The sample named `sample` with exactly `labels`; 0 when absent (a counter that never moved)."""
    return samples.get((sample, frozenset(labels.items())), 0.0)


def total(samples: Samples, sample: str, /, **labels: str) -> float:
    """The sum of the samples named `sample` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, found), v in samples.items() if n == sample and wanted <= found)
