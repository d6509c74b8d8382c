"""Run by `torchrun --nproc-per-node 2` in a test: the same GRPO script on every rank."""

from __future__ import annotations

import json
import os
import sys

import agentgrad as ag
from agentgrad.algorithms.grpo import GRPO, GRPOConfig
from agentgrad.engine import Engine
from tests import ray_agents

if __name__ == "__main__":
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    engine = Engine(model_dir, sampling_dtype="float32") if rank == 0 else None  # the followers load the weights
    config = GRPOConfig(steps=2, prompts_per_step=2, group_size=2, max_tokens=8, val_every=0, skip_uniform_groups=False,
                        checkpoint_dir=f"{out_dir}/ckpt", learning_rate=1e-3)
    trainer = ag.Trainer(GRPO(config, local_engine=engine, model=model_dir), n_runners=2, store=f"{out_dir}/store-{rank}.db")
    result = trainer.fit(ray_agents.even_length, [{"q": "hi"}, {"q": "hello"}])
    summary = {"rank": rank, "steps": result.steps, "history": result.history, "checkpoint": result.checkpoint,
               "version": engine.version} if rank == 0 else {"rank": rank, "followed": result is None}
    with open(f"{out_dir}/rank-{rank}.json", "w") as out:
        json.dump(summary, out)
