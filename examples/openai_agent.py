"""A plain `openai` agent whose one client, built at import, is shared by every rollout in the process.

Nothing in `answer` knows about agentgrad. Two lines of configuration route it: the process's
`OPENAI_BASE_URL` points at the gateway, and `instrument_openai()` makes each call carry the
rollout and attempt of the context it runs in, so concurrent rollouts never mix their calls.

    OPENAI_BASE_URL=http://127.0.0.1:8090/v1 python examples/openai_agent.py --store run.db

with the engine and the gateway started as in `examples/langchain_agent.py`.
"""

from __future__ import annotations

import argparse

from openai import AsyncOpenAI

import agentgrad as ag

client = AsyncOpenAI()


async def answer(question: str, model: str = "policy") -> str:
    reply = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}])
    return reply.choices[0].message.content or ""


@ag.rollout
async def echo_agent(task: dict) -> float:
    return 1.0 if (await answer(task["question"])).endswith(task["question"]) else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="the store the gateway records into (SQLite path or URL)")
    args = parser.parse_args()
    ag.instrument_openai()
    tasks = [{"question": f"say {i}"} for i in range(8)]
    ag.Trainer(store=args.store, runner_concurrency=8).dev(echo_agent, tasks)


if __name__ == "__main__":
    main()
