"""One GRPO run that trains every role of a multi-agent system: one LoRA adapter per role on one frozen base.

`GRPOConfig(roles={"solver": "^solver$", "verifier": "^verifier$"}, lora_rank=8)` maps each role to the
agent names it trains (a regex, as `agent_match` takes). The engine serves every role's adapter over
the one base held once in memory (`agentgrad.engine.adapters`); with `engine="vllm"` the vLLM servers do,
each adapter loaded under its role's name and synced after every step (`agentgrad.policy.vllm`). This module
turns a step's rollouts into one batch per role and updates each adapter with its own optimizer:

- a role's batch is exactly its agents' calls (`to_trajectories(agent_match=pattern)`); with `default_role`, that
  role's adapter also serves the agents no role matches (and unnamed calls), and its batch takes their calls too;
- a role's reward in a rollout is the last reward emitted for it (`ag.emit_reward(value, agent=role)`),
  else the last reward's dimension named after the role (`ag.emit_reward({"solver": 1.0, "verifier": 0.0},
  primary="solver")`), else the rollout's reward; rollouts in which the role made no call leave its batch and its baseline;
- advantages are computed per role within each task's group (`group_advantages`; `credit="final"` only:
  per-turn credit would need a rule for a role's own rewards beside the rollout's, not written yet);
- checkpoints hold one subfolder per role (the adapter, a PEFT folder, and its optimizer state), and
  metrics go under `train/<role>/...`.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentgrad import semconv as sc
from agentgrad.adapters import Trajectory, agent_of, to_trajectories
from agentgrad.algorithms.credit import Advantage, useful_groups
from agentgrad.engine.adapters import Adapters, adapter_parameters, save_adapter
from agentgrad.engine.training import checkpoint_activations
from agentgrad.policy.checkpoints import TRAINER_STATE, written_atomically
from agentgrad.policy.local import LocalPolicy
from agentgrad.types import Rollout, Span

Pairs = list[tuple[Trajectory, Advantage]]
Advantages = Callable[[Sequence[float], Sequence[Hashable], bool], list[float]]
"""`grpo.group_advantages`: (rewards, groups, normalize_std) -> advantages."""
Update = Callable[..., dict[str, float]]
"""`grpo.grpo_update`: (model, optimizer, batch, cfg, pad_token_id, reference) -> statistics."""
ROLE_OPTIMIZER = "optimizer.pt"


def check_roles(roles: Mapping[str, str], cfg: Any) -> None:
    """What training several roles at once needs of a GRPO config; a ValueError that says what to change."""
    Adapters(dict(roles), cfg.default_role)  # names, patterns, and the default among them
    problems = [
        (cfg.policy.lora_rank < 1, "lora_rank >= 1 (one LoRA adapter per role on one base)"),
        (
            cfg.policy.engine == "vllm" and cfg.policy.vllm_transport not in ("auto", "lora"),
            "vllm_transport='lora' or 'auto' (each role's adapter travels to vLLM under its name)",
        ),
        (cfg.agent_match is not None, "agent_match=None (each role's pattern selects its calls)"),
        (cfg.max_staleness is not None, "synchronous training (max_staleness=None)"),
        (cfg.train_processes != 1, "train_processes=1"),
        (cfg.rollback_on_drop is not None, "rollback_on_drop=None"),
        (cfg.credit != "final", "credit='final' (per-turn credit per role is not built yet)"),
    ]
    missing = [need for failed, need in problems if failed]
    if missing:
        raise ValueError(f"roles={dict(roles)} needs {'; '.join(missing)}")


def role_reward(spans: Sequence[Span], role: str, pattern: str, fallback: float) -> float:
    """This role's reward in a rollout: the last one emitted for it (`emit_reward(value, agent=...)` naming the role
    or an agent its pattern matches), else the rollout's last reward's dimension named after the role
    (`emit_reward({"solver": 1.0, "verifier": 0.0}, primary="solver")`), else `fallback` (the rollout's reward)."""
    rewards = sorted(
        (s for s in spans if s.name == sc.REWARD_SPAN and sc.reward(s) is not None),
        key=lambda s: (s.end_time or s.start_time, s.sequence_id),
    )
    own = [
        s for s in rewards if (agent := sc.reward_agent(s)) is not None and (agent == role or re.search(pattern, agent))
    ]
    if own:
        return sc.reward(own[-1]) or 0.0
    dimensions = [
        value for s in rewards if sc.reward_agent(s) is None and (value := sc.reward_dimension(s, role)) is not None
    ]
    return dimensions[-1] if dimensions else fallback


def role_calls(spans: Sequence[Span], role: str, roles: Mapping[str, str], default_role: str | None) -> list[Span]:
    """`spans` less the model calls this role does not train: the default role (the adapter that serves every agent no
    role matches) keeps, beside its own agents' calls, every call no other role's pattern takes; any other role keeps
    them all (`to_trajectories(agent_match=pattern)` selects its calls)."""
    if role != default_role:
        return list(spans)
    others = [re.compile(p) for name, p in roles.items() if name != role]
    own = re.compile(roles[role])

    def trained_here(span: Span) -> bool:
        caller = agent_of(span)
        return bool(own.search(caller)) or not any(p.search(caller) for p in others)

    return [s for s in spans if not sc.is_llm_call(s) or trained_here(s)]


@dataclass
class RoleBatch:
    """One role's share of a GRPO step."""

    scored: Pairs = field(default_factory=list)  # what its adapter's update trains on
    rewards: list[float] = field(default_factory=list)  # of each successful rollout in which the role made a call
    groups_kept: int = 0  # groups whose role rewards differ (all when skip_uniform_groups is off)


def role_batches(
    members: Sequence[tuple[Rollout, Hashable, Sequence[Span]]],
    roles: Mapping[str, str],
    cfg: Any,
    advantages: Advantages,
) -> dict[str, RoleBatch]:
    """Per role, the (trajectory, advantage) pairs of its calls in these rollouts (rollout, task group, spans)."""
    batches: dict[str, RoleBatch] = {}
    for role, pattern in roles.items():
        taking: list[tuple[Sequence[Span], float, list[Trajectory], Hashable]] = []
        default = role == cfg.default_role  # takes the calls of every agent no role matches: no pattern selects them
        for rollout, group, spans in members:
            reward = role_reward(spans, role, pattern, rollout.reward or 0.0)
            trajectories = to_trajectories(
                role_calls(spans, role, roles, cfg.default_role),
                reward=reward,
                agent_match=None if default else pattern,
                skip_forced=True,
            )
            if trajectories:
                taking.append((spans, reward, trajectories, group))
        rewards = [reward for _, reward, _, _ in taking]
        groups = [group for _, _, _, group in taking]
        useful = useful_groups(rewards, groups, cfg.skip_uniform_groups)
        scored: Pairs = [
            (trajectory, advantage)
            for advantage, (_, _, trajectories, group) in zip(advantages(rewards, groups, cfg.normalize_std), taking)
            if group in useful
            for trajectory in trajectories
        ]
        batches[role] = RoleBatch(scored, rewards, len(useful))
    return batches


def role_metrics(batches: Mapping[str, RoleBatch], success_threshold: float) -> dict[str, float]:
    """`train/<role>/reward_mean`, `reward_std`, `accuracy`, `groups_used`, `calls` for each role."""
    metrics: dict[str, float] = {}
    for role, batch in batches.items():
        rewards = batch.rewards
        metrics |= {
            f"train/{role}/reward_mean": statistics.fmean(rewards) if rewards else 0.0,
            f"train/{role}/reward_std": statistics.pstdev(rewards) if rewards else 0.0,
            f"train/{role}/accuracy": sum(r >= success_threshold for r in rewards) / max(len(rewards), 1),
            f"train/{role}/groups_used": batch.groups_kept,
            f"train/{role}/calls": sum(len(t.span_ids) for t, _ in batch.scored),
        }
    return metrics


class RoleUpdate:
    """Each role's adapter updated on its own batch with its own AdamW; the base stays frozen. Checkpoints
    hold a subfolder per role (a PEFT adapter folder and the role's optimizer state)."""

    def __init__(self, policy: LocalPolicy, cfg: Any, update: Update) -> None:
        self.policy, self.cfg, self.update = policy, cfg, update
        self.roles = list(policy.adapters)
        self.optimizers = {
            role: torch.optim.AdamW(
                adapter_parameters(policy.model, role), lr=cfg.learning_rate, weight_decay=cfg.weight_decay
            )
            for role in self.roles
        }
        if cfg.gradient_checkpointing:
            checkpoint_activations(policy.model)

    def step(self, batches: Mapping[str, Pairs]) -> dict[str, float]:
        """Update each role's adapter on its batch; statistics as `<role>/<name>`, a token-weighted `loss`,
        and `sync_seconds`."""
        stats: dict[str, float] = {}
        losses: list[tuple[float, int]] = []
        with self.policy.training() as model:
            pad = self.policy.engine.tokenizer.pad_token_id
            for role in self.roles:
                batch = batches.get(role) or []
                if not batch:
                    continue
                model.set_adapter(role)  # type: ignore[operator]  # its weights alone take gradients; the engine serves by name anyway
                role_stats = self.update(model, self.optimizers[role], batch, self.cfg, pad, None)
                stats |= {f"{role}/{name}": value for name, value in role_stats.items()}
                losses.append((role_stats["loss"], sum(t.response_length for t, _ in batch)))
        if losses:
            stats["loss"] = sum(loss * tokens for loss, tokens in losses) / max(sum(t for _, t in losses), 1)
        began = time.perf_counter()
        self.policy.publish()
        self.policy.sync()  # vLLM: every role's adapter reaches the servers before the next rollout
        return {**stats, "sync_seconds": time.perf_counter() - began}

    def save(self, directory: Path, state: dict[str, Any]) -> None:
        """`directory/<role>/` for each role (loadable with `PeftModel.from_pretrained`), the tokenizer, and `state`."""
        with written_atomically(directory) as partial:
            for role in self.roles:
                save_adapter(self.policy.model, role, partial / role)
                torch.save({"optimizer": self.optimizers[role].state_dict()}, partial / role / ROLE_OPTIMIZER)
            self.policy.engine.tokenizer.save_pretrained(partial)
            torch.save({"state": state, "roles": self.roles}, partial / TRAINER_STATE)
            (partial / "agentgrad.json").write_text(
                json.dumps({"engine_version": self.policy.engine.version, "roles": self.roles, **state}, default=str)
            )

    def load(self, directory: Path) -> dict[str, Any]:
        """Restore every role's adapter and optimizer from `save`'s folder; the engine serves them from the next call."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        saved = torch.load(directory / TRAINER_STATE, weights_only=False)
        if sorted(saved.get("roles", [])) != sorted(self.roles):
            raise ValueError(
                f"checkpoint {directory} holds the roles {saved.get('roles')}, this run trains {self.roles}: "
                "resume with the same roles, or start in another checkpoint_dir"
            )
        with self.policy.training() as model:
            for role in self.roles:
                weights = load_file(directory / role / "adapter_model.safetensors")
                set_peft_model_state_dict(model, weights, adapter_name=role)
                self.optimizers[role].load_state_dict(torch.load(directory / role / ROLE_OPTIMIZER)["optimizer"])
        self.policy.publish()
        self.policy.sync()
        return dict(saved["state"])

    def close(self) -> None:
        pass
