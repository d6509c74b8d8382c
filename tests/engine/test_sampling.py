"""Sampling draws from the distribution it reports, after temperature and top-p."""

from __future__ import annotations

from typing import Any

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


def test_a_rows_token_logprob_and_alternatives_do_not_depend_on_the_other_rows_of_its_batch() -> None:
    """Rows are sampled in blocks (`SAMPLE_CHUNK_ROWS`) with every setting mixed across a batch of 21: each row
    gives what it gives alone. Before, a row at top_p 1 lost its rounded-away tail when another row had top_p < 1."""
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(21, 5000, generator=generator) * 4
    settings = [
        SamplingParams(temperature=t, top_p=p, top_logprobs=k, seed=s)
        for t, p, k, s in zip([0.0, 1.0, 0.7, 1.3] * 6, [1.0, 0.9, 1.0] * 7, [0, 3, 5] * 7, range(21))
    ]
    masks = [(torch.rand(5000, generator=generator) < 0.2) if i % 5 == 2 else None for i in range(21)]

    def run(rows: list[int]) -> Any:
        return sample(logits[rows].clone(), [settings[i] for i in rows],
                      [torch.Generator().manual_seed(settings[i].seed or 0) for i in rows], allowed=[masks[i] for i in rows])

    together = run(list(range(21)))
    assert together.top_ids is not None and together.top_logprobs is not None
    assert len(set(together.tokens.tolist())) > 10  # not all argmax: the draws differ
    for i in range(21):
        alone = run([i])
        assert alone.tokens[0] == together.tokens[i] and alone.logprobs[0] == together.logprobs[i]
        assert alone.allowed[0] == together.allowed[i]
        k = settings[i].top_logprobs
        if k:
            assert alone.top_ids is not None and alone.top_logprobs is not None
            assert torch.equal(alone.top_logprobs[0], together.top_logprobs[i][:k])
            assert torch.equal(alone.top_ids[0], together.top_ids[i][:k])
