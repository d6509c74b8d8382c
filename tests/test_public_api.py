"""The public API: the names `import agentgrad` gives, and the errors that say what to do instead."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import agentgrad as ag
from agentgrad.algorithms.base import Evaluation

BLOCK_TORCH = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "torch":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTorch())
    """
)


@pytest.mark.parametrize("name", ["GRPO", "GRPOConfig", "SFT", "SFTConfig"])
def test_training_without_the_train_extra_says_what_to_install(name: str) -> None:
    script = BLOCK_TORCH + textwrap.dedent(
        f"""
        import agentgrad as ag
        assert ag.Baseline and ag.APO and ag.Trainer  # everything else works without torch
        try:
            ag.{name}
        except ImportError as exc:
            print(exc)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pip install 'agentgrad[train]'" in result.stdout and "torch" in result.stdout


def test_other_import_errors_are_not_blamed_on_the_train_extra() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nonsense'"):
        ag.Nonsense  # noqa: B018


async def test_an_algorithm_run_outside_a_trainer_says_to_use_one() -> None:
    with pytest.raises(TypeError, match=r"ag\.Trainer\(algorithm=Baseline\(\.\.\.\).*\.fit\(agent"):
        await ag.Baseline().run(ag.MemoryStore(), ["task"], None)  # type: ignore[arg-type]  # a store, not a RunContext
    with pytest.raises(RuntimeError, match=r"ag\.Trainer\(algorithm=Baseline\(\.\.\.\).*\.fit\(agent"):
        ag.Baseline().store  # noqa: B018  # no run, no context


def test_store_and_agent_errors_are_exported() -> None:
    from agentgrad.rollout.agent import AgentError
    from agentgrad.store import InvalidTransitionError, NotFoundError, StoreError

    assert (ag.StoreError, ag.NotFoundError, ag.InvalidTransitionError, ag.AgentError) == (
        StoreError, NotFoundError, InvalidTransitionError, AgentError,
    )
    assert issubclass(ag.NotFoundError, ag.StoreError) and issubclass(ag.InvalidTransitionError, ag.StoreError)
    assert set(ag.__all__) >= {"agent", "StoreError", "NotFoundError", "InvalidTransitionError", "AgentError"}


def test_fit_returns_the_algorithms_own_result() -> None:
    result = ag.Trainer(store="memory").fit(lambda task: 1.0, ["a", "b"], ["c"])
    assert set(result) == {"train", "val"} and isinstance(result["val"], Evaluation) and result["val"].n == 1
