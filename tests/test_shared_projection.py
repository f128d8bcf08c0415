"""MSSA's CPU training kernel (`aot_transformers.shared_projection`): equal to SDPA in values and gradients, used
only where it applies, and a model trains the same with it as without."""

from __future__ import annotations

import pytest
import torch

from aot_transformers import shared_projection
from aot_transformers.shared_projection import _SharedProjectionAttention, shared_projection_attention_forward


def _padding_mask(lengths, length):
    key_valid = torch.zeros(len(lengths), length, dtype=torch.bool)
    for row, n in enumerate(lengths):
        key_valid[row, length - n :] = True  # left padding
    return key_valid[:, None, None, :] & torch.ones(length, length, dtype=torch.bool).tril()


# Lengths around the causal block of 64 queries: one block, exactly one, a remainder of one, several blocks.
@pytest.mark.parametrize("length", [2, 17, 64, 65, 150])
@pytest.mark.parametrize("causal", [True, False])
def test_shared_projection_kernel_equals_sdpa_values_and_gradients(causal, length):
    states = torch.randn(2, length, 3, 8, dtype=torch.float64).transpose(1, 2).requires_grad_(True)  # a head view
    grad = torch.randn(2, 3, length, 8, dtype=torch.float64)
    reference = torch.nn.functional.scaled_dot_product_attention(states, states, states, is_causal=causal, scale=0.3)
    output = _SharedProjectionAttention.apply(states, 0.3, causal)
    torch.testing.assert_close(output, reference, rtol=1e-12, atol=1e-12)
    (expected,) = torch.autograd.grad(reference, states, grad)
    (got,) = torch.autograd.grad(output, states, grad)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [True, False])
def test_shared_projection_kernel_gradcheck(causal):
    states = torch.randn(1, 1, 66, 2, dtype=torch.float64, requires_grad=True)  # two causal blocks of 64
    assert torch.autograd.gradcheck(lambda s: _SharedProjectionAttention.apply(s, 0.5, causal), (states,))


def _count_shared_kernel_calls(monkeypatch):
    calls = []
    original = _SharedProjectionAttention.apply
    monkeypatch.setattr(_SharedProjectionAttention, "apply", lambda *args: calls.append(args) or original(*args))
    return calls


def test_shared_projection_backend_uses_its_kernel_only_where_it_applies(monkeypatch):
    calls = _count_shared_kernel_calls(monkeypatch)
    states = torch.randn(2, 3, 40, 8, requires_grad=True)
    run = lambda q, k, v, **kw: shared_projection_attention_forward(None, q, k, v, kw.pop("mask", None), 0.3, **kw)[0]

    reference = run(states.detach(), states.detach(), states.detach(), is_causal=True)
    assert calls == []  # inference: nothing to differentiate, SDPA saves less
    torch.testing.assert_close(run(states, states, states, is_causal=True), reference, atol=1e-6, rtol=1e-5)
    assert len(calls) == 1  # MSSA training step
    other = states.detach().clone().requires_grad_(True)
    run(states, other, other, is_causal=True)  # MHSA, or a query normalised apart from the keys
    run(states, states, states, is_causal=True, mask=_padding_mask([40, 30], 40))
    run(states, states, states, is_causal=True, dropout=0.1)
    run(states.double(), states.double(), states.double(), is_causal=True)
    with torch.no_grad():
        run(states, states, states, is_causal=True)
    assert len(calls) == 1
    monkeypatch.setitem(shared_projection.SHARED_KERNEL_MAX_LENGTH, False, 39)
    run(states, states, states, is_causal=False)  # longer than the bidirectional limit
    assert len(calls) == 1
    run(states, states, states, is_causal=True)
    assert len(calls) == 2


@pytest.mark.parametrize("model_class", ["AoTForCausalLM", "AoTForImageClassification"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_models_train_the_same_with_and_without_the_shared_kernel(monkeypatch, model_class, checkpointing):
    import aot_transformers
    from support import tiny_config

    calls = _count_shared_kernel_calls(monkeypatch)
    model = getattr(aot_transformers, model_class)(
        tiny_config(num_hidden_layers=3, max_position_embeddings=80)
    ).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    if model_class == "AoTForCausalLM":
        ids = torch.randint(0, 97, (3, 70))  # two causal blocks
        inputs = dict(input_ids=ids, labels=ids)
    else:
        inputs = dict(pixel_values=torch.randn(3, 3, 16, 16), labels=torch.tensor([0, 1, 4]))

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        loss = model(**inputs).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    model.set_attn_implementation("shared_projection")
    loss, grads = loss_and_grads()
    assert calls, "the MSSA training step did not use the shared-projection kernel"
    kernel_calls = len(calls)
    model.set_attn_implementation("sdpa")
    sdpa_loss, sdpa_grads = loss_and_grads()
    assert len(calls) == kernel_calls  # plain SDPA
    torch.testing.assert_close(loss, sdpa_loss, atol=1e-6, rtol=1e-6)
    for got, expected in zip(grads, sdpa_grads, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
