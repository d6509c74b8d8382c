"""The sampling model's linear layers packed once for oneDNN (`agentgrad.engine.prepack`): in bf16 the same
outputs as plain layers, in fp32 the same within rounding; fp32 packed in a twin over the trained parameters,
whose own layers stay plain; and packed again when `publish` brings new weights."""

from __future__ import annotations

import copy
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentgrad.engine import SamplingParams
from agentgrad.engine.prepack import PackedLinear, pack_linears, packed_twin, packing_available
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
            served = engine._sampler(input_ids=ids).logits
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
    held = [weakref.ref(engine), weakref.ref(engine.model), weakref.ref(engine._sampler)]
    engine.close()
    del engine
    assert [ref() for ref in held] == [None, None, None]
