"""Keys and values of finished sequences, kept so a later prompt that starts with one computes only the rest.

An agent's next call sends its previous prompt, the completion and a tool result; another rollout of
the same task sends the same prompt. Without this cache each recomputes every token it shares with a
request that already finished (~42 % of the engine thread in the demo was such prefill). Entries are
the token ids a finished row fed the model (its prompt and all but the last sampled token) with their
keys and values, valid for one weights version, bounded in bytes, least recently used evicted first.
Under several adapters (`adapters.py`) an entry also names the adapter that computed it, and serves only it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from agentgrad.engine.kv_cache import common_prefix_length

PREFIX_CACHE_BYTES = 256 * 2**20
"""Default bound of the prefix cache (`Engine(prefix_cache_bytes=...)`; 0 turns it off)."""

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer, keys and values shaped (1, kv heads, tokens, head dim)."""


class PrefixCache:
    """Finished sequences' keys and values by their token ids, for one weights version at a time."""

    def __init__(self, max_bytes: int = PREFIX_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be 0 (off) or more, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.version = 0
        self._entries: OrderedDict[tuple[str | None, tuple[int, ...]], LayerKV] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _check_version(self, version: int) -> None:
        """Entries of other weights are stale: drop them all."""
        if version != self.version:
            self._entries.clear()
            self.bytes = 0
            self.version = version

    def put(self, version: int, ids: tuple[int, ...], kv: LayerKV, adapter: str | None = None) -> None:
        """Keep `kv` (cloned by the caller) for `ids` as `adapter` computed them, evicting the least recently
        used beyond the bound."""
        self._check_version(version)
        size = sum(keys.nbytes + values.nbytes for keys, values in kv)
        if not ids or size > self.max_bytes:
            return
        old = self._entries.pop((adapter, ids), None)
        if old is not None:
            self.bytes -= sum(keys.nbytes + values.nbytes for keys, values in old)
        self._entries[(adapter, ids)] = kv
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= sum(keys.nbytes + values.nbytes for keys, values in evicted)

    def longest(self, version: int, prompt: tuple[int, ...], adapter: str | None = None) -> tuple[int, LayerKV]:
        """The most leading tokens of `prompt` an entry of `adapter` holds (at most all but its last, whose logits
        the caller needs), with that entry's keys and values (longer than that: slice them); (0, []) if none."""
        self._check_version(version)
        best, found, key = 0, [], None
        for (owner, ids), kv in self._entries.items():
            if owner != adapter:
                continue
            length = min(common_prefix_length([prompt, ids]), len(prompt) - 1)
            if length > best:
                best, found, key = length, kv, (owner, ids)
        if key is not None:
            self._entries.move_to_end(key)
        return best, found


HIT_GROUP_SLACK_TOKENS = 64
"""A hit may be prefilled with other hits from a prefix up to this many tokens shorter than its own: recomputing a
few tokens inside one forward costs less than a forward of its own (a GRPO step's rollouts all hit the system
prompt, and prefilled one by one they took longer than their decoding)."""


def group_hits(hits: Sequence[tuple[Sequence[int], int]], min_tokens: int) -> list[tuple[int, list[int]]]:
    """Prompts with prefix cache hits (prompt, cached tokens), grouped to be prefilled together: each group as
    (tokens its members share and its first member has cached, member indices). A group's members share its
    leading tokens, and none gives up more than `HIT_GROUP_SLACK_TOKENS` of its own hit or goes below `min_tokens`."""
    groups: list[tuple[int, int, list[int]]] = []  # (shared, fewest shared tokens its members allow, members)
    for index, (prompt, cached) in enumerate(hits):
        for position, (shared, floor, members) in enumerate(groups):
            together = min(shared, cached, common_prefix_length([hits[members[0]][0], prompt]))
            if together >= max(min_tokens, floor, cached - HIT_GROUP_SLACK_TOKENS):
                groups[position] = (together, max(floor, cached - HIT_GROUP_SLACK_TOKENS), [*members, index])
                break
        else:
            groups.append((cached, cached - HIT_GROUP_SLACK_TOKENS, [index]))
    return [(shared, members) for shared, _, members in groups]
