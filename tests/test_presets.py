"""The paper's named models have the paper's parameter counts (built on the meta device: no memory)."""

from __future__ import annotations

import pytest
import torch

from aot_transformers import AoTConfig, AoTForCausalLM, AoTForImageClassification
from aot_transformers.presets import PAPER_PARAMETERS


def _count(name: str) -> int:
    config = AoTConfig.from_preset(name)
    with torch.device("meta"):
        if name.startswith("aot-v"):
            return sum(p.numel() for p in AoTForImageClassification(config).parameters())
        model = AoTForCausalLM(config)
    # nanoGPT's count: unique parameters (tied head counted once), without the position table.
    params = {id(p): p for p in model.parameters()}
    return sum(p.numel() for p in params.values()) - model.model.embed_positions.weight.numel()


@pytest.mark.parametrize("name", sorted(PAPER_PARAMETERS))
def test_parameter_count_matches_paper(name):
    expected, tolerance = PAPER_PARAMETERS[name]
    count = _count(name)
    assert abs(count - expected) / expected <= tolerance, f"{name}: {count / 1e6:.2f}M vs {expected / 1e6:.0f}M"


def test_mssa_has_half_the_attention_weights_of_mhsa():
    mssa = AoTConfig.from_preset("aot-mssa-l-base")
    mhsa = AoTConfig.from_preset("aot-mssa-l-base", attention_type="mhsa")
    with torch.device("meta"):
        layer_mssa = AoTForCausalLM(mssa).model.layers[0]
        layer_mhsa = AoTForCausalLM(mhsa).model.layers[0]
    weights = lambda layer: sum(p.numel() for n, p in layer.named_parameters() if n.endswith("proj.weight"))
    assert weights(layer_mssa) == 2 * 1024**2
    assert weights(layer_mhsa) == 4 * 1024**2
