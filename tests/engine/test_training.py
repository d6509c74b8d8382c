"""Sequence logprobs with a shared prefix give the same values and gradients as full forwards."""

from __future__ import annotations

import pytest
import torch

from agentgrad.engine import training
from agentgrad.engine.training import (
    ScoredSequence,
    StepPrefix,
    checkpoint_activations,
    frozen_context_logprobs,
    sequence_logprobs,
)
from tests.tiny_models import tiny_network


def tiny_model() -> torch.nn.Module:
    return tiny_network(vocab_size=50, initializer_range=0.02)


def full_forward(model: torch.nn.Module, sequence: ScoredSequence, temperature: float) -> torch.Tensor:
    logits = model(torch.tensor([sequence.token_ids])).logits[0].float() / temperature
    logprobs = torch.log_softmax(logits, -1)
    targets = sequence.token_ids[sequence.first_scored :]
    return torch.stack([logprobs[sequence.first_scored - 1 + i, t] for i, t in enumerate(targets)])


@pytest.mark.parametrize("logit_chunk", [256, 2])  # 2: the scored positions' logits a chunk at a time
@pytest.mark.parametrize("prefix_length", [0, 12])
def test_shared_prefix_gives_the_values_and_gradients_of_full_forwards(
    prefix_length: int, logit_chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(training, "LOGIT_CHUNK", logit_chunk)
    prefix = list(range(3, 3 + prefix_length))
    sequences = [
        ScoredSequence(prefix + [20, 21, 22, 30, 31], prefix_length + 3),
        ScoredSequence(prefix + [23, 30, 32, 33, 34, 35, 36], prefix_length + 2),
        ScoredSequence(prefix + [24, 25, 40], prefix_length + 2),
    ]
    model = tiny_model()
    fast = sequence_logprobs(model, sequences, temperature=0.7)
    torch.stack([x.sum() for x in fast]).sum().backward()
    fast_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    slow = [full_forward(model, s, 0.7) for s in sequences]
    torch.stack([x.sum() for x in slow]).sum().backward()
    for a, b in zip(fast, slow):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
    for a, p in zip(fast_grads, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-5)  # type: ignore[arg-type]


def test_a_scored_span_outside_the_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match="first_scored"):
        ScoredSequence([1, 2, 3], 3)


def test_a_prefix_run_once_for_all_micro_batches_gives_the_gradients_of_running_it_in_each() -> None:
    prefix = list(range(3, 15))
    micro_batches = [
        [ScoredSequence(prefix + [20, 21, 22, 30], 14), ScoredSequence(prefix + [20, 23, 31], 14)],
        [ScoredSequence(prefix + [24, 25, 40, 41, 42], 13)],
        [ScoredSequence([5, 6, 7, 8, 9, 10, 11, 12, 13, 44], 9)],  # does not start with it: runs its own
    ]
    model = tiny_model()

    def run(step_prefix: StepPrefix | None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        model.zero_grad()
        values = []
        for micro in micro_batches:
            logprobs = sequence_logprobs(model, micro, 0.7, prefix=step_prefix)
            torch.stack([x.sum() for x in logprobs]).sum().backward()
            values += [x.detach() for x in logprobs]
        if step_prefix is not None:
            step_prefix.backward()
        return values, [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]

    once = StepPrefix(model, [s for micro in micro_batches[:2] for s in micro])
    assert once.token_ids == prefix
    values, grads = run(once)
    expected_values, expected_grads = run(None)
    for a, b in zip(values, expected_values):
        assert torch.allclose(a, b, atol=1e-5)
    for a, b in zip(grads, expected_grads):
        assert torch.allclose(a, b, atol=1e-5)
    assert any(g.abs().sum() > 0 for g in grads)


def test_with_gradient_checkpointing_the_prefix_runs_in_each_sequence_and_gives_the_same_values_and_gradients() -> None:
    # a checkpointed layer drops the cache in training: a prefix run apart would silently go missing
    prefix = list(range(3, 15))
    sequences = [ScoredSequence(prefix + [20, 21, 22, 30], 14), ScoredSequence(prefix + [20, 23, 31], 14)]

    def run(checkpointing: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        model = tiny_model()
        if checkpointing:
            checkpoint_activations(model)
        model.train()
        step_prefix = StepPrefix(model, sequences)
        assert (step_prefix.token_ids == []) == checkpointing
        logprobs = sequence_logprobs(model, sequences, 0.7, prefix=step_prefix)
        torch.stack([x.sum() for x in logprobs]).sum().backward()
        step_prefix.backward()
        return [x.detach() for x in logprobs], [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]

    values, grads = run(checkpointing=True)
    expected_values, expected_grads = run(checkpointing=False)
    for a, b in zip(values, expected_values):
        assert torch.allclose(a, b, atol=1e-5)
    for a, b in zip(grads, expected_grads):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_frozen_context_gives_the_same_values_and_no_gradient_through_the_context(checkpointing: bool) -> None:
    context = list(range(3, 15))  # tokens no scored position reads except through the context's keys and values
    sequences = [ScoredSequence(context + [20, 21, 22, 30], 13), ScoredSequence(context[:10] + [23, 31, 32], 11)]
    model = tiny_model()
    if checkpointing:
        checkpoint_activations(model)
    model.train()
    logprobs = frozen_context_logprobs(model, sequences, 0.7)
    torch.stack([x.sum() for x in logprobs]).sum().backward()
    embeddings = model.get_input_embeddings().weight
    assert embeddings.grad is not None
    assert embeddings.grad[3:15].abs().sum() == 0  # tokens of the contexts only: frozen
    assert embeddings.grad[[20, 21, 22, 23, 31]].abs().sum() > 0
    with torch.no_grad():
        for a, s in zip(logprobs, sequences):
            assert torch.allclose(a, full_forward(model, s, 0.7), atol=1e-5)
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules()) == checkpointing  # restored
    model.zero_grad()
    torch.stack([x.sum() for x in sequence_logprobs(model, sequences, 0.7)]).sum().backward()
    assert embeddings.grad[3:15].abs().sum() > 0  # the full step sends it there
