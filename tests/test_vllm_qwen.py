"""Qwen2.5-Coder-0.5B-Instruct on a real vLLM server from .venv-vllm: its own `<tool_call>` format read by vLLM's
`hermes` parser (the one `tool_flags` chooses from its chat template), with exact token ids, on every API the gateway
serves, and one LoRA GRPO step of the function-calling calculator agent (`make qwen` fetches the model).

One server for the module (`--enable-lora`, start-up ~150 s on a loaded 2-core CPU); `AGENTGRAD_TEST_VLLM_QWEN_URL`
reuses a running one (started with `--enable-lora --max-lora-rank 8`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import agentgrad as ag
from agentgrad import semconv as sc
from agentgrad.algorithms.grpo import GRPO
from agentgrad.engine.model import QWEN_MODEL, resolve_model
from agentgrad.gateway import Backend, Gateway
from agentgrad.policy.vllm_server import VLLMServer, attach_servers, start_servers, tool_parser_of
from agentgrad.serving import ServerThread
from agentgrad.store import MemoryStore
from agentgrad.tool_calls import call_signature, functions, parse_reply
from agentgrad.types import RolloutStatus, Span
from examples.calc_agent import CALCULATE_TOOL, calc_agent, make_splits

pytestmark = [pytest.mark.vllm, pytest.mark.qwen]

SERVER_URL_ENV = "AGENTGRAD_TEST_VLLM_QWEN_URL"
RANK = 8
OPEN_ID = 151657
"""Qwen's `<tool_call>` special token: what the model writes unforced; vLLM's forced calls spell the tag in text."""
ASK = [{"role": "user", "content": "What is 123 + 456? Use the calculate tool."}]


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """The module's one server, with LoRA (the GRPO step's adapter) and a small KV cache (1 GiB)."""
    if os.environ.get(SERVER_URL_ENV):
        (running,) = attach_servers([os.environ[SERVER_URL_ENV]])
        yield running
        return
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: a few short calls at a time
        (server,) = start_servers(
            resolve_model(QWEN_MODEL), QWEN_MODEL, lora_rank=RANK, log_dir=tmp_path_factory.mktemp("vllm")
        )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(QWEN_MODEL))


@pytest.fixture
def front(qwen_server: VLLMServer) -> Iterator[tuple[str, MemoryStore, Gateway]]:
    """A gateway in front of the server, as `VLLMPolicy` builds it: system vllm, the parser the server runs."""
    parser = tool_parser_of(resolve_model(QWEN_MODEL))
    store = MemoryStore()
    gateway = Gateway(store, {QWEN_MODEL: Backend(qwen_server.url + "/v1", system="vllm", tool_parser=parser)})
    with ServerThread(gateway) as server:
        yield server.url, store, gateway


async def only_call(store: MemoryStore, gateway: Gateway) -> Span:
    await gateway.flush()
    (span,) = [s for s in await store.query_spans(None) if sc.is_llm_call(s)]
    return span


def test_qwen_is_served_by_vllm_with_the_hermes_parser() -> None:
    assert tool_parser_of(resolve_model(QWEN_MODEL)) == "hermes"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "calculate"}}], ids=["required", "named"]
)
async def test_a_forced_call_on_vllm_is_parsed_by_hermes_with_token_ids_that_decode_to_it(
    front: tuple[str, MemoryStore, Gateway], tokenizer: Any, choice: Any, stream: bool
) -> None:
    url, store, gateway = front
    body = {
        "model": QWEN_MODEL,
        "messages": ASK,
        "tools": [CALCULATE_TOOL],
        "tool_choice": choice,
        "temperature": 0,
        "max_tokens": 60,
        "stream": stream,
    }
    reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    span = await only_call(store, gateway)
    (message,) = json.loads(span.attributes[sc.GEN_AI_OUTPUT_MESSAGES])
    assert call_signature(message["tool_calls"]) == [("calculate", {"expression": "123 + 456"})]
    assert span.attributes[sc.TOOL_CALLS_PARSER] == "vllm:hermes"
    assert sc.TOOL_CALLS_PARSER_DISAGREES not in span.attributes
    # the recorded ids are what the model wrote: decoded, agentgrad's parser reads the same call out of them
    ids = span.attributes[sc.RESPONSE_TOKEN_IDS]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    assert call_signature(parse_reply(text, functions([CALCULATE_TOOL])).tool_calls) == call_signature(
        message["tool_calls"]
    ), text
    # ...and the prompt ids are Qwen's own template over the tools
    template = tokenizer.apply_chat_template(ASK, tools=[CALCULATE_TOOL], add_generation_prompt=True, tokenize=False)
    assert span.attributes[sc.PROMPT_TOKEN_IDS] == tokenizer.encode(template, add_special_tokens=False)
    assert len(span.attributes[sc.RESPONSE_LOGPROBS]) == len(ids)
    print(f"forced ({choice}, stream={stream}): {OPEN_ID in ids=}; {ids[:5]}")


async def test_a_responses_call_on_vllm_records_its_raw_turn_and_our_parser_agrees(
    front: tuple[str, MemoryStore, Gateway], tokenizer: Any
) -> None:
    """The gateway asks vLLM for its raw turn (`enable_response_messages`): the token ids of the prompt and reply,
    and the text the model wrote, which agentgrad's parser reads a second time; the agent gets the answer it asked
    for, without them."""
    url, store, gateway = front
    tool = {"type": "function", **CALCULATE_TOOL["function"]}
    body = {
        "model": QWEN_MODEL,
        "input": ASK[0]["content"],
        "tools": [tool],
        "tool_choice": "required",
        "temperature": 0,
        "max_output_tokens": 60,
    }
    reply = httpx.post(url + "/v1/responses", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    assert "output_messages" not in reply.json() and "input_messages" not in reply.json()
    (item,) = [i for i in reply.json()["output"] if i["type"] == "function_call"]
    assert item["name"] == "calculate"
    span = await only_call(store, gateway)
    assert span.attributes[sc.TOOL_CALLS_PARSER] == "vllm:hermes"
    assert sc.TOOL_CALLS_PARSER_DISAGREES not in span.attributes
    text = tokenizer.decode(span.attributes[sc.RESPONSE_TOKEN_IDS], skip_special_tokens=True)
    assert call_signature(parse_reply(text, functions([CALCULATE_TOOL])).tool_calls) == [
        ("calculate", json.loads(item["arguments"]))
    ]
    template = tokenizer.apply_chat_template(ASK, tools=[CALCULATE_TOOL], add_generation_prompt=True, tokenize=False)
    assert span.attributes[sc.PROMPT_TOKEN_IDS] == tokenizer.encode(template, add_special_tokens=False)


async def test_an_unforced_qwen_reply_on_messages_that_is_a_call_in_another_shape_stays_text_on_both_sides(
    front: tuple[str, MemoryStore, Gateway],
) -> None:
    """Unforced, Qwen-0.5B writes its call as bare JSON: vLLM's hermes parser leaves it text, so does ours (with
    why), and the span flags nothing."""
    url, store, gateway = front
    tool = {
        "name": "calculate",
        "description": CALCULATE_TOOL["function"]["description"],
        "input_schema": CALCULATE_TOOL["function"]["parameters"],
    }
    body = {"model": QWEN_MODEL, "messages": ASK, "tools": [tool], "temperature": 0, "max_tokens": 60}
    reply = httpx.post(url + "/v1/messages", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    blocks = reply.json()["content"]
    span = await only_call(store, gateway)
    (message,) = json.loads(span.attributes[sc.GEN_AI_OUTPUT_MESSAGES])
    ours = parse_reply(message["content"] or "", functions([CALCULATE_TOOL]))
    assert [b["type"] for b in blocks] == ["text"] and not ours.tool_calls, blocks
    assert not {k for k in span.attributes if k.startswith("agentgrad.tool_calls.")}


def test_one_lora_grpo_step_of_the_function_calling_agent_on_qwen_on_vllm_fails_no_rollout(
    tmp_path: Path, qwen_server: VLLMServer
) -> None:
    """2 tasks x 2 rollouts, the first call forced (unforced, Qwen-0.5B writes its calls as bare JSON text): every
    rollout succeeds, every first call is a `<tool_call>` vLLM's hermes parser read, with its token ids.

    A forced call's logprobs from vLLM are those of the grammar-masked distribution, which spells `<tool_call>` in
    text tokens the free model finds unlikely (3-13 nats each): `train/logprob_diff` is ~1.3 here, not the ~0.002 of
    unforced replies, so this pins the plumbing, not a learning signal."""
    train, _ = make_splits(n_train=20, n_val=2, seed=5, demo="function")
    train = [{**t, "first_call": "required"} for t in train]
    config = dict(
        prompts_per_step=2,
        group_size=2,
        max_tokens=48,
        val_every=0,
        learning_rate=1e-5,
        engine="vllm",
        vllm_urls=[qwen_server.url],
        lora_rank=RANK,
        micro_batch_size=1,
        gradient_checkpointing=True,
        skip_uniform_groups=False,
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )
    store = MemoryStore()
    result = ag.Trainer(GRPO(steps=1, model=QWEN_MODEL, **config), n_runners=1, runner_concurrency=4, store=store).fit(
        calc_agent, train, []  # no held-out tasks: no validation
    )
    (step,) = result.history
    print(step)
    # the forced call and the calculator make every reward 1: the groups still go through the update (zero advantage)
    # and the new adapter through a sync into the server
    assert step["step"] == 1 and step["train/groups_used"] == 2 and step["perf/sync_seconds"] > 0
    rollouts = asyncio.run(store.query_rollouts(mode="train"))
    assert len(rollouts) == 2 * 2
    assert [r.status for r in rollouts if r.status != RolloutStatus.SUCCEEDED] == []
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(QWEN_MODEL))
    for rollout in rollouts:
        calls = [s for s in asyncio.run(store.query_spans(rollout.rollout_id)) if sc.is_llm_call(s)]
        first = min(calls, key=lambda s: s.sequence_id)
        assert first.attributes[sc.TOOL_CALLS_PARSER] == "vllm:hermes"
        assert not [s for s in calls if sc.TOOL_CALLS_PARSER_DISAGREES in s.attributes]
        (message,) = json.loads(first.attributes[sc.GEN_AI_OUTPUT_MESSAGES])
        text = tokenizer.decode(first.attributes[sc.RESPONSE_TOKEN_IDS], skip_special_tokens=True)
        assert call_signature(parse_reply(text, functions([CALCULATE_TOOL])).tool_calls) == call_signature(
            message["tool_calls"]
        )
    assert (tmp_path / "checkpoints" / "step-1" / "adapter_model.safetensors").is_file()
