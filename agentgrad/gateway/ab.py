"""A/B serving: one model name split between two arms (two weight versions, or two models) by a share.

`ABSplit` is a gateway router (`Gateway(store, routers={model: split})`): a rollout's calls all go to one
arm, chosen by a hash of its id and the split's seed (sticky with no state to lose, the same across gateway
restarts); calls outside a rollout are split by their own hash. The arm is recorded on each call's span
(`agentgrad.ab.arm`), so `agentgrad ab report` can compare the arms' rewards.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass

from agentgrad.gateway.upstreams import Backend, Upstream


@dataclass(frozen=True)
class ArmLease:
    """What a call is served by: the arm's upstream, the arm's name, its weights version (the arm, by default)."""

    upstream: Upstream
    version: str
    arm: str


class ABSplit:
    """`ABSplit("policy", {"a": Backend(url_a), "b": Backend(url_b)}, share={"b": 0.2})`: 20% of rollouts on b."""

    def __init__(
        self, name: str, arms: Mapping[str, Backend], share: Mapping[str, float] | None = None, seed: int = 0
    ) -> None:
        if len(arms) != 2:
            raise ValueError(f"an A/B split has two arms, got {len(arms)}: {sorted(arms)}")
        share = dict(share or {name: 1 / len(arms) for name in arms})
        unknown = set(share) - set(arms)
        if unknown:
            raise ValueError(f"share names arms the split does not have: {sorted(unknown)} (arms: {sorted(arms)})")
        if any(not 0 <= v <= 1 for v in share.values()):
            raise ValueError(f"each arm's share is between 0 and 1, got {share}")
        missing = [a for a in arms if a not in share]
        rest = 1 - sum(share.values())
        if rest < -1e-9 or (not missing and abs(rest) > 1e-9):
            raise ValueError(f"the arms' shares add up to 1, got {share}")
        for arm in missing:
            share[arm] = rest / len(missing)
        self.name = name
        self.arms = list(arms)
        self.share = share
        self.seed = seed
        self.upstreams = {arm: Upstream.of(f"{name}@{arm}", backend) for arm, backend in arms.items()}
        self.system = next(iter(arms.values())).system

    def arm_of(self, rollout_id: str | None) -> str:
        """The arm of a rollout: a point in [0, 1) from a hash of (seed, rollout id), against the shares in order."""
        if rollout_id is None:
            point = random.random()
        else:
            digest = hashlib.sha256(f"{self.seed}:{rollout_id}".encode()).digest()
            point = int.from_bytes(digest[:8], "big") / 2**64
        edge = 0.0
        for arm in self.arms:
            edge += self.share[arm]
            if point < edge:
                return arm
        return self.arms[-1]

    async def acquire(self, rollout_id: str | None, agent: str | None = None) -> ArmLease:
        """The rollout's arm (the agent's name does not choose it)."""
        arm = self.arm_of(rollout_id)
        return ArmLease(self.upstreams[arm], arm, arm)

    def release(self, lease: ArmLease) -> None:
        """Nothing to give back: a split holds no capacity."""
