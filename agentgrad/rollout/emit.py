"""One-line calls an agent adds to report rewards and structure into its current attempt.

Each call writes one span. Outside a rollout (calling the agent by hand, say) they do nothing,
so the same agent code runs with and without agentgrad.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import traceback
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

from agentgrad import semconv as sc
from agentgrad.rollout.tracer import get_tracer

F = TypeVar("F", bound=Callable[..., Any])


def to_json(value: Any) -> str:
    """JSON for span attributes; anything JSON cannot encode is written as its repr."""
    return json.dumps(value, default=repr)


def _emit(name: str, attributes: Mapping[str, Any], error: str | None = None) -> None:
    from opentelemetry.trace import Status, StatusCode

    with get_tracer().start_as_current_span(name, attributes=dict(attributes), record_exception=False) as span:
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))


def emit_reward(value: float | Mapping[str, float], primary: str | None = None, *, agent: str | None = None) -> None:
    """Report a reward: a number, or named dimensions of which `primary` is the reward trained on.

    The last reward of an attempt becomes the rollout's final reward unless the agent returns one.
    With `agent`, the reward is that role's own (it pays that agent's calls under per-turn credit)
    and never becomes the rollout's reward. NaN and infinities are a ValueError here, in the agent
    (the store would refuse them later).
    """
    if agent is not None and (not isinstance(agent, str) or not agent):
        raise ValueError(f"agent names the role the reward is for (a non-empty string), got {agent!r}")
    if isinstance(value, Mapping):
        if primary is None:
            if len(value) != 1:
                raise ValueError(f"emit_reward got dimensions {sorted(value)}; name the one to train on with primary=")
            primary = next(iter(value))
        if primary not in value:
            raise ValueError(f"primary reward {primary!r} is not among the dimensions {sorted(value)}")
        attributes: dict[str, Any] = {f"{sc.REWARD}.{key}": float(v) for key, v in value.items()}
        attributes[sc.REWARD] = float(value[primary])
        attributes[sc.REWARD_PRIMARY] = primary
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"a reward is a number or a mapping of numbers, not {type(value).__name__}")
        attributes = {sc.REWARD: float(value)}
    bad = {k: v for k, v in attributes.items() if isinstance(v, float) and not math.isfinite(v)}
    if bad:
        raise ValueError(f"a reward must be a finite number, got {bad}")
    if agent is not None:
        attributes[sc.REWARD_AGENT] = agent
    _emit(sc.REWARD_SPAN, attributes)


def record_returned_reward(value: float | Mapping[str, float]) -> float:
    """Record the reward an agent returned as `emit_reward` would (a mapping's first key as its primary: a return
    cannot name one); returns the value trained on, the attempt's reward."""
    if isinstance(value, Mapping):  # non-empty: `agent.as_reward` checked it
        primary = next(iter(value))
        emit_reward(value, primary=primary)
        return float(value[primary])
    emit_reward(value)
    return float(value)


def emit_message(message: str, **attributes: Any) -> None:
    """Record a line of text (a log line, a thought, a tool result)."""
    _emit(sc.MESSAGE_SPAN, {sc.MESSAGE_BODY: message, **attributes})


def emit_object(obj: Any, **attributes: Any) -> None:
    """Record any JSON-serializable value."""
    _emit(sc.OBJECT_SPAN, {sc.OBJECT_JSON: to_json(obj), **attributes})


def emit_exception(exc: BaseException) -> None:
    """Record an exception with its traceback (OpenTelemetry `exception.*` attributes)."""
    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    _emit(
        sc.EXCEPTION_SPAN,
        {sc.EXCEPTION_TYPE: type(exc).__qualname__, sc.EXCEPTION_MESSAGE: str(exc), sc.EXCEPTION_STACKTRACE: stack},
        error=f"{type(exc).__qualname__}: {exc}",
    )


def emit_annotation(annotation: Mapping[str, Any]) -> None:
    """Attach labels to the attempt (a tag, a judge's verdict); values must be JSON-encodable."""
    _emit(
        sc.ANNOTATION_SPAN,
        {
            f"{sc.ANNOTATION_PREFIX}{key}": value if isinstance(value, (str, int, float, bool)) else to_json(value)
            for key, value in annotation.items()
        },
    )


def emit_span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    start_time: float | None = None,
    end_time: float | None = None,
    error: str | None = None,
) -> None:
    """Record one finished span in the current attempt: a step that `operation` cannot wrap (it happened
    elsewhere, or its times are known afterwards). Times are seconds since the epoch (default: now);
    `error` marks it failed. Attribute values are OpenTelemetry's (primitives or lists of them; anything else is
    written as JSON). Inside an attempt the standard OpenTelemetry API reaches the store too, once
    `instrument_frameworks()` has run (the runner runs it)."""
    from opentelemetry.trace import Status, StatusCode

    plain = {k: v if isinstance(v, (str, bool, int, float)) else to_json(v) for k, v in (attributes or {}).items()}
    start = None if start_time is None else int(start_time * 1e9)
    span = get_tracer().start_span(name, attributes=plain, start_time=start, record_exception=False)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=None if end_time is None else int(end_time * 1e9))


class operation:
    """A span around a block or a function, recording its inputs and output.

    with operation("search", query=q) as op:
        op.set_output(results)

    @operation                     # or @operation("name")
    def search(query): ...
    """

    def __new__(cls, name: str | Callable[..., Any] | None = None, **inputs: Any) -> Any:
        if callable(name):  # bare @operation
            return _traced(name, name.__name__)
        return super().__new__(cls)

    def __init__(self, name: str | None = None, **inputs: Any) -> None:
        self.name = name or "operation"
        self.inputs = inputs
        self._span_cm: Any = None
        self._span: Any = None

    def set_output(self, output: Any) -> None:
        if self._span is not None:
            self._span.set_attribute(sc.OPERATION_OUTPUT, to_json(output))

    def __enter__(self) -> operation:
        attributes = {sc.OPERATION_NAME: self.name}
        if self.inputs:
            attributes[sc.OPERATION_INPUT] = to_json(self.inputs)
        self._span_cm = get_tracer().start_as_current_span(self.name, attributes=attributes, record_exception=False)
        self._span = self._span_cm.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None and self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_attribute(sc.EXCEPTION_TYPE, exc_type.__qualname__)
            self._span.set_attribute(sc.EXCEPTION_MESSAGE, str(exc))
            self._span.set_status(Status(StatusCode.ERROR, f"{exc_type.__qualname__}: {exc}"))
        self._span_cm.__exit__(exc_type, exc, tb)
        self._span = self._span_cm = None

    def __call__(self, function: F) -> F:
        return _traced(function, self.name if self.name != "operation" else function.__name__)


def _traced(function: F, name: str) -> F:
    """`function` with each call recorded as an operation span of its arguments and result."""
    signature = inspect.signature(function)

    def inputs_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            return dict(signature.bind(*args, **kwargs).arguments)
        except TypeError:
            return {"args": args, "kwargs": kwargs}

    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with operation(name, **inputs_of(args, kwargs)) as op:
                result = await function(*args, **kwargs)
                op.set_output(result)
                return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        with operation(name, **inputs_of(args, kwargs)) as op:
            result = function(*args, **kwargs)
            op.set_output(result)
            return result

    return run  # type: ignore[return-value]
