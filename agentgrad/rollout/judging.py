"""Judge rewards (`ag.judge`, `ag.group_judge`): a model scores outputs against a rubric, for tasks with no checker.

`ag.judge(output, rubric, judge=ag.Judge(...))` scores one output (pointwise) in [0, 1] and keeps the
judge's reasoning; `ag.group_judge(outputs, rubric, judge=...)` scores the rollouts of one task
relative to each other (RULER-style: the judge sees them side by side, which is easier to do well
than an absolute score), the shape GRPO's groups want: `GRPO(..., group_reward=GroupJudge(...))`.

Judge calls go through a gateway like every model call, with `x-agentgrad-not-trained`: they are
recorded (the reasoning is the span's output message) and never trained on (the adapters skip
them), and the trainer's sampling plan leaves them alone. The judge is any chat model the gateway
routes: a hosted one, or the local engine's own model. `ajudge` / `agroup_judge` are the async
twins; both share the prompts and the parsing here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentgrad.semconv import AGENT_HEADER, NOT_TRAINED_HEADER

SCALE = 10
"""The judge scores out of this; the reward is the score divided by it."""
JUDGE_AGENT = "judge"
"""The agent name judge calls are recorded under."""

POINTWISE = (
    "You are a strict grader. Grade the response against the rubric. Think briefly, then end with a line "
    f"'SCORE: <an integer from 0 to {SCALE}>'."
)
GROUPWISE = (
    "You are a strict grader. Several responses to the same task follow, numbered. Compare them with each other "
    "against the rubric: a better response gets a higher score. Think briefly, then end with one line per "
    f"response, 'SCORE <number>: <an integer from 0 to {SCALE}>'."
)
_POINT = re.compile(r"SCORE\s*:\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_GROUP = re.compile(r"SCORE\s*(\d+)\s*:\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)


class JudgeError(ValueError):
    """The judge's reply holds no score (or not one per response): the reply is in the message."""


@dataclass(frozen=True)
class Judge:
    """Which model judges, and where: `base_url` is a gateway's `…/v1` (so the calls are recorded)."""

    base_url: str
    model: str
    api_key: str = "agentgrad"
    temperature: float = 0.0
    max_tokens: int = 512
    timeout_s: float = 300.0
    structured: bool = False
    """Ask for a JSON answer under a schema (`response_format` json_schema): a small local judge (the engine's
    model, constrained) then always gives a well-formed score; a hosted judge needs structured outputs."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"Judge.base_url is an http(s) URL ending in /v1, not {self.base_url!r}")
        if self.max_tokens < 1:
            raise ValueError(f"Judge.max_tokens must be at least 1, not {self.max_tokens}")

    def _client_options(self) -> dict[str, Any]:
        headers = {NOT_TRAINED_HEADER: "judge", AGENT_HEADER: JUDGE_AGENT}
        return dict(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, default_headers=headers)

    def _request(self, messages: list[dict[str, str]], n: int | None = None) -> dict[str, Any]:
        """The chat request; `n`: how many responses a group judge scores (None: pointwise)."""
        request: dict[str, Any] = dict(
            model=self.model, messages=messages, temperature=self.temperature, max_tokens=self.max_tokens
        )
        if self.structured:
            field = "one score per response, in order" if n is not None else "a score"
            system = {
                "role": "system",
                "content": f"{messages[0]['content']} Answer in JSON: your reasoning, then {field}.",
            }
            request["messages"] = [system, *messages[1:]]
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "judgement", "schema": schema(n)},
            }
        return request


def schema(n: int | None) -> dict[str, Any]:
    """The JSON a structured judge answers: its reasoning, then a score (or one score per response)."""
    score = {"type": "integer", "enum": list(range(SCALE + 1))}
    scores = {"type": "array", "items": score, "minItems": n, "maxItems": n} if n is not None else None
    return {
        "type": "object",
        "properties": {
            "reasoning": {"type": "string", "maxLength": 400},
            "scores" if n is not None else "score": scores or score,
        },
        "required": ["reasoning", "scores" if n is not None else "score"],
        "additionalProperties": False,
    }


def _structured(reply: str) -> dict[str, Any] | None:
    """A structured judge's JSON answer, or None for a plain-text reply."""
    try:
        answer = json.loads(reply)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


@dataclass(frozen=True)
class Judgement:
    """A score in [0, 1] and the judge's reasoning (its whole reply)."""

    score: float
    reasoning: str


def _task_line(task: str | None) -> str:
    return f"## Task\n{task}\n\n" if task else ""


