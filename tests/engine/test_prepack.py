"""The sampling model's linear layers packed once for oneDNN (`agentgrad.engine.prepack`): in bf16 the same
outputs as plain layers, in fp32 the same within rounding; fp32 packed in a twin over the trained parameters,
whose own layers stay plain; and packed again when `publish` brings new weights. A LoRA model's twin has its one
adapter merged into the packed copies, and the engine samples from it (and made again at each `publish`)."""

from __future__ import annotations

import copy
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentgrad.engine import SamplingParams
from agentgrad.engine.prepack import PackedLinear, merges, pack_linears, packed_twin, packing_available
from tests.tiny_models import tiny_engine_of, tiny_network


def _tiny_model() -> torch.nn.Module:
    return tiny_network().to(torch.bfloat16)


def test_packed_layers_compute_what_plain_layers_compute() -> None:
    plain = _tiny_model()
    packed = copy.deepcopy(plain)
    # q, k, v, o, gate, up, down per layer, and the output layer; none where oneDNN has no bf16 (AVX2 alone)
    assert pack_linears(packed) == (2 * 7 + 1 if packing_available() else 0)
    ids = torch.randint(0, 300, (5, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.inference_mode():
        expected = plain(input_ids=ids, attention_mask=mask).logits
        found = packed(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(found, expected)


def test_fp32_layers_pack_too_and_compute_what_plain_layers_compute_within_rounding() -> None:
    plain = _tiny_model().float()
    packed = copy.deepcopy(plain)
    assert pack_linears(packed) == (2 * 7 + 1 if packing_available(torch.float32) else 0)
    assert pack_linears(_tiny_model().half()) == 0
    ids = torch.randint(0, 300, (5, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = plain(input_ids=ids).logits
        found = packed(input_ids=ids).logits
    # oneDNN's packed sums and MKL's plain ones round apart in the last bits
    torch.testing.assert_close(found, expected, rtol=1e-5, atol=1e-5)


def test_a_packed_twin_shares_the_parameters_and_follows_them_when_made_again() -> None:
    model = _tiny_model().float()
    twin = packed_twin(model)
    assert all(a is b for a, b in zip(twin.parameters(), model.parameters(), strict=True))
    assert not any(isinstance(module, PackedLinear) for module in model.modules())  # training's layers stay plain
    assert sum(isinstance(module, PackedLinear) for module in twin.modules()) == (
        2 * 7 + 1 if packing_available(torch.float32) else 0
    )
    ids = torch.randint(0, 300, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.up_proj.weight.mul_(-2.0)
        with torch.inference_mode():
            again = packed_twin(model)(input_ids=ids).logits
            reference = copy.deepcopy(model)
            pack_linears(reference)
            assert torch.equal(again, reference(input_ids=ids).logits)
            torch.testing.assert_close(again, model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def _adapted(model: torch.nn.Module, names: tuple[str, ...] = ("default",)) -> torch.nn.Module:
    """`model` with random (non-zero) LoRA adapters of rank 2 on every projection, one per name, the first active."""
    from peft import LoraConfig, get_peft_model

    def config() -> LoraConfig:
        return LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False)

    torch.manual_seed(3)
    adapted = get_peft_model(model, config(), adapter_name=names[0])
    for name in names[1:]:
        adapted.add_adapter(name, config())
    return adapted.eval()


def test_a_lora_models_twin_merges_its_adapter_into_packed_layers_and_computes_what_peft_computes() -> None:
    model = _adapted(tiny_network())
    assert merges(model)
    twin = packed_twin(model)
    assert not any(hasattr(module, "lora_A") for module in twin.modules())  # plain layers: the decoder serves them
    base = {id(p) for name, p in model.named_parameters() if "lora_" not in name}
    assert {id(p) for p in twin.parameters()} == base  # the base's very tensors, no adapter weight
    ids = torch.randint(0, 300, (3, 8), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        unmerged = model.get_base_model()
        with model.disable_adapter():
            plain = unmerged(input_ids=ids).logits
        expected = model(input_ids=ids).logits
        found = twin(input_ids=ids).logits
    assert not torch.allclose(expected, plain, atol=1e-3)  # the adapters count
    # merged, each product rounds apart from peft's two in the last bits (logits of this network are ~10)
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.mul_(-3.0)  # a training step, in place
    with torch.inference_mode():
        stale = twin(input_ids=ids).logits
        again = packed_twin(model)(input_ids=ids).logits
        expected = model(input_ids=ids).logits
    assert torch.equal(stale, found)  # packed copies do not follow the adapters: `publish` makes a new twin
    torch.testing.assert_close(again, expected, rtol=1e-4, atol=1e-4)


def test_adapters_chosen_per_request_are_not_merged() -> None:
    model = _adapted(tiny_network(), ("solver", "verifier"))
    assert not merges(model) and not merges(tiny_network())
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj does not hold one plain LoRA adapter"):
        packed_twin(model)


def test_an_engine_samples_lora_from_the_merged_twin_and_publish_merges_the_trained_adapter(
    tiny_smollm2_dir: Path,
) -> None:
    engine = tiny_engine_of(tiny_smollm2_dir)
    try:
        engine.replace_model(_adapted(engine.model), merge=True)
        assert engine._weights.decoder is not None  # the written-out decode step serves the merged twin
        prompt = engine.chat_prompt_ids([{"role": "user", "content": "What is 2+3?"}])
        greedy = SamplingParams(max_tokens=6, temperature=0.0)

        def served_against_peft() -> list[int]:
            (generation,) = engine.generate([prompt], greedy)
            completion = generation.completions[0]
            tokens = torch.tensor([prompt + completion.token_ids])
            with torch.inference_mode():
                logits = engine.model(input_ids=tokens).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
            expected = logits.gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(completion.logprobs), expected, rtol=1e-4, atol=1e-4)
            assert logits.argmax(-1).tolist() == completion.token_ids  # peft's own greedy choice at every step
            return completion.token_ids

        before = served_against_peft()
        with engine.training() as model, torch.no_grad():
            for name, weight in model.named_parameters():
                if "lora_B" in name:
                    weight.mul_(-8.0)
        engine.publish()
        assert served_against_peft() != before  # the new adapter is what is served
    finally:
        engine.close()


def test_publish_packs_the_new_weights_again(tiny_smollm2_dir: Path) -> None:
    engine = tiny_engine_of(tiny_smollm2_dir, sampling_dtype="bfloat16")
    try:
        ids = torch.tensor([engine.chat_prompt_ids([{"role": "user", "content": "What is 2+3?"}])])
        with torch.no_grad():
            for layer in engine.model.model.layers:
                layer.mlp.down_proj.weight.mul_(-1.5)
        engine.publish()
        reference = copy.deepcopy(engine.model).to(torch.bfloat16).eval()
        with torch.inference_mode():
            expected = reference(input_ids=ids).logits
            served = engine._weights.sampler(input_ids=ids).logits
        assert torch.equal(served, expected)
    finally:
        engine.close()


@pytest.fixture
def without_cyclic_gc() -> Iterator[None]:
    """Only reference counts free objects: what a reference cycle would keep alive stays alive."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_dropped_twin_frees_its_packed_layers_at_once(without_cyclic_gc: None) -> None:
    twin = packed_twin(_tiny_model().float())
    layers = [weakref.ref(module) for module in twin.modules() if isinstance(module, torch.nn.Linear)]
    del twin
    assert [layer() for layer in layers] == [None] * len(layers)


def test_a_closed_engine_frees_its_weights_at_once(tiny_smollm2_dir: Path, without_cyclic_gc: None) -> None:
    """A suite, or a sweep, makes engine after engine: a cycle through one would hold its weights (and fp32's packed
    twin) until a full collection, gigabytes piling up in the meantime."""
    engine = tiny_engine_of(tiny_smollm2_dir, sampling_dtype=None)  # this CPU's default
    engine.generate([engine.chat_prompt_ids([{"role": "user", "content": "Hi"}])], SamplingParams(max_tokens=4))
    engine.publish()
    held = [weakref.ref(engine), weakref.ref(engine.model), weakref.ref(engine._weights.sampler)]
    engine.close()
    del engine
    assert [ref() for ref in held] == [None, None, None]
