"""The data model: every object the store keeps and every resource an algorithm trains.

One module on purpose: the store backends, the HTTP API, the runner and the algorithms
all speak these types, so they are the contract of the whole system.
"""

from __future__ import annotations

import os
import re
import string
import time
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentgrad.semconv import gateway_route


def now() -> float:
    """Wall-clock time in seconds since the epoch: the default clock of every store (`Store(clock=...)`)."""
    return time.time()


class RolloutStatus(str, Enum):
    """`queuing → running → succeeded | failed | cancelled`, with `requeuing` between attempts."""

    QUEUING = "queuing"
    RUNNING = "running"
    REQUEUING = "requeuing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in FINISHED_ROLLOUT


FINISHED_ROLLOUT = frozenset({RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.CANCELLED})


class AttemptStatus(str, Enum):
    """`running → succeeded | failed | timeout | unresponsive`."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    UNRESPONSIVE = "unresponsive"

    @property
    def finished(self) -> bool:
        return self is not AttemptStatus.RUNNING


class WorkerStatus(str, Enum):
    IDLE = "idle"
    BUSY = "busy"
    STOPPED = "stopped"


UNRESPONSIVE_SECONDS = 30.0
"""Default silence after which an attempt is given up: 15 missed heartbeats of a runner (it sends one every 2 s)."""


MissingReward = Literal["fail", "zero"]
"""What a rollout that ends with no reward becomes (`RolloutConfig.missing_reward`)."""


class RolloutConfig(BaseModel):
    """Retry policy of a rollout: how long an attempt may take and how often it is retried.

    By default an agent's own failure fails the rollout, while a rollout whose runner died
    (killed, hung, cut off: no span and no heartbeat for `unresponsive_seconds`) runs again,
    up to `max_attempts_if_lost` attempts in all.
    """

    model_config = ConfigDict(extra="forbid")

    timeout_seconds: float | None = Field(None, gt=0, description="An attempt running longer is marked `timeout`.")
    unresponsive_seconds: float | None = Field(
        UNRESPONSIVE_SECONDS,
        gt=0,
        description="An attempt without a span or heartbeat for this long is marked `unresponsive` (its runner is "
        "taken for dead). The default, 30 s, is 15 missed heartbeats of a runner; None never gives an attempt up.",
    )
    max_attempts: int = Field(1, ge=1, description="Attempts allowed in total, the first one included.")
    max_attempts_if_lost: int = Field(
        3,
        ge=1,
        description="Attempts allowed in total when an attempt ends `unresponsive` (its runner was lost, which is "
        "not the task's fault), if that is more than `max_attempts`: so a dead runner's rollout runs again by default.",
    )
    retry_on: list[AttemptStatus] = Field(
        default_factory=lambda: [AttemptStatus.FAILED, AttemptStatus.TIMEOUT, AttemptStatus.UNRESPONSIVE],
        description="Attempt outcomes that send the rollout back to the queue while attempts remain.",
    )
    missing_reward: MissingReward = Field(
        "fail",
        description="What an attempt whose agent returned no reward and emitted none becomes: 'fail' (the attempt "
        "fails, with a message naming `emit_reward`) or 'zero' (it succeeds with no reward, counted as 0). Either "
        "way the rollout's metadata says it had none.",
    )


class Rollout(BaseModel):
    """One task to run, with its status and final reward."""

    rollout_id: str
    input: Any = Field(description="The task: any JSON value.")
    mode: str | None = Field(None, description="'train', 'val', 'test' or any label the algorithm uses.")
    resources_id: str | None = Field(None, description="Resources to run with; None means the latest.")
    status: RolloutStatus = RolloutStatus.QUEUING
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    reward: float | None = None
    num_attempts: int = 0
    latest_attempt_id: str | None = None
    enqueue_time: float = Field(default_factory=now)
    start_time: float | None = None
    end_time: float | None = None


class RolloutRequest(BaseModel):
    """What `enqueue_rollouts` takes for each new rollout."""

    model_config = ConfigDict(extra="forbid")

    input: Any
    mode: str | None = None
    resources_id: str | None = None
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Attempt(BaseModel):
    """One execution of a rollout by one worker."""

    rollout_id: str
    attempt_id: str
    sequence: int = Field(description="1 for the first attempt of the rollout, 2 for its first retry, ...")
    worker_id: str | None = None
    status: AttemptStatus = AttemptStatus.RUNNING
    start_time: float = Field(default_factory=now)
    end_time: float | None = None
    last_heartbeat_time: float = Field(default_factory=now)
    reward: float | None = None
    error: str | None = None


class AttemptedRollout(Rollout):
    """A rollout together with the attempt just opened for it (what `dequeue` hands a worker)."""

    attempt: Attempt


class SpanStatus(BaseModel):
    code: Literal["UNSET", "OK", "ERROR"] = "UNSET"
    description: str | None = None


class SpanEvent(BaseModel):
    name: str
    time: float
    attributes: dict[str, Any] = Field(default_factory=dict)


class Span(BaseModel):
    """Anything observed during an attempt: an LLM call, a reward, a message, an operation.

    `sequence_id` is assigned by the store, increasing within a rollout, so spans read back
    in the order they were written whatever clock the writers had.
    """

    rollout_id: str | None = Field(None, description="None for calls observed outside any rollout.")
    attempt_id: str | None = None
    sequence_id: int = 0
    trace_id: str = Field(default="", description="OpenTelemetry trace id, 32 hex digits.")
    span_id: str = Field(default="", description="OpenTelemetry span id, 16 hex digits.")
    parent_id: str | None = None
    name: str
    start_time: float = Field(default_factory=now)
    end_time: float | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)
    events: list[SpanEvent] = Field(default_factory=list)
    status: SpanStatus = Field(default_factory=SpanStatus)


class Worker(BaseModel):
    worker_id: str
    status: WorkerStatus = WorkerStatus.IDLE
    last_heartbeat_time: float = Field(default_factory=now)
    active_attempts: list[str] = Field(default_factory=list, description="Attempt ids the worker is running.")
    info: dict[str, Any] = Field(default_factory=dict, description="Host name, pid, anything the worker reports.")


class Metric(BaseModel):
    """One point of a training curve."""

    name: str = Field(description="Grouped by a slash: 'train/reward_mean', 'perf/tokens_per_s'.")
    step: int
    value: float
    time: float = Field(default_factory=now)
    run_id: str | None = Field(None, description="The run (`Run`) that logged it; None for points logged outside one.")


class RunStatus(str, Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Run(BaseModel):
    """One `fit`: what ran (algorithm, full configuration, seed), where (versions, machine, git), and how it went."""

    run_id: str
    name: str
    algorithm: str
    status: RunStatus = RunStatus.RUNNING
    config: dict[str, Any] = Field(default_factory=dict, description="The algorithm's configuration, secrets redacted.")
    seed: int | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    versions: dict[str, str] = Field(
        default_factory=dict, description="agentgrad, Python and key packages (torch, transformers, ...)."
    )
    machine: dict[str, Any] = Field(default_factory=dict, description="Host name, platform, CPUs, accelerator.")
    git: dict[str, Any] | None = Field(
        None, description="The user's working directory: commit and dirty flag, when it is a git checkout."
    )
    start_time: float = Field(default_factory=now)
    end_time: float | None = None
    final: dict[str, float] = Field(default_factory=dict, description="Each figure's last value.")
    best: dict[str, float] = Field(default_factory=dict, description="The best validation figure and its step.")
    checkpoints: list[str] = Field(default_factory=list)
    best_checkpoint: str | None = Field(None, description="The kept checkpoint that validated best (the one to serve).")
    best_checkpoint_validation: dict[str, float] = Field(
        default_factory=dict, description="The best checkpoint's validation figure and the step it was saved at."
    )
    error: str | None = None


class StoreStats(BaseModel):
    """Counts that a dashboard or a progress line shows."""

    rollouts: dict[str, int] = Field(description="Rollouts by status.")
    attempts: dict[str, int] = Field(description="Attempts by status.")
    spans: int
    workers: int
    resources: int
    requeues: int = Field(0, description="Times a rollout went back to the queue after an attempt ended (retries).")


# ----------------------------------------------------------------------------- resources

KEY_PLACEHOLDER = "agentgrad"
"""What an LLM resource without a key hands OpenAI clients, which refuse an empty one."""


class LLM(BaseModel):
    """An OpenAI-compatible endpoint the agent calls.

    With `proxied=True` the endpoint is an agentgrad gateway; the runner then hands each
    attempt a copy whose `base_url` routes the calls to that attempt's spans.

    A resource never holds a key: it is stored, versioned and served by the store's API. It
    names where the key is, and `api_key` reads it where the agent runs: the environment
    variable `api_key_env`; else, for a gateway (`proxied`), the gateway's token from
    `AGENTGRAD_TOKEN` (the gateway adds its backend's own key); else a placeholder for
    endpoints that take none.
    """

    model_config = ConfigDict(hide_input_in_errors=True)  # an error must not echo a key it refuses

    resource_type: Literal["llm"] = "llm"
    base_url: str
    model: str
    api_key_env: str | None = Field(
        None, description="Environment variable holding the endpoint's key, read where the agent runs."
    )
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)
    proxied: bool = False

    @model_validator(mode="before")
    @classmethod
    def _no_key_inside(cls, data: Any) -> Any:
        if isinstance(data, dict) and "api_key" in data:
            data = dict(data)
            key = data.pop("api_key")
            if key not in (None, "", KEY_PLACEHOLDER):  # the placeholder is what older stores hold
                raise ValueError(
                    "an LLM resource does not take api_key: resources are stored and served in the clear. "
                    "Put the key in an environment variable and pass api_key_env='ITS_NAME', or route the "
                    "agent through the gateway (proxied=True), whose backend holds the key"
                )
        return data

    @property
    def api_key(self) -> str:
        """The key to call `base_url` with, read from this process's environment (see the class docstring)."""
        if self.api_key_env is not None:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise KeyError(
                    f"the LLM resource reads its key from ${self.api_key_env}, which is not set where the agent runs; "
                    "set it in the runner's environment"
                )
            return key
        if self.proxied:
            from agentgrad.serving.guard import TOKEN_ENV

            return os.environ.get(TOKEN_ENV) or KEY_PLACEHOLDER
        return KEY_PLACEHOLDER

    def for_attempt(self, rollout_id: str, attempt_id: str, agent: str | None = None) -> LLM:
        """This endpoint as seen by one attempt (and one named agent): the gateway route that records into it."""
        if not self.proxied:
            return self
        return self.model_copy(update={"base_url": gateway_route(self.base_url, rollout_id, attempt_id, agent)})

    def for_agent(self, name: str) -> LLM:
        """This endpoint for one named agent of a multi-agent system: its calls carry `name` (see `ag.agent`).

        On the LLM the runner hands an attempt, the route keeps the attempt and adds `/agents/{name}`.
        """
        if not self.proxied:
            return self
        base = re.sub(r"/agents/[^/]+/v1/?$", "/v1", self.base_url.rstrip("/"))
        return self.model_copy(update={"base_url": gateway_route(base, agent=name)})


class PromptTemplate(BaseModel):
    """A prompt with placeholders, rendered as a Python format string or a Jinja template."""

    resource_type: Literal["prompt_template"] = "prompt_template"
    template: str
    engine: Literal["f-string", "jinja"] = "f-string"

    def format(self, **values: Any) -> str:
        if self.engine == "jinja":
            import jinja2

            return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(self.template).render(**values)
        try:
            return self.template.format(**values)
        except KeyError as exc:
            raise KeyError(f"prompt template needs a value for {exc.args[0]!r}; got {sorted(values)}") from None

    def placeholders(self) -> set[str]:
        """Names the template expects, so a rewrite that drops one can be caught."""
        if self.engine == "jinja":
            import jinja2
            import jinja2.meta

            return set(jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(self.template)))
        return {
            field.split(".")[0].split("[")[0] for _, field, _, _ in string.Formatter().parse(self.template) if field
        }


Resource = Annotated[LLM | PromptTemplate, Field(discriminator="resource_type")]
NamedResources = dict[str, Resource]


class ResourcesSnapshot(BaseModel):
    """A versioned set of named resources; each `add_resources` makes a new latest version."""

    resources_id: str
    version: int
    resources: NamedResources
    create_time: float = Field(default_factory=now)
    metadata: dict[str, Any] = Field(default_factory=dict, description="Score, parent, anything the algorithm keeps.")


# ----------------------------------------------------------------------------- training data


class Triplet(BaseModel):
    """One LLM call as training data: what the model saw, what it said, and the credit it gets."""

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float] | None = None
    reward: float | None = None
    rollout_id: str | None = None
    attempt_id: str | None = None
    span_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
