"""agentgrad around `agent.py`: the `LLM` resource's `base_url` is the attempt's gateway route.

The reward is execution match against the gold query. Each query the agent runs also earns its
own execution match as an emitted reward, so under per-turn credit (`GRPOConfig(credit="per_turn",
gamma=0.0)`) the call that wrote a query is paid for that query: a correcting query after a failed
one is what gets reinforced, not the failure before it. Each episode is annotated with whether its
first query failed (an error or nothing returned), whether a later one ran, and whether the final answer matched.
With a `PromptTemplate` resource named `prompt` (a `{schema}` slot, as `agent.INSTRUCTIONS`), that is the system
prompt, so APO can rewrite it (`benchmarks/joint_vs_alone.py --agent sql`). A training task may carry a
`first_query`: a mistake (`recovery.first_mistake`) the episode starts from, as if the model had run it
(`first_query_runs` times: 2, rerun unchanged), so that what is trained is the turn that fixes it.

    python -m examples.sql.train --model qwen2.5-coder-0.5b --limit 16   # held-out accuracy, untrained
"""

from __future__ import annotations

import argparse
from typing import Any

import agentgrad as ag
from examples.sql import agent, db

ANNOTATIONS = ("sql.first_failed", "sql.recovered", "sql.matched", "sql.queries", "sql.answered", "sql.from_mistake")


def annotation(episode: agent.Episode, reward: float, from_mistake: bool = False) -> dict[str, Any]:
    """What the demo's shares are counted from: self-corrected = first query failed and final answer matched;
    `from_mistake`: the episode started from a mistake it was given (its first query is not the model's)."""
    return {
        "sql.from_mistake": from_mistake,
        "sql.first_failed": episode.first_failed,
        "sql.recovered": episode.recovered,
        "sql.matched": reward >= 1.0,
        "sql.queries": len(episode.queries),
        "sql.answered": episode.answer is not None,
    }


@ag.rollout
def sql_rollout(task: dict[str, Any], llm: ag.LLM, prompt: ag.PromptTemplate | None = None) -> float:
    def pay_query(sql: str, failed: bool) -> None:  # the call that wrote this query earns its execution match
        ag.emit_reward(0.0 if failed else db.execution_match(task["db"], sql, task["gold"]))

    episode = agent.solve(task["question"], task["db"], model=llm.model, base_url=llm.base_url, api_key=llm.api_key,
                          run_first=bool(task.get("run_first")), retries=int(task.get("retries", 0)),
                          first_query=task.get("first_query"), first_query_runs=int(task.get("first_query_runs", 1)),
                          on_query=pay_query,
                          system_prompt=prompt.format(schema=db.schema(task["db"])) if prompt else None,
                          **llm.sampling_parameters)
    reward = db.execution_match(task["db"], episode.answer, task["gold"])
    ag.emit_annotation(annotation(episode, reward, from_mistake=task.get("first_query") is not None))
    return reward


def main() -> None:
    from agentgrad.policy.local import LocalPolicy
    from agentgrad.store import open_store
    from agentgrad.train.trainer import default_store_path

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a built-in model name or a Hugging Face folder")
    parser.add_argument("--split", default="held_out", choices=db.SPLITS)
    parser.add_argument("--limit", type=int, default=16, help="questions to evaluate, spread evenly over the split")
    parser.add_argument("--store", help="SQLite store path (default: the trainer's)")
    args = parser.parse_args()
    questions = db.load_questions(args.split)
    questions = questions[:: max(1, len(questions) // args.limit)][: args.limit]  # every database and kind of question
    store = open_store(args.store or default_store_path())
    with LocalPolicy(store, model=args.model) as policy:
        llm = policy.llm(temperature=0.0, max_tokens=256)
        ag.Trainer(store=store, resources={"llm": llm}).dev(sql_rollout, questions)


if __name__ == "__main__":
    main()
