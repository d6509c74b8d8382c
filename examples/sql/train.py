"""agentgrad around `agent.py`: the `LLM` resource's `base_url` is the attempt's gateway route.

The reward is execution match against the gold query. Each episode is annotated with whether a
query failed and whether a later one ran (`sql.self_corrected`): the share of failed-then-fixed
episodes before and after training is what RL is expected to raise.

    python -m examples.sql.train --model qwen2.5-coder-0.5b --limit 16   # held-out accuracy, untrained
"""

from __future__ import annotations

import argparse
from typing import Any

import agentgrad as ag
from examples.sql import agent, db

ANNOTATIONS = ("sql.failed_query", "sql.self_corrected", "sql.queries", "sql.answered")


@ag.rollout
def sql_rollout(task: dict[str, Any], llm: ag.LLM) -> float:
    episode = agent.solve(task["question"], task["db"], model=llm.model, base_url=llm.base_url, api_key=llm.api_key,
                          run_first=bool(task.get("run_first")), **llm.sampling_parameters)
    ag.emit_annotation({
        "sql.failed_query": episode.failed_query,
        "sql.self_corrected": episode.self_corrected,
        "sql.queries": len(episode.queries),
        "sql.answered": episode.answer is not None,
    })
    return db.execution_match(task["db"], episode.answer, task["gold"])


def main() -> None:
    from agentgrad.policy.local import LocalPolicy
    from agentgrad.store import open_store
    from agentgrad.train.trainer import default_store_path

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a built-in model name or a Hugging Face folder")
    parser.add_argument("--split", default="held_out", choices=["train", "held_out"])
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
