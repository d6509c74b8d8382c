"""An agent on Anthropic's SDK whose reward comes from a judge: the engine's own model, through the gateway.

The agent answers a question with `anthropic.Anthropic().messages.create` (pointed at the gateway by
`ANTHROPIC_BASE_URL`, which the trainer sets); `ag.judge` then scores the answer against a rubric with
the local model, constrained to a JSON verdict (`structured=True`) so even a 135M model gives a
well-formed score. The judge's call is recorded in the rollout with its reasoning and never trained on.
"""

from __future__ import annotations

import agentgrad as ag

RUBRIC = "A good answer names the capital city asked for, in one short sentence."
TASKS = [{"question": "What is the capital of France?"}, {"question": "What is the capital of Italy?"}]


def answer_and_judge(task: dict, gateway_v1: str, model: str = "policy", judge_model: str = "judge") -> float:
    """One rollout: the agent's answer (anthropic SDK), then the local judge's score of it."""
    import anthropic

    client = anthropic.Anthropic(base_url=gateway_v1.removesuffix("/v1"), api_key="agentgrad", max_retries=0)
    reply = client.messages.create(model=model, max_tokens=24, messages=[{"role": "user", "content": task["question"]}])
    text = "".join(block.text for block in reply.content if block.type == "text")
    judge = ag.Judge(gateway_v1, judge_model, structured=True, max_tokens=96)
    return ag.judge(text, RUBRIC, judge=judge, task=task["question"]).score
