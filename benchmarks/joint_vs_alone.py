"""APO alone, GRPO alone and Joint (both in one run) on the calculator agent, at the same wall-clock budget.

The agent is the demo's plain task (two-digit additions, `examples/calc_agent.py`) with its system prompt taken
from a `PromptTemplate` resource, so that APO has something to rewrite. Each variant starts from the same
SmolLM2-135M weights and the same seed prompt, trains for `--budget` seconds (`time_budget_s`: GRPO and Joint
stop after the step that ends past it, APO starts no round past it), then the prompt and weights it ends with are
scored greedily on `--held-out` problems no variant saw (a Baseline run). The critic and editor of APO and Joint
are the policy model itself, through its gateway (no API key). Variants are interleaved seed by seed, so the
machine's other load hits them alike; run it under `nice -n 19`.

    nice -n 19 .venv/bin/python benchmarks/joint_vs_alone.py --budget 150 --seeds 0 1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import agentgrad as ag
from examples.calc_agent import EXAMPLES, client_for, make_splits, parse_answer

SEED_PROMPT = ag.PromptTemplate(
    template="Solve the problem and give the final result on the last line as 'Answer: <number>'."
)
VARIANTS = ("apo", "grpo", "joint")
GRPO_SETTINGS: dict[str, Any] = dict(
    steps=1000, prompts_per_step=8, group_size=8, learning_rate=1e-5, max_tokens=48, val_every=0, micro_batch_size=8
)
APO_SETTINGS: dict[str, Any] = dict(
    branch_factor=2,
    critic_examples=4,
    max_tokens=128,
    max_tries=1,
    val_size=32,
    critic_temperature=0.7,
    lenient_replies=True,
    editor_temperature=0.7,
)


@ag.rollout
def prompted_calc_agent(task: dict[str, Any], prompt: ag.PromptTemplate, llm: ag.LLM) -> float:
    messages: list[dict[str, Any]] = [{"role": "system", "content": prompt.format()}]
    for user, assistant in EXAMPLES:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": task["question"]})
    reply = client_for(llm).chat.completions.create(model=llm.model, messages=messages, **llm.sampling_parameters)
    return 1.0 if parse_answer(reply.choices[0].message.content or "") == task["answer"] else 0.0


def served(engine: Any, store: ag.Store) -> Any:
    """The engine behind a gateway that records into `store` (no training): what APO and the held-out runs call."""
    from agentgrad.policy.config import PolicyConfig, make_policy

    return make_policy(PolicyConfig(), store, engine, None)


def train(
    variant: str,
    engine: Any,
    store: ag.Store,
    seed: int,
    budget: float,
    train_set: list[Any],
    val_set: list[Any],
    prompt_every: int = 3,
    critic: dict[str, Any] | None = None,
) -> ag.PromptTemplate:
    """Train `variant` for `budget` seconds; the prompt it ends with (its weights are the engine's)."""
    if variant == "apo":
        with served(engine, store) as policy:
            llm = policy.llm(temperature=0.0, max_tokens=GRPO_SETTINGS["max_tokens"])
            apo = ag.APO(
                steps=1000,
                beam_width=2,
                prompts_per_step=8,
                time_budget_s=budget,
                seed=seed,
                **APO_SETTINGS,
                **critic or {},
            )
            trainer = ag.Trainer(
                apo, n_runners=1, runner_concurrency=16, store=store, resources={"prompt": SEED_PROMPT, "llm": llm}
            )
            result = trainer.fit(prompted_calc_agent, train_set, val_set)
            assert result.prompt is not None
            return result.prompt
    grpo = ag.GRPO(local_engine=engine, time_budget_s=budget, seed=seed, **GRPO_SETTINGS)
    algorithm: Any = grpo
    if variant == "joint":
        algorithm = ag.Joint(
            apo=ag.APO(seed=seed, **APO_SETTINGS, **critic or {}), grpo=grpo, prompt_every=prompt_every
        )
    trainer = ag.Trainer(algorithm, n_runners=1, runner_concurrency=16, store=store, resources={"prompt": SEED_PROMPT})
    trainer.fit(prompted_calc_agent, train_set, val_set)
    latest = asyncio.run(store.get_latest_resources())
    assert latest is not None
    prompt = latest.resources["prompt"]
    assert isinstance(prompt, ag.PromptTemplate)
    return prompt


def held_out(engine: Any, store: ag.Store, prompt: ag.PromptTemplate, tasks: list[Any]) -> float:
    """Greedy accuracy of `prompt` and the engine's weights on `tasks`."""
    with served(engine, store) as policy:
        llm = policy.llm(temperature=0.0, max_tokens=GRPO_SETTINGS["max_tokens"])
        trainer = ag.Trainer(
            ag.Baseline(), n_runners=1, runner_concurrency=16, store=store, resources={"prompt": prompt, "llm": llm}
        )
        result = trainer.fit(prompted_calc_agent, [], tasks)
        assert result.final is not None
        return result.final.success_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=150.0, help="training seconds per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--held-out", type=int, default=256, help="held-out problems scored after training")
    parser.add_argument("--val", type=int, default=32, help="validation problems (APO's and Joint's prompt scores)")
    parser.add_argument("--prompt-every", type=int, default=3, help="Joint: a prompt round after every k-th step")
    parser.add_argument("--out", default=".agentgrad/joint-bench", help="one store per run goes here")
    parser.add_argument(
        "--critic",
        default="policy",
        help="APO's and Joint's critic and editor: the policy itself (through its gateway), or a built-in model served "
        "by a second engine beside it (qwen2.5-coder-0.5b: `make qwen`)",
    )
    args = parser.parse_args()
    from agentgrad.engine import Engine
    from agentgrad.engine.server import create_engine_app
    from agentgrad.serving import ServerThread

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with contextlib.ExitStack() as stack:
        critic: dict[str, Any] | None = None
        if args.critic != "policy":  # a second engine serves the critic and editor; its time counts in each budget
            critic_engine = Engine(args.critic)
            stack.callback(critic_engine.close)
            critic_url = stack.enter_context(ServerThread(create_engine_app(critic_engine))).url
            critic = {"base_url": critic_url + "/v1", "api_key": "none", "critic_model": critic_engine.name}
        for seed in args.seeds:
            rows += run_seed(args, seed, out, critic)
    print("\n| agent | critic | variant | seed | held-out accuracy | training wall time (s) |")
    print("|---|---|---|---|---|---|")
    for variant, seed, accuracy, trained, _ in rows:
        shown = "-" if variant == "grpo" else args.critic
        print(f"| calculator (SmolLM2-135M) | {shown} | {variant} | {seed} | {accuracy:.3f} | {trained:.0f} |")


def run_seed(args: argparse.Namespace, seed: int, out: Path, critic: dict[str, Any] | None) -> list[tuple[Any, ...]]:
    """Each variant on one seed's tasks: (variant, seed, held-out accuracy, training seconds, final prompt) each."""
    from agentgrad.engine import Engine

    rows = []
    train_set, held = make_splits(n_train=2000, n_val=args.held_out, seed=seed)
    train_set, val_set = train_set[args.val :], train_set[: args.val]  # validation apart from training tasks
    for variant in args.variants:
        path = out / f"{variant}-seed{seed}.db"
        path.unlink(missing_ok=True)
        store = ag.SqliteStore(path)
        engine = Engine()
        began = time.perf_counter()
        prompt = train(variant, engine, store, seed, args.budget, train_set, val_set, args.prompt_every, critic)
        trained = time.perf_counter() - began
        accuracy = held_out(engine, store, prompt, held)
        engine.close()
        rows.append((variant, seed, accuracy, trained, prompt.template))
        print(
            f"RESULT variant={variant} seed={seed} held_out_accuracy={accuracy:.3f} train_wall_s={trained:.0f} "
            f"store={path} prompt={prompt.template!r}",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
