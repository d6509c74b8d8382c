"""What the joint-run tests share: an agent whose reward its prompt decides, a critic and editor that write a
better prompt, then a worse one, and one joint run on a tiny model (`python -m tests.joint_agents` runs it in a
process of its own, for the SIGKILL test).

The agent asks the policy each question under its prompt and is rewarded by the prompt: 0.5 for the seed, 1.0 once
the prompt says BETTER, 0.0 once it says WORSE, plus 0.01 per character of the reply mod 3 (so a group's rollouts
differ and GRPO has something to compare). The editor adds BETTER to a prompt without it and WORSE to one with it:
a joint run keeps the first rewrite and refuses the second.
"""

from __future__ import annotations

import itertools
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openai import OpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import agentgrad as ag

SEED_PROMPT = ag.PromptTemplate(template="Answer the question. {question}")
TASKS = [{"question": f"What is {a} + {b}?"} for a, b in itertools.product(range(1, 7), range(1, 5))]
TRAIN, VAL = TASKS[:16], TASKS[16:20]


def prompt_score(template: str) -> float:
    return 0.0 if "WORSE" in template else 1.0 if "BETTER" in template else 0.5


@ag.rollout
def prompted_agent(task: dict[str, Any], prompt: ag.PromptTemplate, llm: ag.LLM) -> float:
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    messages = [{"role": "user", "content": prompt.format(question=task["question"])}]
    reply = client.chat.completions.create(model=llm.model, messages=messages, **llm.sampling_parameters)  # type: ignore[arg-type]
    return prompt_score(prompt.template) + 0.01 * (len(reply.choices[0].message.content or "") % 3)


@dataclass
class CriticEditor:
    """An OpenAI-compatible critic (`critic`) and editor (`editor`); `requests` holds what each was asked."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def asked(self, model: str) -> list[str]:
        with self.lock:
            return [r["messages"][-1]["content"] for r in self.requests if r["model"] == model]

    def app(self) -> Starlette:
        async def chat_completions(request: Request) -> JSONResponse:
            body = await request.json()
            with self.lock:
                self.requests.append(body)
            text = body["messages"][-1]["content"]
            if body["model"] == "critic":
                content = "<critique>The prompt should say how good the answer must be.</critique>"
            else:
                template = re.search(r"<template>\n(.*)\n</template>", text, re.S).group(1)  # type: ignore[union-attr]
                word = "WORSE" if "BETTER" in template else "BETTER"
                content = f"<new_prompt>\n{word} {template}\n</new_prompt>"
            message = {"role": "assistant", "content": content}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            return JSONResponse({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                 "choices": [choice], "usage": usage})

        return Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"])])


def joint(engine: Any, critic_url: str | None, success_threshold: float = 1.0, **settings: Any) -> ag.Joint:
    """A joint run on `engine`: prompt rounds every 2 steps (critic and editor at `critic_url`, else the policy);
    a rollout below `success_threshold` is a failure for validation and for the critic alike."""
    apo = ag.APO(branch_factor=1, critic_examples=2, max_tries=1, max_tokens=16, success_threshold=success_threshold,
                 **({"base_url": critic_url, "critic_model": "critic", "editor_model": "editor"} if critic_url else {}))
    grpo = ag.GRPO(local_engine=engine, **{"steps": 4, "prompts_per_step": 2, "group_size": 2, "max_tokens": 6,
                                          "val_every": 1, "learning_rate": 1e-3, "success_threshold": success_threshold,
                                          **settings})
    return ag.Joint(apo=apo, grpo=grpo, prompt_every=2)


def fit(algorithm: ag.Joint, store: ag.Store) -> Any:
    trainer = ag.Trainer(algorithm, n_runners=2, store=store, resources={"prompt": SEED_PROMPT})
    return trainer.fit(prompted_agent, TRAIN, VAL)


def main(model_dir: str, run_dir: str) -> None:
    """One joint run checkpointing every step into `run_dir` (resumed from there when it holds a checkpoint)."""
    from agentgrad.serving import ServerThread
    from tests.tiny_models import tiny_engine_of

    critic = CriticEditor()
    with ServerThread(critic.app()) as server:
        engine = tiny_engine_of(Path(model_dir))
        algorithm = joint(engine, server.url + "/v1", checkpoint_dir=str(Path(run_dir) / "checkpoints"),
                          checkpoint_every=1)
        fit(algorithm, ag.SqliteStore(Path(run_dir) / "store.db"))
        engine.close()


if __name__ == "__main__":
    main(*sys.argv[1:3])
