"""APO alone, GRPO alone and Joint (both in one run) on one agent, at the same wall-clock budget.

Two agents, each with its system prompt taken from a `PromptTemplate` resource, so that APO has something to
rewrite: `--agent calc`, the demo's plain task (two-digit additions, `examples/calc_agent.py`) on SmolLM2-135M
(full weights), and `--agent sql`, the LangGraph text-to-SQL agent (`examples/sql/`, its `INSTRUCTIONS` with their
`{schema}` slot as the seed prompt) on Qwen2.5-Coder-0.5B with the SQL demo's LoRA GRPO settings. Each variant
starts from the same weights and the same seed prompt, trains for `--budget` seconds (`time_budget_s`: GRPO and
Joint stop after the step that ends past it, APO starts no round past it), then the prompt and weights it ends with
are scored greedily on `--held-out` tasks no variant trained or validated on (a Baseline run): for the SQL agent,
questions on the databases training never sees, half the project's held-out ones and half the real-world ones.
The critic and editor of APO and Joint are the policy model itself, through its gateway (no API key); `--critic`
names a second built-in model, or with `--critic-url` a model of any OpenAI-compatible endpoint (an API's, its key
from OPENAI_API_KEY). Variants are interleaved seed by seed, so the machine's other load hits them alike; run it
under `nice -n 19`.

    nice -n 19 .venv/bin/python benchmarks/joint_vs_alone.py --budget 150 --seeds 0 1
    nice -n 19 .venv/bin/python benchmarks/joint_vs_alone.py --agent sql --budget 900 --prompt-every 2 --seeds 0 1
    OPENAI_API_KEY=... .venv/bin/python benchmarks/joint_vs_alone.py --agent sql --budget 900 --prompt-every 2 \
        --critic-url https://api.openai.com/v1 --critic gpt-4o
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import agentgrad as ag
from examples.calc_agent import EXAMPLES, client_for, make_splits, parse_answer

VARIANTS = ("apo", "grpo", "joint")
APO_SETTINGS: dict[str, Any] = dict(
    branch_factor=2,
    critic_examples=4,
    max_tries=1,
    critic_temperature=0.7,
    lenient_replies=True,
    editor_temperature=0.7,
)
Splits = tuple[list[Any], list[Any], list[Any]]


@dataclass(frozen=True)
class Setup:
    """One agent of the comparison: its rollout, seed prompt, model, GRPO settings and tasks."""

    label: str
    rollout: Any
    seed_prompt: ag.PromptTemplate
    engine: Callable[[], Any]  # a fresh engine holding the untrained weights
    grpo: dict[str, Any]  # GRPO settings beside the budget, the seed and the engine
    apo_max_tokens: int  # the critic's and editor's replies: the editor writes the whole template
    runners: int
    runner_concurrency: int
    held_out: int  # default held-out tasks
    val: int  # default validation tasks
    splits: Callable[[int, int, int], Splits]  # (seed, validation tasks, held-out tasks) -> (train, val, held-out)

    @property
    def max_tokens(self) -> int:
        return int(self.grpo["max_tokens"])


@ag.rollout
def prompted_calc_agent(task: dict[str, Any], prompt: ag.PromptTemplate, llm: ag.LLM) -> float:
    messages: list[dict[str, Any]] = [{"role": "system", "content": prompt.format()}]
    for user, assistant in EXAMPLES:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": task["question"]})
    reply = client_for(llm).chat.completions.create(model=llm.model, messages=messages, **llm.sampling_parameters)
    return 1.0 if parse_answer(reply.choices[0].message.content or "") == task["answer"] else 0.0


def calc_splits(seed: int, n_val: int, n_held: int) -> Splits:
    train_set, held = make_splits(n_train=2000, n_val=n_held, seed=seed)
    return train_set[n_val:], train_set[:n_val], held  # validation apart from training tasks


def sql_splits(seed: int, n_val: int, n_held: int) -> Splits:
    """Training and validation questions on the project's training databases (validation a seed's sample of them,
    apart from training); held-out on the databases training never sees, as the SQL demo validates."""
    from agentgrad.cli.sql_demo import load_sql_example, task_lists

    train_set, held = task_lists(load_sql_example().db, run_first=True, val_size=n_held // 2)
    random.Random(seed).shuffle(train_set)
    return train_set[n_val:], train_set[:n_val], held


def calc_setup() -> Setup:
    from agentgrad.engine import Engine

    return Setup(
        label="calculator (SmolLM2-135M)",
        rollout=prompted_calc_agent,
        seed_prompt=ag.PromptTemplate(
            template="Solve the problem and give the final result on the last line as 'Answer: <number>'."
        ),
        engine=Engine,
        grpo=dict(prompts_per_step=8, group_size=8, learning_rate=1e-5, max_tokens=48, micro_batch_size=8),
        apo_max_tokens=128,
        runners=1,
        runner_concurrency=16,
        held_out=256,
        val=32,
        splits=calc_splits,
    )


def sql_setup() -> Setup:
    """The SQL demo's agent and LoRA GRPO settings (`agentgrad/cli/sql_demo.py`), its prompt a resource."""
    from agentgrad.cli import sql_demo
    from agentgrad.engine import Engine
    from agentgrad.policy.config import PolicyConfig

    example = sql_demo.load_sql_example()
    return Setup(
        label="text-to-SQL (Qwen2.5-Coder-0.5B, LoRA)",
        rollout=example.sql_rollout,
        seed_prompt=ag.PromptTemplate(template=example.agent.INSTRUCTIONS),
        engine=lambda: Engine(sql_demo.MODEL, sampling_dtype="float32", name=sql_demo.MODEL),
        grpo=dict(
            prompts_per_step=sql_demo.PROMPTS_PER_STEP,
            group_size=sql_demo.GROUP_SIZE,
            max_tokens=sql_demo.MAX_TOKENS,
            rollout_timeout=sql_demo.ROLLOUT_TIMEOUT,
            learning_rate=sql_demo.LEARNING_RATE,
            credit="per_turn",
            gamma=0.0,
            micro_batch_size=2,
            gradient_checkpointing=True,
            policy=PolicyConfig(lora_rank=sql_demo.LORA_RANK),
        ),
        apo_max_tokens=384,
        runners=2,
        runner_concurrency=sql_demo.RUNNER_CONCURRENCY,
        held_out=80,
        val=16,
        splits=sql_splits,
    )


