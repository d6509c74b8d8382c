"""Run (or train) a framework's unchanged agent on the local engine, its runners in the framework's own environment.

From the core environment (`.venv`): the engine, the gateway, the store and the algorithm run
here; `agentgrad runner` processes of `.venv-<framework>` (or of this interpreter, for the
frameworks the core can host) join the store over HTTP and run the agent.

    .venv/bin/python -m examples.frameworks.run langchain                 # Baseline over the tasks
    .venv/bin/python -m examples.frameworks.run crewai --grpo-steps 1     # after `make env-crewai`
    .venv/bin/python -m examples.frameworks.run crewai-crew --grpo-steps 1   # a team: one LoRA adapter per agent
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

FRAMEWORKS = {  # name -> (environment, agent spec); "core" is the interpreter running this
    "openai": ("core", "examples.frameworks.openai_train:rollout"),
    "langchain": ("core", "examples.frameworks.langchain_train:rollout"),
    "langgraph": ("core", "examples.frameworks.langgraph_train:rollout"),
    "openai-agents": ("core", "examples.frameworks.openai_agents_sdk_train:rollout"),
    "autogen": ("autogen", "examples.frameworks.autogen_train:rollout"),
    "crewai": ("crewai", "examples.frameworks.crewai_train:rollout"),
    "agent-framework": ("core", "examples.frameworks.agent_framework_train:rollout"),
    "agentscope": ("core", "examples.frameworks.agentscope_train:rollout"),
}
TEAMS = {  # name -> (environment, agent spec, its agents' names): each agent gets its own adapter (`roles_of`)
    "autogen-team": ("autogen", "examples.frameworks.autogen_team_train:rollout", ("calculator", "reviewer")),
    "crewai-crew": ("crewai", "examples.frameworks.crewai_crew_train:rollout", ("calculator", "reviewer")),
}
AGENTS = {name: (environment, spec) for name, (environment, spec, *_) in {**FRAMEWORKS, **TEAMS}.items()}


def roles_of(name: str) -> dict[str, str] | None:
    """`GRPOConfig(roles=...)` for a team: each of its agents a role of its own name; None for a single agent."""
    return {agent: f"^{agent}$" for agent in TEAMS[name][2]} if name in TEAMS else None


def python_for(framework: str) -> str:
    from agentgrad.rollout.venvs import framework_python

    if framework not in AGENTS:
        raise SystemExit(f"unknown framework {framework!r}; one of {', '.join(AGENTS)}")
    environment = AGENTS[framework][0]
    return sys.executable if environment == "core" else framework_python(environment)


async def run(framework: str, algorithm: Any, store: Any, train: list[Any], val: list[Any] | None = None, *,
              llm: Any = None, gateway: str | None = None, workers: int = 2, log: Path | None = None) -> Any:
    """`algorithm` over the tasks with the framework's runners in their own process.

    `llm` (a Baseline's endpoint) is published first; `gateway` (…/v1) routes agents that build
    `OpenAI()` without arguments. GRPO publishes its own LLM and gateway.
    """
    from agentgrad.rollout.venvs import RunnerProcesses, serve_store
    from agentgrad.train.processes import run_with_runners

    if llm is not None:
        await store.add_resources({"llm": llm})
    with serve_store(store) as url:
        runner = RunnerProcesses(python_for(framework), url, AGENTS[framework][1], workers=workers, gateway=gateway,
                                 log=log)
        with runner:
            return await run_with_runners(algorithm, store, [runner], train, val)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("framework", choices=list(AGENTS))
    parser.add_argument("--tasks", type=int, default=8, help="three-digit additions to run")
    parser.add_argument("--grpo-steps", type=int, default=0, help="train with GRPO for this many steps (0: Baseline only)")
    parser.add_argument("--temperature", type=float, default=0.0, help="Baseline sampling temperature")
    parser.add_argument("--store", default=None, help="SQLite file (default: a new one under .agentgrad/)")
    args = parser.parse_args()

    from agentgrad.algorithms.baseline import Baseline
    from agentgrad.policy.local import LocalPolicy
    from agentgrad.engine import Engine
    from agentgrad.store import open_store
    from agentgrad.train.trainer import default_store_path
    from examples.frameworks.tasks import make_tasks

    store = open_store(args.store or default_store_path())
    tasks = make_tasks(args.tasks)
    engine = Engine()
    log = Path(".agentgrad") / f"runner-{args.framework}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log.parent.mkdir(exist_ok=True)
    print(f"{args.framework}: runners from {python_for(args.framework)}; their output in {log}; store {store.path}")
    if args.grpo_steps:
        from agentgrad.algorithms.grpo import GRPO, GRPOConfig
        from agentgrad.policy.config import PolicyConfig

        roles = roles_of(args.framework)  # a team: one LoRA adapter per agent
        config = GRPOConfig(steps=args.grpo_steps, prompts_per_step=2, group_size=4, max_tokens=64, micro_batch_size=4,
                            val_every=0, roles=roles, policy=PolicyConfig(lora_rank=8 if roles else 0), checkpoint_dir=str(Path(".agentgrad") / f"checkpoints-{args.framework}"))
        result = asyncio.run(run(args.framework, GRPO(config, local_engine=engine), store, tasks, tasks[:4], log=log))
        print(f"GRPO: validation {result.initial.success_rate:.2f} -> {result.final.success_rate:.2f}; "
              f"checkpoint {result.checkpoint}")
        return
    with LocalPolicy(store, engine) as policy:
        llm = policy.llm(temperature=args.temperature, max_tokens=64)
        asyncio.run(run(args.framework, Baseline(), store, tasks, llm=llm, gateway=policy.gateway_url + "/v1", log=log))
    print(f"every call: agentgrad rollouts ls --store {store.path}")


if __name__ == "__main__":
    main()
