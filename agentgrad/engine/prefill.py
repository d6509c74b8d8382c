"""Prefill: new prompts run through the model as a batch that joins the running one, reusing keys and values
already computed.

A prompt that starts with a finished request's tokens (the prefix cache, `prefix_cache.py`) is run from there,
with the others that share that prefix (`prefill_groups`); identical prompts (a GRPO group, n > 1) are run once;
and the prefix all of a batch's prompts share (a system prompt, few-shot examples) is run once for the batch and
kept while the weights stay the same (`Prefiller.shared_kv`). Keys and values are an adapter's own: one prefill
per adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentgrad.engine.adapters import Adapters, forward_arguments
from agentgrad.engine.kv_cache import (
    MIN_HELD_ONCE_PREFIX,
    MIN_SHARED_PREFIX,
    Batch,
    SharedPrefix,
    common_prefix_length,
    new_cache,
)
from agentgrad.engine.prefix_cache import LayerKV, PrefixCache, group_hits
from agentgrad.engine.rows import Request, Row
from agentgrad.engine.weights import Weights

SHARED_PREFIXES = 4
"""How many shared prefixes' keys and values `Prefiller.shared_kv` keeps."""
PREFIX_HIT_MIN_TOKENS = 32
"""A prompt that starts with at least this many tokens of a finished request's (`prefix_cache.py`) is
prefilled alone from there; a shorter hit joins the other new prompts' forward instead, which costs less
than a forward of its own (`benchmarks/prefix_hit_cost.py`: a hit of 8 tokens taken cost 1.16× the prefill
that ignored it, 16: 1.07×, 32: 1.05×, 128: 0.93×, 256: 0.70×)."""
PREFIX_HIT_ALONE_TOKENS = 128
"""A hit that shares its prefix with no other new prompt's (`prefix_cache.group_hits`) is prefilled from its cached
tokens only with at least this many; a shorter one joins the other new prompts' forward, where computing its
tokens again costs less than a forward and a restack of its own. 64 chats resubmitted at once, each hitting its
own ~40 cached tokens, had made 36 forwards: prefill 0.43 s → 1.23 s, and 1,025 → 851 tok/s over five rounds."""


def prefill_groups(
    requests: list[Request], prefix_cache: PrefixCache, version: int
) -> list[tuple[list[Request], tuple[int, LayerKV]]]:
    """The new requests in the groups prefilled together, each with the prefix cache hit they start from (0 tokens:
    none): those that start with a finished request's tokens grouped by the prefix they share
    (`prefix_cache.group_hits`), the others together with the short hits that would have a forward to themselves
    (`PREFIX_HIT_ALONE_TOKENS`), one group per adapter (keys and values are the adapter's own)."""
    together: dict[str | None, list[Request]] = {}
    hits: dict[str | None, list[tuple[Request, tuple[int, LayerKV]]]] = {}
    for request in requests:
        hit = (
            prefix_cache.longest(version, tuple(request.prompt_ids), request.adapter)
            if prefix_cache.max_bytes
            else (0, [])
        )
        if hit[0] >= PREFIX_HIT_MIN_TOKENS:
            hits.setdefault(request.adapter, []).append((request, hit))
        else:
            together.setdefault(request.adapter, []).append(request)
    groups: list[tuple[list[Request], tuple[int, LayerKV]]] = []
    for adapter, adapter_hits in hits.items():
        grouped = [
            ([adapter_hits[i] for i in members], shared)
            for shared, members in group_hits(
                [(r.prompt_ids, hit[0]) for r, hit in adapter_hits], PREFIX_HIT_MIN_TOKENS
            )
        ]
        short = [len(members) == 1 and shared < PREFIX_HIT_ALONE_TOKENS for members, shared in grouped]
        if sum(short) + len(together.get(adapter, [])) < 2:  # nothing to join: the hit still saves its tokens
            short = [False] * len(grouped)
        for (members, shared), joins in zip(grouped, short):
            if joins:
                together.setdefault(adapter, []).append(members[0][0])
            else:
                groups.append(([r for r, _ in members], (shared, members[0][1][1])))
    return [(group, (0, [])) for group in together.values()] + groups


@dataclass
class Prefilled:
    """A prefilled batch and its rows' logits for their first tokens. `prefix`: the tokens every row starts with and
    their keys and values, where long enough to be held once (`kv_cache.hold_prefix_once`)."""

    batch: Batch
    logits: torch.Tensor
    prefix: SharedPrefix | None