SETUPS: dict[str, Callable[[], Setup]] = {"calc": calc_setup, "sql": sql_setup}


def served(engine: Any, store: ag.Store) -> Any:
    """The engine behind a gateway that records into `store` (no training): what APO and the held-out runs call."""
    from agentgrad.policy.config import PolicyConfig, make_policy

    return make_policy(PolicyConfig(), store, engine, None)


def train(
    setup: Setup,
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
    apo_settings = {**APO_SETTINGS, "max_tokens": setup.apo_max_tokens, "val_size": len(val_set), **(critic or {})}
    runners: dict[str, Any] = {
        "n_runners": setup.runners,
        "runner_concurrency": setup.runner_concurrency,
        "store": store,
    }
    if variant == "apo":
        with served(engine, store) as policy:
            llm = policy.llm(temperature=0.0, max_tokens=setup.max_tokens)
            apo = ag.APO(steps=1000, beam_width=2, prompts_per_step=8, time_budget_s=budget, seed=seed, **apo_settings)
            trainer = ag.Trainer(apo, **runners, resources={"prompt": setup.seed_prompt, "llm": llm})
            result = trainer.fit(setup.rollout, train_set, val_set)
            assert result.prompt is not None
            return result.prompt
    grpo = ag.GRPO(local_engine=engine, time_budget_s=budget, seed=seed, steps=1000, val_every=0, **setup.grpo)
    algorithm: Any = grpo
    if variant == "joint":
        algorithm = ag.Joint(apo=ag.APO(seed=seed, **apo_settings), grpo=grpo, prompt_every=prompt_every)
    trainer = ag.Trainer(algorithm, **runners, resources={"prompt": setup.seed_prompt})
    trainer.fit(setup.rollout, train_set, val_set)
    latest = asyncio.run(store.get_latest_resources())
    assert latest is not None
    prompt = latest.resources["prompt"]
    assert isinstance(prompt, ag.PromptTemplate)
    return prompt


def held_out(setup: Setup, engine: Any, store: ag.Store, prompt: ag.PromptTemplate, tasks: list[Any]) -> float:
    """Greedy accuracy of `prompt` and the engine's weights on `tasks`."""
    with served(engine, store) as policy:
        llm = policy.llm(temperature=0.0, max_tokens=setup.max_tokens)
        trainer = ag.Trainer(
            ag.Baseline(),
            n_runners=setup.runners,
            runner_concurrency=setup.runner_concurrency,
            store=store,
            resources={"prompt": prompt, "llm": llm},
        )
        result = trainer.fit(setup.rollout, [], tasks)
        assert result.final is not None
        return result.final.success_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", choices=sorted(SETUPS), default="calc", help="the calculator or the SQL agent")
    parser.add_argument("--budget", type=float, default=150.0, help="training seconds per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--held-out", type=int, help="held-out tasks scored after training (calc 256, sql 80)")
    parser.add_argument(
        "--val",
        type=int,
        help="validation tasks, apart from training (APO's and Joint's prompt scores; calc 32, sql 16)",
    )
    parser.add_argument("--prompt-every", type=int, default=3, help="Joint: a prompt round after every k-th step")
    parser.add_argument("--out", default=".agentgrad/joint-bench", help="one store per run goes here")
    parser.add_argument(
        "--critic",
        default="policy",
        help="APO's and Joint's critic and editor: the policy itself (through its gateway), or a built-in model served "
        "by a second engine beside it (qwen2.5-coder-0.5b: `make qwen`), or with --critic-url the model of that name there",
    )
    parser.add_argument(
        "--critic-url",
        help="an OpenAI-compatible endpoint (its /v1 root) serving --critic, its key from OPENAI_API_KEY: "
        "--critic-url https://api.openai.com/v1 --critic gpt-4o (its time counts in each budget)",
    )
    args = parser.parse_args()
    setup = SETUPS[args.agent]()
    args.held_out = args.held_out or setup.held_out
    args.val = args.val or setup.val
    from agentgrad.engine import Engine
    from agentgrad.engine.server import create_engine_app
    from agentgrad.serving import ServerThread

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with contextlib.ExitStack() as stack:
        critic: dict[str, Any] | None = None
        if args.critic_url:  # the key stays in the environment (`apo_critic.Critic.of`), out of every store
            critic = {"base_url": args.critic_url, "critic_model": args.critic}
        elif args.critic != "policy":  # a second engine serves the critic and editor; its time counts in each budget
            critic_engine = Engine(args.critic)
            stack.callback(critic_engine.close)
            critic_url = stack.enter_context(ServerThread(create_engine_app(critic_engine))).url
            critic = {"base_url": critic_url + "/v1", "api_key": "none", "critic_model": critic_engine.name}
        for seed in args.seeds:
            rows += run_seed(setup, args, seed, out, critic)
    print("\n| agent | critic | variant | seed | held-out accuracy | training wall time (s) |")
    print("|---|---|---|---|---|---|")
    for variant, seed, accuracy, trained, _ in rows:
        shown = "-" if variant == "grpo" else args.critic
        print(f"| {setup.label} | {shown} | {variant} | {seed} | {accuracy:.3f} | {trained:.0f} |")


def run_seed(
    setup: Setup, args: argparse.Namespace, seed: int, out: Path, critic: dict[str, Any] | None
) -> list[tuple[Any, ...]]:
    """Each variant on one seed's tasks: (variant, seed, held-out accuracy, training seconds, final prompt) each."""
    rows = []
    train_set, val_set, held = setup.splits(seed, args.val, args.held_out)
    for variant in args.variants:
        path = out / f"{args.agent}-{variant}-seed{seed}.db"
        path.unlink(missing_ok=True)
        store = ag.SqliteStore(path)
        engine = setup.engine()
        began = time.perf_counter()
        prompt = train(setup, variant, engine, store, seed, args.budget, train_set, val_set, args.prompt_every, critic)
        trained = time.perf_counter() - began
        accuracy = held_out(setup, engine, store, prompt, held)
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
