"""torch.compile works on every model class, with `fullgraph=True` (no graph break: the models declare
`_can_compile_fullgraph`, k-NN included), and gives the eager numbers."""

from __future__ import annotations

import pytest
import torch

from aot_transformers import AoTForCausalLM, AoTForImageClassification, AoTModel, AoTVisionModel
from support import tiny_config

CASES = {
    "AoTModel": (AoTModel, {}, lambda: dict(input_ids=torch.randint(0, 97, (2, 12)))),
    "AoTForCausalLM": (AoTForCausalLM, {}, lambda: dict(input_ids=(ids := torch.randint(0, 97, (2, 12))), labels=ids)),
    "AoTForCausalLM-knn": (
        AoTForCausalLM,
        dict(knn_k=3),
        lambda: dict(input_ids=(ids := torch.randint(0, 97, (2, 12))), labels=ids),
    ),
    "AoTVisionModel": (AoTVisionModel, {}, lambda: dict(pixel_values=torch.randn(2, 3, 16, 16))),
    "AoTForImageClassification": (
        AoTForImageClassification,
        {},
        lambda: dict(pixel_values=torch.randn(2, 3, 16, 16), labels=torch.tensor([0, 4])),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_equals_eager(case):
    cls, overrides, make_inputs = CASES[case]
    torch._dynamo.reset()
    model = cls(tiny_config(**overrides)).train()
    inputs = make_inputs()
    eager = model(**inputs)
    key = "loss" if getattr(eager, "loss", None) is not None else "last_hidden_state"
    if key == "loss":
        eager.loss.backward()
        eager_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
    compiled = torch.compile(model, fullgraph=True)(**inputs)
    torch.testing.assert_close(compiled[key], eager[key], atol=1e-5, rtol=1e-4)
    if key == "loss":  # the backward compiles too (MSSA's attention kernel included)
        compiled.loss.backward()
        for param, expected in zip(model.parameters(), eager_grads, strict=True):
            torch.testing.assert_close(param.grad, expected, atol=1e-5, rtol=1e-4)
