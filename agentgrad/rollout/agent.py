"""Writing an agent: a `LitAgent` subclass or a function decorated with `@agentgrad.rollout`.

The agent receives the task and the resources it asks for, and returns its reward (a number, or a
mapping of named dimensions such as one per role, `{"solver": 1.0, "verifier": 0.0}`, whose first key is
the reward trained on) or None when it reports rewards itself with `emit_reward`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
import math
import pickle
import typing
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from agentgrad.types import LLM, NamedResources, PromptTemplate, Rollout

RESOURCE_CLASSES: tuple[type, ...] = (LLM, PromptTemplate)
Reward = float | dict[str, float]
"""What an agent returns: a number, or named dimensions (one per role, say) whose first key is the primary."""

agent_threads: contextvars.ContextVar[Executor | None] = contextvars.ContextVar("agentgrad_agent_threads", default=None)
"""Where sync agents run: the runner sets its own pool (one thread per concurrent attempt), so `--workers N`
runs N sync agents at once whatever the event loop's default pool holds; None means that default pool."""


async def in_agent_thread(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Call a sync agent in a worker thread (`agent_threads`), with the caller's context (its attempt binding)."""
    call = functools.partial(contextvars.copy_context().run, function, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(agent_threads.get(), call)


class AgentError(TypeError):
    """The agent cannot be called with what the rollout provides, or returned something unusable."""


class LitAgent:
    """Base class of agents. Implement `rollout`, sync or async.

    `rollout(task, resources, rollout)` gets the task, every named resource of the snapshot the
    rollout runs with (LLM endpoints already routed to this attempt), and the rollout record.
    """

    @property
    def name(self) -> str:
        return type(self).__name__

    def rollout(self, task: Any, resources: NamedResources, rollout: Rollout) -> Reward | None:
        raise NotImplementedError(f"{type(self).__name__} must implement rollout(task, resources, rollout)")

    async def run(self, task: Any, resources: NamedResources, rollout: Rollout) -> Reward | None:
        """Run one rollout; sync agents run in a worker thread so the event loop stays free."""
        if inspect.iscoroutinefunction(self.rollout):
            result = await self.rollout(task, resources, rollout)
        else:
            result = await in_agent_thread(self.rollout, task, resources, rollout)
        return as_reward(result, self.name)


def as_reward(result: Any, agent_name: str) -> Reward | None:
    """What the agent returned, checked: None, a finite float, or a non-empty dict of them by name (`Reward`)."""
    if result is None:
        return None
    if isinstance(result, Mapping):
        return as_dimensions(result, agent_name)
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise AgentError(
            f"agent {agent_name!r} returned {type(result).__name__}; return a float reward (or a dict of them by "
            "role, the first key trained on), or None and report rewards with agentgrad.emit_reward"
        )
    if not math.isfinite(result):
        raise AgentError(
            f"agent {agent_name!r} returned the reward {result}, which is not finite; "
            "return a finite float (or None when there is no reward)"
        )
    return float(result)


def as_dimensions(result: Mapping[Any, Any], agent_name: str) -> dict[str, float]:
    """A returned reward with named dimensions, in its order (the first is the primary): names and finite numbers."""
    if not result:
        raise AgentError(f"agent {agent_name!r} returned an empty dict; return at least one named reward, or None")
    bad = {
        key: value
        for key, value in result.items()
        if not isinstance(key, str)
        or not key
        or isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
    }
    if bad:
        raise AgentError(
            f"agent {agent_name!r} returned the reward dimensions {bad!r}: each is a non-empty name and a finite number"
        )
    return {key: float(value) for key, value in result.items()}


class FunctionAgent(LitAgent):
    """An agent made from a function: its parameters after the task say which resources it needs.

    A parameter is filled, in order of preference, with the rollout (named `rollout` or typed
    `Rollout`), all resources (named `resources`), the resource of the same name, or the only
    resource of its annotated class (`llm: agentgrad.LLM`).
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        functools.update_wrapper(self, function)
        signature = inspect.signature(function)
        try:
            hints = typing.get_type_hints(function)
        except Exception:  # unresolvable forward references: fall back to names only
            hints = {}
        params = list(signature.parameters.values())
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            raise AgentError(f"agent {function.__qualname__} must take the task as its first parameter")
        self._params = [(p.name, hints.get(p.name), p.default is not p.empty) for p in params[1:]]
        self._is_async = inspect.iscoroutinefunction(function)

    @property
    def name(self) -> str:
        return self.function.__qualname__

    @property
    def llm_parameter(self) -> str | None:
        """The name of the parameter that asks for an `LLM` (annotated so, without a default), if any."""
        for name, annotation, has_default in self._params:
            if isinstance(annotation, type) and issubclass(annotation, LLM) and not has_default:
                return name
        return None

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        """Pickled by module and name, so runner processes get the agent: `@rollout` replaced the
        function in its module by this object, which pickling the function by reference trips on."""
        module, qualname = self.function.__module__, self.function.__qualname__
        if "<" in qualname:
            raise pickle.PicklingError(
                f"agent {qualname} is defined inside a function or is a lambda; runner processes import agents "
                "by module and name, so define it at module level"
            )
        return (load_agent, (module, qualname))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def arguments(self, resources: NamedResources, rollout: Rollout) -> dict[str, Any]:
        """The keyword arguments after the task, taken from the resources and the rollout."""
        arguments: dict[str, Any] = {}
        for name, annotation, has_default in self._params:
            if name == "rollout" or annotation is Rollout:
                arguments[name] = rollout
            elif name == "resources":
                arguments[name] = resources
            elif name in resources:
                arguments[name] = resources[name]
            elif isinstance(annotation, type) and issubclass(annotation, RESOURCE_CLASSES):
                matches = [r for r in resources.values() if isinstance(r, annotation)]
                if len(matches) != 1:
                    hint = (
                        f"give one: Trainer(resources={{{name!r}: ag.{annotation.__name__}(...)}})"
                        if not matches
                        else "name the parameter after one of them"
                    )
                    raise AgentError(
                        f"agent {self.name} asks for {name}: {annotation.__name__}, but the resources hold "
                        f"{len(matches)} of that type ({sorted(resources)}); {hint}"
                    )
                arguments[name] = matches[0]
            elif not has_default:
                raise AgentError(
                    f"agent {self.name} asks for {name!r}, which is not among the resources {sorted(resources)}; "
                    "publish a resource of that name or give the parameter a default"
                )
        return arguments

    def rollout(self, task: Any, resources: NamedResources, rollout: Rollout) -> Any:
        return self.function(task, **self.arguments(resources, rollout))

    async def run(self, task: Any, resources: NamedResources, rollout: Rollout) -> Reward | None:
        arguments = self.arguments(resources, rollout)
        if self._is_async:
            result = await self.function(task, **arguments)
        else:
            result = await in_agent_thread(self.function, task, **arguments)
        return as_reward(result, self.name)


def rollout(function: Callable[..., Any]) -> FunctionAgent:
    """Make an agent of a function `(task, <resources...>) -> reward | None`, sync or async."""
    return FunctionAgent(function)


def load_agent(module: str, name: str) -> LitAgent:
    """The agent `name` (dotted within the module) of `module`, imported."""
    value: Any = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return as_agent(value)


def as_agent(agent: LitAgent | Callable[..., Any]) -> LitAgent:
    """Accept an agent or a plain function anywhere an agent is expected."""
    if isinstance(agent, LitAgent):
        return agent
    if callable(agent):
        return FunctionAgent(agent)
    raise AgentError(f"expected a LitAgent or a function, got {type(agent).__name__}")
