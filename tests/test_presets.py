"""The papers' named models have the papers' parameter counts (built on the meta device: no memory), and each preset
cites the line of the paper that prints its count."""

from __future__ import annotations

import re

import pytest
import torch

from aot_transformers import AoTConfig, AoTForCausalLM, AoTForImageClassification
from aot_transformers.presets import PAPER_PARAMETERS, PRESETS
from support import REPO_ROOT

PAPERS = REPO_ROOT.parent / "shared" / "papers"


def _count(name: str) -> int:
    config = AoTConfig.from_preset(name)
    with torch.device("meta"):
        if "image_size" in PRESETS[name]:
            return sum(p.numel() for p in AoTForImageClassification(config).parameters())
        model = AoTForCausalLM(config)
    # nanoGPT's count: unique parameters (tied head counted once), without the position table.
    params = {id(p): p for p in model.parameters()}
    return sum(p.numel() for p in params.values()) - model.model.embed_positions.weight.numel()


@pytest.mark.parametrize("name", sorted(PAPER_PARAMETERS))
def test_parameter_count_matches_paper(name):
    expected, tolerance, _ = PAPER_PARAMETERS[name]
    count = _count(name)
    assert abs(count - expected) / expected <= tolerance, f"{name}: {count / 1e6:.2f}M vs {expected / 1e6:.0f}M"


@pytest.mark.skipif(not PAPERS.is_dir(), reason="../shared/papers is not present")
@pytest.mark.parametrize("name", sorted(PAPER_PARAMETERS))
def test_each_preset_cites_the_paper_line_that_prints_its_count(name):
    expected, _, source = PAPER_PARAMETERS[name]
    file, line = re.match(r"([\w.-]+\.txt):(\d+) ", source).groups()
    printed = (PAPERS / file).read_text().splitlines()[int(line) - 1]
    assert re.search(rf"\b{expected // 1_000_000}M\b", printed), f"{name}: {source} reads {printed!r}"


def test_vision_presets_follow_one_paper_each():
    # The earlier version trains AoT-Base / Large / Huge without LayerNorm (Sec. 4.2); the ICML models keep it.
    for name in ("aot-v-base", "aot-v-large", "aot-v-huge"):
        assert AoTConfig.from_preset(name).layer_norm is False and "earlier-version" in PAPER_PARAMETERS[name][2]
    for name, attention in (("aot-mssa-v", "mssa"), ("aot-mhsa-v", "mhsa")):
        config = AoTConfig.from_preset(name)
        assert config.layer_norm and config.attention_type == attention and "icml2025" in PAPER_PARAMETERS[name][2]


def test_mssa_has_half_the_attention_weights_of_mhsa():
    mssa = AoTConfig.from_preset("aot-mssa-l-base")
    mhsa = AoTConfig.from_preset("aot-mssa-l-base", attention_type="mhsa")
    with torch.device("meta"):
        layer_mssa = AoTForCausalLM(mssa).model.layers[0]
        layer_mhsa = AoTForCausalLM(mhsa).model.layers[0]
    weights = lambda layer: sum(p.numel() for n, p in layer.named_parameters() if n.endswith("proj.weight"))
    assert weights(layer_mssa) == 2 * 1024**2
    assert weights(layer_mhsa) == 4 * 1024**2
