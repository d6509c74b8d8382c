"""Sampling draws from the distribution it reports, after temperature and top-p."""

from __future__ import annotations

import torch

from agentgrad.engine import SamplingParams
from agentgrad.engine.sampling import sample

LOGITS = torch.tensor([0.0, 1.0, 2.0, -1.0])


def draw(params: SamplingParams, n: int = 20_000) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    drawn = sample(LOGITS.repeat(n, 1), [params] * n, [None] * n)
    return drawn.tokens, drawn.logprobs


def test_tokens_follow_the_tempered_distribution_and_report_its_logprobs() -> None:
    for temperature in (1.0, 0.5):
        expected = torch.softmax(LOGITS / temperature, -1)
        tokens, logprobs = draw(SamplingParams(temperature=temperature))
        frequencies = torch.bincount(tokens, minlength=4).float() / len(tokens)
        assert torch.allclose(frequencies, expected, atol=0.015)
        assert torch.allclose(logprobs, expected.log()[tokens], atol=1e-6)


def test_top_p_keeps_the_smallest_set_reaching_p_and_renormalizes() -> None:
    # probabilities 0.644, 0.237, 0.087, 0.032: top_p 0.8 keeps the first two
    tokens, logprobs = draw(SamplingParams(top_p=0.8))
    assert set(tokens.tolist()) == {1, 2}
    kept = torch.softmax(LOGITS[[1, 2]], -1)
    frequencies = torch.bincount(tokens, minlength=4).float()[[1, 2]] / len(tokens)
    assert torch.allclose(frequencies, kept, atol=0.015)
    assert torch.allclose(logprobs.exp(), torch.where(tokens == 2, kept[1], kept[0]), atol=1e-6)


def test_greedy_takes_the_argmax_and_seeds_repeat() -> None:
    tokens, _ = draw(SamplingParams(temperature=0), n=5)
    assert tokens.tolist() == [2] * 5
    runs = [sample(LOGITS.repeat(3, 1), [SamplingParams(seed=9)] * 3, [torch.Generator().manual_seed(9 + i) for i in range(3)]).tokens
            for _ in range(2)]
    assert runs[0].tolist() == runs[1].tolist()