def pointwise_messages(output: str, rubric: str, task: str | None = None) -> list[dict[str, str]]:
    """The chat a pointwise judge gets."""
    user = f"{_task_line(task)}## Rubric\n{rubric}\n\n## Response\n{output}"
    return [{"role": "system", "content": POINTWISE}, {"role": "user", "content": user}]


def group_messages(outputs: Sequence[str], rubric: str, task: str | None = None) -> list[dict[str, str]]:
    """The chat a group judge gets: every response, numbered from 1."""
    shown = "\n\n".join(f"### Response {i}\n{text}" for i, text in enumerate(outputs, 1))
    user = f"{_task_line(task)}## Rubric\n{rubric}\n\n## Responses\n{shown}"
    return [{"role": "system", "content": GROUPWISE}, {"role": "user", "content": user}]


def _scaled(value: str) -> float:
    return min(max(float(value) / SCALE, 0.0), 1.0)


def parse_pointwise(reply: str) -> Judgement:
    """The last `SCORE: n` of the reply (or a structured reply's `score`), scaled to [0, 1]."""
    answer = _structured(reply)
    if answer is not None and isinstance(answer.get("score"), (int, float)):
        return Judgement(_scaled(str(answer["score"])), str(answer.get("reasoning", reply)))
    found = _POINT.findall(reply)
    if not found:
        raise JudgeError(f"the judge's reply has no 'SCORE: <0-{SCALE}>' line: {reply[:300]!r}")
    return Judgement(_scaled(found[-1]), reply)


def parse_group(reply: str, n: int) -> list[Judgement]:
    """One `SCORE i: n` per response (the last one for each; or a structured reply's `scores`), scaled to [0, 1]."""
    answer = _structured(reply)
    if answer is not None and isinstance(answer.get("scores"), list) and len(answer["scores"]) == n:
        reasoning = str(answer.get("reasoning", reply))
        return [Judgement(_scaled(str(value)), reasoning) for value in answer["scores"]]
    scores: dict[int, float] = {}
    for index, value in _GROUP.findall(reply):
        scores[int(index)] = _scaled(value)
    missing = [i for i in range(1, n + 1) if i not in scores]
    if missing:
        raise JudgeError(f"the judge's reply scores no response {missing} of {n}: {reply[:300]!r}")
    return [Judgement(scores[i], reply) for i in range(1, n + 1)]


def _reply_text(completion: Any) -> str:
    return completion.choices[0].message.content or ""


def judge(output: str, rubric: str, *, judge: Judge, task: str | None = None) -> Judgement:
    """Score `output` against `rubric` (pointwise) with the `judge` model; its reasoning is kept."""
    from openai import OpenAI

    with OpenAI(**judge._client_options()) as client:
        reply = client.chat.completions.create(**judge._request(pointwise_messages(output, rubric, task)))
    return parse_pointwise(_reply_text(reply))


async def ajudge(output: str, rubric: str, *, judge: Judge, task: str | None = None) -> Judgement:
    """`judge`, async."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(**judge._client_options()) as client:
        reply = await client.chat.completions.create(**judge._request(pointwise_messages(output, rubric, task)))
    return parse_pointwise(_reply_text(reply))


def group_judge(outputs: Sequence[str], rubric: str, *, judge: Judge, task: str | None = None) -> list[Judgement]:
    """Score the `outputs` of one task relative to each other (RULER-style), one judge call for the group."""
    from openai import OpenAI

    if not outputs:
        return []
    with OpenAI(**judge._client_options()) as client:
        reply = client.chat.completions.create(**judge._request(group_messages(outputs, rubric, task), len(outputs)))
    return parse_group(_reply_text(reply), len(outputs))


async def agroup_judge(
    outputs: Sequence[str], rubric: str, *, judge: Judge, task: str | None = None
) -> list[Judgement]:
    """`group_judge`, async."""
    from openai import AsyncOpenAI

    if not outputs:
        return []
    async with AsyncOpenAI(**judge._client_options()) as client:
        reply = await client.chat.completions.create(
            **judge._request(group_messages(outputs, rubric, task), len(outputs))
        )
    return parse_group(_reply_text(reply), len(outputs))


@dataclass(frozen=True)
class GroupJudge:
    """GRPO's `group_reward`: each group's final answers scored side by side by `judge` against `rubric`.

    Called with the task and the last assistant message of each successful rollout of its group; the
    task is shown to the judge as it is when it is a string, else as its repr.
    """

    judge: Judge
    rubric: str

    async def __call__(self, task: Any, outputs: Sequence[str]) -> list[float]:
        shown = task if isinstance(task, str) else repr(task)
        return [j.score for j in await agroup_judge(outputs, self.rubric, judge=self.judge, task=shown)]