class Prefiller:
    """Runs new prompts through the engine's sampling weights, keeping the keys and values of the prefixes that
    batches' prompts share (`shared`: by the weights version and adapter that computed them, and the tokens)."""

    def __init__(self, weights: Weights, stats: dict[str, Any], tokenizer: Any) -> None:
        self.weights = weights
        self.stats = stats  # the engine's: prefill counts add up there
        self.tokenizer = tokenizer  # its pad token pads the shorter prompts
        self.shared: dict[tuple[int, str | None, tuple[int, ...]], LayerKV] = {}

    def run(
        self,
        requests: list[Request],
        cached: tuple[int, LayerKV],
        version: int,
        adapters: Adapters | None,
    ) -> Prefilled:
        """Run these prompts (all of one adapter) up to their first tokens' logits. `cached`: a prefix cache hit
        (`prefill_groups`), the tokens every prompt starts with and their keys and values (longer than that: sliced)."""
        device = self.weights.device
        rows: list[Row] = []
        for request in requests:
            request.version = version
            self.stats["requests"] += 1
            self.stats["prompt_tokens"] += len(request.prompt_ids)
            rows.extend(request.rows)
        distinct: dict[tuple[int, ...], int] = {}
        row_prompt = [distinct.setdefault(tuple(row.request.prompt_ids), len(distinct)) for row in rows]
        prompts = list(distinct)
        adapter = requests[0].adapter  # the same for all (`prefill_groups`)
        cached_tokens, cached_kv = cached
        shared = cached_tokens or min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1)
        cache = new_cache()
        if shared >= MIN_SHARED_PREFIX:
            kv = [(k[:, :, :shared], v[:, :, :shared]) for k, v in cached_kv] or self.shared_kv(
                prompts[0][:shared], adapter, version, adapters
            )
            for layer_index, (keys, values) in enumerate(kv):
                cache.update(
                    keys.expand(len(prompts), -1, -1, -1), values.expand(len(prompts), -1, -1, -1), layer_index
                )
        else:
            shared = 0
        suffixes = [p[shared:] for p in prompts]
        width = max(len(s) for s in suffixes)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(s)) + list(s) for s in suffixes], device=device)
        suffix_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in suffixes], device=device)
        mask = torch.cat([suffix_mask.new_ones(len(prompts), shared), suffix_mask], dim=1)
        positions = shared + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.weights.sampler(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
            **forward_arguments(adapters, [adapter] * len(prompts)),
        )
        self.stats["prefill_tokens"] += int(suffix_mask.sum())
        logits = out.logits[:, -1, :]
        if len(prompts) != len(rows):
            index = torch.tensor(row_prompt, device=device)
            cache.batch_select_indices(index)
            mask, logits = mask[index], logits[index]
        batch = Batch(rows, cache, mask, mask.sum(-1), ids[:1, -1].expand(len(rows)))
        held = SharedPrefix(tuple(prompts[0][:shared]), kv, version) if shared >= MIN_HELD_ONCE_PREFIX else None
        return Prefilled(batch, logits, held)

    def shared_kv(
        self, prefix: tuple[int, ...], adapter: str | None, version: int, adapters: Adapters | None
    ) -> LayerKV:
        """Keys and values of a shared prefix (batch of one) under `adapter`, cached while the weights are unchanged.

        Batches joining at different times share prefixes of different lengths (the system prompt
        and examples, plus a few tokens of their questions): a new one starts from the cached one it
        has most in common with, so only the tokens after that are run. Least recently used goes first.
        """
        key = (version, adapter, prefix)
        kv = self.shared.pop(key, None)
        if kv is None:
            reused, known = 0, None
            for (other_version, owner, other), other_kv in self.shared.items():
                if (
                    other_version == version
                    and owner == adapter
                    and (length := common_prefix_length([prefix, other])) > reused
                ):
                    reused, known = length, other_kv
            cache = new_cache()
            for layer_index, (keys, values) in enumerate(known or []):
                cache.update(keys[:, :, :reused], values[:, :, :reused], layer_index)
            if reused < len(prefix):
                device = self.weights.device
                ids = torch.tensor([prefix[reused:]], device=device)
                positions = torch.arange(reused, len(prefix), device=device)[None]
                self.weights.sampler(
                    input_ids=ids,
                    position_ids=positions,
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                    **forward_arguments(adapters, [adapter]),
                )
                self.stats["prefill_tokens"] += len(prefix) - reused
            kv = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
        self.shared[key] = kv
        while len(self.shared) > SHARED_PREFIXES:
            self.shared.pop(next(iter(self.shared)))
        return kv
