"""Sampling one token per row, with the logprob RL needs as the behaviour policy's.

A row decoded under a grammar (JSON schema, forced tool call) is drawn from the model's
distribution with the tokens the grammar forbids masked out, but what is recorded for it is the
logprob of the sampled token under the model's own distribution at the temperature, before the
mask: the distribution a trainer recomputes (it has no grammar), so the PPO ratio compares two
logprobs of one policy. Positions where the grammar allowed a single token are reported
(`Sampled.allowed`) so the loss can leave them out: there the sampler had no choice to learn from.
See docs/constrained-decoding.md.

Everything a row's draw depends on (temperature, top-p, its uniform draw, its grammar mask) is made on the host
before the step and reaches the logits' device in one copy each; the draw itself is vectorized over the rows,
with no branch on a device value, so on a GPU a step's sampling waits for nothing and its results come back in
one transfer (`Sampled.to_host`).
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

    def to_host(self) -> list[tuple[int, float, list[int], list[float]]]:
        """Per row (token, logprob, top ids, top logprobs), in one copy from the device: the step's only wait."""
        parts = [self.tokens.double()[:, None], self.logprobs.double()[:, None]]
        k = 0 if self.top_ids is None or self.top_logprobs is None else self.top_ids.shape[1]
        if k:
            parts += [self.top_ids.double(), self.top_logprobs.double()]  # type: ignore[union-attr]
        rows = torch.cat(parts, dim=1).tolist()  # token ids are exact in float64
        return [(int(row[0]), row[1], [int(t) for t in row[2 : 2 + k]], row[2 + k :]) for row in rows]


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
"""Rows sampled in one block on a CPU: the passes over the vocabulary (softmax, cumulative sum, ...) then stay in
the core's cache (8 × 49,152 fp32 logits are 1.5 MiB); each row's result is the same whatever the block. A GPU
samples all rows in one block."""


def to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, copied without waiting for the work queued there (pinned memory) on a GPU."""
    if device.type == "cpu":
        return values
    return values.pin_memory().to(device, non_blocking=True)


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
    top_p, then renormalized. A row with a grammar mask (`allowed`, bool per token, on the host) is drawn with
    the forbidden tokens masked out (before the top_p cut); its logprob and top alternatives are those of the
    unmasked distribution at the temperature (no top_p cut), the policy a trainer recomputes.
    Rows are computed in blocks of `SAMPLE_CHUNK_ROWS` on a CPU, all at once elsewhere, vectorized within a block.
    """
    device = logits.device
    masks = list(allowed or [None] * len(params))
    if any(p.logit_bias or p.presence_penalty or p.frequency_penalty for p in params):
        logits = adjust(logits, params, histories or [[] for _ in params], [None] * len(params))  # mask after
    settings = torch.tensor([[p.temperature for p in params], [p.top_p for p in params]], dtype=logits.dtype)
    settings = to_device(torch.cat([settings, uniforms(params, generators, logits.dtype)[None]]), device)
    constrained = [i for i, mask in enumerate(masks) if mask is not None]
    stacked = to_device(torch.stack([masks[i] for i in constrained]), device) if constrained else None  # type: ignore[misc]
    k = max(p.top_logprobs for p in params)
    size = SAMPLE_CHUNK_ROWS if device.type == "cpu" else max(len(params), 1)
    blocks = []
    for a in range(0, len(params), size):
        inside = [(i - a, n) for n, i in enumerate(constrained) if a <= i < a + size]
        grammar = None
        if inside and stacked is not None:
            rows = to_device(torch.tensor([i for i, _ in inside]), device)
            grammar = (rows, stacked[inside[0][1] : inside[-1][1] + 1])
        blocks.append(_sample_block(logits[a : a + size], params[a : a + size], settings[:, a : a + size], grammar, k))
    tokens, chosen = torch.cat([b[0] for b in blocks]), torch.cat([b[1] for b in blocks])
    top_values = torch.cat([b[2] for b in blocks]) if k else None
    top_ids = torch.cat([b[3] for b in blocks]) if k else None
    counts = [None if mask is None else int(mask.sum()) for mask in masks]
    return Sampled(tokens, chosen, top_ids, top_values, counts)


