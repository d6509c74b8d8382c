"""Rollback on regression: the best-validated weights and optimizer come back when validation falls too far."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from agentgrad.algorithms.grpo import GRPO
from agentgrad.algorithms.rollback import RollbackGuard
from agentgrad.algorithms.sft import SFT
from agentgrad.tracking import TensorBoardTracker


class TinyUpdate:
    """A real torch model and AdamW, saved and loaded as GRPO's local update does (weights, optimizer, state)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 2)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.1)

    def train(self) -> None:
        loss = self.model(torch.ones(1, 4)).pow(2).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def save(self, directory: Path, state: dict[str, Any]) -> None:
        directory.mkdir(parents=True)
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "state": state},
                   directory / "checkpoint.pt")

    def load(self, directory: Path) -> dict[str, Any]:
        saved = torch.load(directory / "checkpoint.pt")
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        return saved["state"]

    @property
    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = value


def snapshot(update: TinyUpdate) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    weights = {k: v.clone() for k, v in update.model.state_dict().items()}
    return weights, update.optimizer.state_dict()["state"][0]["exp_avg"].clone()


def test_a_drop_past_the_threshold_restores_the_best_weights_and_optimizer_and_lowers_the_rate(tmp_path: Path) -> None:
    update = TinyUpdate()
    guard = RollbackGuard(drop=0.1, directory=tmp_path)
    assert guard.check(0, 0.40, update) == "best"
    update.train()
    assert guard.check(1, 0.60, update) == "best"
    best_weights, best_moment = snapshot(update)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best-step-1"]  # the older best was deleted
    update.train()
    update.train()
    assert guard.check(2, 0.55, update) == "kept"  # 0.05 below the best: within the threshold
    assert not torch.equal(update.model.weight, best_weights["weight"])
    assert guard.check(3, 0.35, update) == "rolled_back"
    weights, moment = snapshot(update)
    assert all(torch.equal(weights[k], best_weights[k]) for k in weights) and torch.equal(moment, best_moment)
    assert update.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    (event,) = guard.events
    assert (event.step, event.value, event.best, event.best_step, event.action) == (3, 0.35, 0.60, 1, "lower_lr")
    assert guard.check(4, 0.30, update) == "rolled_back" and update.optimizer.param_groups[0]["lr"] == pytest.approx(0.025)


def test_the_stop_action_restores_the_best_and_says_stop(tmp_path: Path) -> None:
    update = TinyUpdate()
    guard = RollbackGuard(drop=0.2, action="stop", directory=tmp_path)
    guard.check(0, 0.5, update)
    first = {k: v.clone() for k, v in update.model.state_dict().items()}
    update.train()
    assert guard.check(1, 0.2, update) == "stop"
    assert torch.equal(update.model.weight, first["weight"]) and update.optimizer.param_groups[0]["lr"] == 0.1


def test_rollback_settings_are_checked() -> None:
    for algorithm in (GRPO, SFT):
        with pytest.raises(ValueError, match="rollback_on_drop is a drop"):
            algorithm(rollback_on_drop=-0.1)
        with pytest.raises(ValueError, match="rollback_action is 'lower_lr' or 'stop'"):
            algorithm(rollback_on_drop=0.1, rollback_action="restart")
        with pytest.raises(ValueError, match="rollback_lr_factor"):
            algorithm(rollback_on_drop=0.1, rollback_lr_factor=2.0)
        with pytest.raises(ValueError, match="needs synchronous training"):
            algorithm(rollback_on_drop=0.1, max_staleness=1)


@pytest.mark.model
@pytest.mark.parametrize("algorithm", [GRPO, SFT])
def test_a_run_forced_to_regress_returns_to_its_best_weights_and_stops(tmp_path: Path, algorithm: Any) -> None:
    """A learning rate of 1.0 wrecks SmolLM2 in one step: validation falls, the run returns to the weights it
    validated best (the starting ones), records the rollback and stops; GRPO and SFT alike (the loop's)."""
    import agentgrad as ag
    from agentgrad.engine import Engine
    from examples.calc_agent import make_splits
    from tests.test_training_e2e import close_enough

    engine = Engine(sampling_dtype="float32", device="cpu")
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    train, val = make_splits(n_train=20, n_val=6, seed=5)
    store = ag.MemoryStore()
    settings = dict(steps=3, prompts_per_step=2, group_size=2, max_tokens=12, val_every=1, learning_rate=1.0,
                    success_threshold=0.02, rollback_on_drop=0.2, rollback_action="stop",
                    checkpoint_dir=str(tmp_path / "ckpt"))
    if algorithm is SFT:
        settings["reward_threshold"] = 0.0  # every completed rollout is kept: the wrecking update surely runs
    tracker = TensorBoardTracker(log_dir=tmp_path / "tb")
    result = ag.Trainer(algorithm(local_engine=engine, **settings), n_runners=2, runner_concurrency=4, store=store,
                        report_to=[tracker], run_name="regress").fit(close_enough, train, val)
    assert result.initial is not None and result.initial.success_rate > 0.2, "the starting model must answer"
    assert [h["step"] for h in result.history] == [1]  # stopped after the rollback at step 1
    assert [(m.step, m.value) for m in asyncio.run(store.query_metrics("train/rollback"))] == [(1, 1.0)]
    assert [m.value for m in asyncio.run(store.query_metrics("train/rollback_to_step"))] == [0.0]
    after = engine.model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before), "the weights are the best (starting) ones again"
    assert (tmp_path / "ckpt" / "best-step-0").is_dir()
    engine.close()

    # the same GRPO run in TensorBoard: every figure at the store's steps, the rollback included
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb" / "regress"), size_guidance={"scalars": 0})
    events.Reload()
    for name in ("val/accuracy", "train/reward_mean", "train/loss", "train/rollback"):
        stored = [(m.step, m.value) for m in asyncio.run(store.query_metrics(name))]
        logged = [(e.step, e.value) for e in events.Scalars(name)]  # TensorBoard keeps float32
        assert [step for step, _ in logged] == [step for step, _ in stored], name
        assert [value for _, value in logged] == pytest.approx([value for _, value in stored], rel=1e-6), name
    (run,) = asyncio.run(store.query_runs())
    assert run.algorithm == algorithm.__name__ and run.config["rollback_on_drop"] == 0.2 and run.status.value == "succeeded"
