"""Several LoRA adapters on one base, served together (`agentgrad.engine.adapters`): a batch that mixes adapters
gives each row what its adapter gives alone, and an agent no adapter serves goes to the base model and says so."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import agentgrad as ag
from agentgrad import semconv
from agentgrad.engine import Engine, SamplingParams
from agentgrad.engine.adapters import Adapters, forward_arguments, serve_adapters
from agentgrad.engine.prefix_cache import PrefixCache
from agentgrad.semconv import is_llm_call
from tests.tiny_models import tiny_engine_of

ROLES = {"solver": "^solver$", "verifier": "^verifier$"}
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def two_adapters(tiny_smollm2_dir: Path) -> Iterator[Engine]:
    """The tiny SmolLM2-family model in fp32 with two adapters at random, non-zero and different weights."""
    engine = tiny_engine_of(tiny_smollm2_dir)
    torch.manual_seed(0)
    serve_adapters(engine, ROLES, rank=4, alpha=8, init_lora_weights=False)
    yield engine
    engine.close()


def prompts(engine: Engine) -> list[list[int]]:
    questions = ["What is 2+3? Answer with a number.", "Name a colour of the sky."]
    return [engine.chat_prompt_ids([{"role": "user", "content": q}]) for q in questions]


def test_two_adapters_in_one_batch_give_row_for_row_what_each_gives_alone(two_adapters: Engine) -> None:
    engine = two_adapters
    rows = [(p, adapter) for p in prompts(engine) for adapter in ("solver", "verifier", "base")]
    with engine._cv:  # every request waits until all are queued: they are taken into one batch
        futures = [engine.submit(p, GREEDY, adapter=adapter) for p, adapter in rows]
    together = [f.result(timeout=600) for f in futures]
    assert engine.stats["mixed_adapter_steps"] > 0  # decode steps ran rows of several adapters in one forward

    alone = [engine.submit(p, GREEDY, adapter=adapter).result(timeout=600) for p, adapter in rows]
    for (_, adapter), mixed, single in zip(rows, together, alone):
        assert mixed.adapter == single.adapter == adapter
        assert mixed.completions[0].token_ids == single.completions[0].token_ids, adapter
        assert mixed.completions[0].logprobs == pytest.approx(single.completions[0].logprobs, abs=1e-4)
    by_adapter = {adapter: g.completions[0].token_ids for (p, adapter), g in zip(rows, together) if p == rows[0][0]}
    assert len({tuple(ids) for ids in by_adapter.values()}) == 3  # the adapters differ from each other and the base


def test_an_agent_no_adapter_serves_goes_to_the_base_model_and_its_span_says_so(two_adapters: Engine) -> None:
    from agentgrad.policy.local import LocalPolicy

    engine = two_adapters
    question = [{"role": "user", "content": "Name a colour of the sky."}]

    def agent(task: dict[str, str], llm: ag.LLM) -> float:
        import openai

        route = llm.for_agent(task["agent"])
        client = openai.OpenAI(base_url=route.base_url, api_key=route.api_key, max_retries=0, timeout=600)
        client.chat.completions.create(model=route.model, messages=question, max_tokens=12, temperature=0.0)  # type: ignore[arg-type]
        return 1.0

    store = ag.MemoryStore()
    with LocalPolicy(store, engine) as policy:
        ag.Trainer(store=store, resources={"llm": policy.llm()}).fit(agent, [{"agent": "verifier"}, {"agent": "x"}])
    served = {}
    for rollout in asyncio.run(store.query_rollouts()):
        (call,) = [s for s in asyncio.run(store.query_spans(rollout.rollout_id)) if is_llm_call(s)]
        served[rollout.input["agent"]] = (call.attributes[semconv.ADAPTER_NAME], semconv.recorded_choices(call)[0])
    assert served["verifier"][0] == "verifier" and served["x"][0] == semconv.BASE_ADAPTER
    ids = engine.chat_prompt_ids(question)
    for agent_name, adapter in (("verifier", "verifier"), ("x", "base")):
        expected = engine.submit(ids, GREEDY, adapter=adapter).result(timeout=600).completions[0].token_ids
        assert served[agent_name][1].response_token_ids == expected, agent_name


def test_agents_resolve_to_their_adapter_else_the_default_else_the_base() -> None:
    routes = Adapters({"solver": "^solver", "verifier": "verif"})
    assert [routes.resolve(a) for a in ("solver", "solver-2", "a-verifier", "critic", None)] == [
        "solver",
        "solver",
        "verifier",
        "base",
        "base",
    ]
    assert Adapters(ROLES, default="solver").resolve("critic") == "solver"
    assert forward_arguments(routes, ["solver", "base", None]) == {"adapter_names": ["solver", "__base__", "__base__"]}
    assert forward_arguments(None, ["solver"]) == {}
    with pytest.raises(ValueError, match="'base' names the base model"):
        Adapters({"base": "x"})
    with pytest.raises(ValueError, match="not a regex"):
        Adapters({"solver": "("})
    with pytest.raises(ValueError, match="default adapter 'critic' is not one of"):
        Adapters(ROLES, default="critic")
    with pytest.raises(ValueError, match="adapter 'solvr' is not served here"):
        routes.check("solvr")


def test_a_prefix_one_adapter_computed_never_serves_another() -> None:
    cache = PrefixCache(1 << 20)
    kv = [(torch.ones(1, 1, 10, 2), torch.ones(1, 1, 10, 2))]
    cache.put(0, tuple(range(10)), kv, "solver")
    prompt = tuple(range(12))
    assert cache.longest(0, prompt, "solver")[0] == 10
    assert cache.longest(0, prompt, "verifier") == (0, [])
    assert cache.longest(0, prompt) == (0, [])  # nor the base model