def uniforms(
    params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None], dtype: torch.dtype
) -> torch.Tensor:
    """One uniform draw per row that samples (temperature > 0), on the host: rows without a generator from torch's
    global one in a single call, the others from their own (host generators: a draw is no device launch); greedy
    rows get none (their entry is unused)."""
    uniform = torch.zeros(len(params), dtype=dtype)
    sampled = [i for i, p in enumerate(params) if p.temperature != 0]
    plain = [i for i in sampled if generators[i] is None]
    if plain:
        uniform[plain] = torch.rand(len(plain), dtype=dtype)
    seeded = [i for i in sampled if generators[i] is not None]
    if seeded:
        draws = [torch.rand(1, generator=g, dtype=dtype, device=g.device) for i in seeded if (g := generators[i])]
        uniform[seeded] = torch.cat(draws).cpu()
    return uniform


def _sample_block(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    settings: torch.Tensor,
    grammar: tuple[torch.Tensor, torch.Tensor] | None,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`sample` for a block of rows: (tokens, their logprobs, top-k logprobs and ids; empty when k is 0). `settings`:
    each row's temperature, top_p and uniform draw, on the logits' device; `grammar`: the constrained rows of the
    block and their masks. What is known on the host (which rows are greedy, cut by top_p) picks the passes; no
    branch waits for the device."""
    temperatures = [p.temperature for p in params]
    temperature, top_p, uniform = settings[0], settings[1], settings[2]
    greedy = temperature == 0
    # a pass over the whole vocabulary per row; x / 1 is x exactly, so rows at temperature 0 or 1 skip it
    free = (
        logits
        if all(t in (0, 1) for t in temperatures)
        else logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    )
    scaled = free
    if grammar is not None:
        rows, allowed = grammar
        scaled = free.clone()
        scaled[rows] = scaled[rows].masked_fill(~allowed, float("-inf"))
    if any(p.top_p < 1 for p in params):
        probs_sorted, order = torch.softmax(scaled, dim=-1).sort(dim=-1, descending=True)
        before = probs_sorted.cumsum(-1) - probs_sorted  # mass of the tokens ranked above each one
        # only rows with top_p < 1 are cut: at 1, a tail whose rounded cumulative mass reached 1.0 was cut too,
        # so a row's logprobs moved (by a rounding error) with whether another row of its batch had a top_p
        cut = (before >= top_p[:, None]) & (top_p < 1)[:, None]
        scaled = scaled.scatter(-1, order, scaled.gather(-1, order).masked_fill(cut, float("-inf")))
    logprobs = torch.log_softmax(scaled, dim=-1)
    if all(t == 0 for t in temperatures):  # no row copied out first: that copy is another pass over the vocabulary
        tokens = scaled.argmax(-1)
    else:
        # inverse transform: one uniform per row against the cumulative distribution. The exponential
        # race it replaces drew one random number per vocabulary entry, a quarter of a decode step for
        # a 151,936-token vocabulary at batch 32 (3.6 ms a row on one core)
        cumulative = logprobs.exp().cumsum_(-1)  # in place: the same sums
        total = cumulative[:, -1]
        # the first token whose cumulative mass passes u × total (kept below the total when rounding
        # would reach it): always one of probability > 0
        below = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
        tokens = torch.searchsorted(cumulative, below[:, None], right=True).squeeze(-1)
        if any(t == 0 for t in temperatures):  # each row's own sums: a greedy row's draw is computed and unused
            tokens = torch.where(greedy, scaled.argmax(-1), tokens)
    if grammar is not None:  # what is reported: the model's own distribution, before the grammar's mask
        logprobs = logprobs.clone()
        logprobs[grammar[0]] = torch.log_softmax(free[grammar[0]], dim=-1)
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], tokens[:, None][:, :0])
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1), top_values, top_ids
