"""Sampling one token per row, with the logprob RL needs as the behaviour policy's.

A row decoded under a grammar (JSON schema, forced tool call) is drawn from the model's
distribution with the tokens the grammar forbids masked out, but what is recorded for it is the
logprob of the sampled token under the model's own distribution at the temperature, before the
mask: the distribution a trainer recomputes (it has no grammar), so the PPO ratio compares two
logprobs of one policy. Positions where the grammar allowed a single token are reported
(`Sampled.allowed`) so the loss can leave them out: there the sampler had no choice to learn from.
See docs/constrained-decoding.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentgrad.engine.params import SamplingParams


@dataclass
class Sampled:
    tokens: torch.Tensor  # (rows,)
    logprobs: (
        torch.Tensor
    )  # (rows,): each token's logprob under the distribution it was drawn from (before a grammar mask)
    top_ids: torch.Tensor | None  # (rows, k): the k likeliest tokens of that distribution, when asked for
    top_logprobs: torch.Tensor | None
    allowed: list[int | None]  # per row, how many tokens its grammar allowed (1: forced); None without a grammar


def adjust(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    histories: Sequence[Sequence[int]],
    allowed: Sequence[torch.Tensor | None],
) -> torch.Tensor:
    """Logits after logit bias, presence/frequency penalties and grammar masks (`allowed`, bool per token), in place."""
    vocab = logits.shape[-1]
    for i, (p, history, mask) in enumerate(zip(params, histories, allowed)):
        if p.logit_bias:
            ids = torch.tensor([t for t in p.logit_bias if t < vocab], dtype=torch.long, device=logits.device)
            bias = torch.tensor(
                [b for t, b in p.logit_bias.items() if t < vocab], device=logits.device, dtype=logits.dtype
            )
            logits[i, ids] += bias
        if (p.presence_penalty or p.frequency_penalty) and history:
            counts = torch.bincount(torch.tensor(list(history), device=logits.device), minlength=vocab)[:vocab].to(
                logits.dtype
            )
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
        if mask is not None:
            logits[i].masked_fill_(~mask.to(logits.device), float("-inf"))
    return logits


SAMPLE_CHUNK_ROWS = 8
"""Rows sampled in one block: the passes over the vocabulary (softmax, cumulative sum, ...) then stay in
the core's cache (8 × 49,152 fp32 logits are 1.5 MiB); each row's result is the same whatever the block."""


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    histories: Sequence[Sequence[int]] | None = None,
    allowed: Sequence[torch.Tensor | None] | None = None,
) -> Sampled:
    """One token per row and its logprob under the distribution it was drawn from.

    The logits are first adjusted (`adjust`: bias, penalties). Temperature 0 is greedy (logprob
    under the adjusted distribution at temperature 1); otherwise logits are divided by the
    temperature and, with top_p < 1, cut to the smallest set of tokens whose probability reaches
    top_p, then renormalized. A row with a grammar mask (`allowed`) is drawn with the forbidden
    tokens masked out (before the top_p cut); its logprob and top alternatives are those of the
    unmasked distribution at the temperature (no top_p cut), the policy a trainer recomputes.
    Rows are computed in blocks of `SAMPLE_CHUNK_ROWS`, vectorized within a block.
    """
    masks = list(allowed or [None] * len(params))
    if any(p.logit_bias or p.presence_penalty or p.frequency_penalty for p in params):
        logits = adjust(logits, params, histories or [[] for _ in params], [None] * len(params))  # mask after
    uniform = uniforms(params, generators, logits.dtype, logits.device)
    k = max(p.top_logprobs for p in params)
    blocks = [
        _sample_block(logits[a : a + SAMPLE_CHUNK_ROWS], params[a : a + SAMPLE_CHUNK_ROWS],
                      uniform[a : a + SAMPLE_CHUNK_ROWS], masks[a : a + SAMPLE_CHUNK_ROWS], k)
        for a in range(0, len(params), SAMPLE_CHUNK_ROWS)
    ]  # fmt: skip
    tokens, chosen = torch.cat([b[0] for b in blocks]), torch.cat([b[1] for b in blocks])
    top_values = torch.cat([b[2] for b in blocks]) if k else None
    top_ids = torch.cat([b[3] for b in blocks]) if k else None
    counts = [None if mask is None else int(mask.sum()) for mask in masks]
    return Sampled(tokens, chosen, top_ids, top_values, counts)


def uniforms(
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """One uniform draw per row that samples (temperature > 0): rows without a generator from torch's
    global one in a single call, the others from their own; greedy rows get none (their entry is unused)."""
    uniform = torch.zeros(len(params), dtype=dtype, device=device)
    sampled = [i for i, p in enumerate(params) if p.temperature != 0]
    plain = [i for i in sampled if generators[i] is None]
    if plain:
        uniform[plain] = torch.rand(len(plain), dtype=dtype, device=device)
    seeded = [i for i in sampled if generators[i] is not None]
    if seeded:
        draws = [torch.rand(1, generator=g, dtype=dtype, device=g.device) for i in seeded if (g := generators[i])]
        uniform[seeded] = torch.cat(draws).to(device)
    return uniform


def _sample_block(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    uniform: torch.Tensor,
    masks: Sequence[torch.Tensor | None],
    k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sample` for a block of rows: (tokens, their logprobs, top-k logprobs and ids; empty when k is 0)."""
    temperatures = [p.temperature for p in params]
    temperature = torch.tensor(temperatures, device=logits.device)
    greedy = temperature == 0
    # a pass over the whole vocabulary per row; x / 1 is x exactly, so rows at temperature 0 or 1 skip it
    free = (
        logits
        if all(t in (0, 1) for t in temperatures)
        else logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    )
    constrained = [i for i, mask in enumerate(masks) if mask is not None]
    scaled = free
    if constrained:
        scaled = free.clone()
        for i in constrained:
            scaled[i].masked_fill_(~masks[i].to(scaled.device), float("-inf"))  # type: ignore[union-attr]
    top_p = torch.tensor([p.top_p for p in params], device=logits.device)
    if bool((top_p < 1).any()):
        probs_sorted, order = torch.softmax(scaled, dim=-1).sort(dim=-1, descending=True)
        before = probs_sorted.cumsum(-1) - probs_sorted  # mass of the tokens ranked above each one
        # only rows with top_p < 1 are cut: at 1, a tail whose rounded cumulative mass reached 1.0 was cut too,
        # so a row's logprobs moved (by a rounding error) with whether another row of its batch had a top_p
        cut = (before >= top_p[:, None]) & (top_p < 1)[:, None]
        scaled = scaled.scatter(-1, order, scaled.gather(-1, order).masked_fill(cut, float("-inf")))
    logprobs = torch.log_softmax(scaled, dim=-1)
    is_greedy = [t == 0 for t in temperatures]
    tokens = torch.empty(len(params), dtype=torch.long, device=logits.device)
    if all(is_greedy):  # no row copied out first: that copy is another pass over the vocabulary
        tokens = scaled.argmax(-1)
    elif any(is_greedy):
        tokens[greedy] = scaled[greedy].argmax(-1)
    if not all(is_greedy):
        # inverse transform: one uniform per row against the cumulative distribution. The exponential
        # race it replaces drew one random number per vocabulary entry, a quarter of a decode step for
        # a 151,936-token vocabulary at batch 32 (3.6 ms a row on one core)
        every = not any(is_greedy)
        rows = torch.tensor([i for i, g in enumerate(is_greedy) if not g], device=logits.device)
        cumulative = (logprobs if every else logprobs[rows]).exp().cumsum_(-1)  # in place: the same sums
        total = cumulative[:, -1]
        # the first token whose cumulative mass passes u × total (kept below the total when rounding
        # would reach it): always one of probability > 0
        below = torch.minimum(
            (uniform if every else uniform[rows]) * total, torch.nextafter(total, torch.zeros_like(total))
        )
        drawn = torch.searchsorted(cumulative, below[:, None], right=True).squeeze(-1)
        if every:
            tokens = drawn
        else:
            tokens[rows] = drawn
    if constrained:  # what is reported: the model's own distribution, before the grammar's mask
        logprobs = logprobs.clone()
        logprobs[constrained] = torch.log_softmax(free[constrained], dim=-1)
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], tokens[:, None][:, :0])
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1), top_values, top_ids
