"""A LangChain agent with a tool, trained with agentgrad without a change to its code.

`solve` is plain LangChain: `ChatOpenAI()` with a bound tool, called until it stops asking for
tools. It takes its endpoint from `OPENAI_BASE_URL` / `OPENAI_API_KEY`, as any `openai`-based
code does; `GatewayEnvHook` points those at the gateway route of the attempt being run, so
every call it makes is recorded, with token ids and logprobs, in the right rollout.

    agentgrad engine serve &        # the local model on :8000; it answers to its own name, smollm2-135m
    agentgrad gateway --store run.db --backend policy=http://127.0.0.1:8000/v1,model=smollm2-135m,system=agentgrad &
    python examples/langchain_agent.py --gateway http://127.0.0.1:8090/v1 --store run.db

`model=` renames the agent's model (`policy`) to the engine's; `system=agentgrad` has the gateway
ask the engine for token ids and logprobs (an upstream of another system gets the request as sent).
"""

from __future__ import annotations

import argparse

from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import agentgrad as ag
from agentgrad.rollout.gateway_env import GatewayEnvHook


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def solve(question: str, model: str) -> str:
    """The agent as its authors wrote it: ask, run the tools the model calls, ask again."""
    llm = ChatOpenAI(model=model, temperature=0).bind_tools([add])
    messages: list[BaseMessage] = [HumanMessage(question)]
    reply = llm.invoke(messages)
    while reply.tool_calls:
        messages.append(reply)
        for call in reply.tool_calls:
            messages.append(ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"]))
        reply = llm.invoke(messages)
    return str(reply.content)


# ----------------------------------------------------------------------------- agentgrad: configuration only


@ag.rollout
def calc_agent(task: dict) -> float:
    """Reward 1 when the final answer ends with the right number."""
    answer = solve(task["question"], task.get("model", "policy"))
    return 1.0 if answer.strip().rstrip(".").endswith(str(task["answer"])) else 0.0


TASKS = [{"question": f"What is {a} plus {b}?", "answer": a + b} for a, b in [(12, 30), (7, 8), (41, 1)]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gateway", required=True, help="the gateway's base URL, e.g. http://127.0.0.1:8090/v1")
    parser.add_argument("--store", required=True, help="the store the gateway records into (SQLite path or URL)")
    args = parser.parse_args()
    ag.Trainer(store=args.store, hooks=[GatewayEnvHook(args.gateway)]).dev(calc_agent, TASKS)


if __name__ == "__main__":
    main()
