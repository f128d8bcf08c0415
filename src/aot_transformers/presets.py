"""Named configurations of the papers' models, reached through `AoTConfig.from_preset(name, **overrides)`.

Each preset follows one paper, cited with file and line in `PAPER_PARAMETERS` with the parameter count it reproduces
(nanoGPT's convention for language models: everything but the position table), which `tests/test_presets.py` checks
on the meta device. Shapes no paper prints (the Large LM's, every vision width, the ICML vision depths) are inferred
from the counts.
"""

from __future__ import annotations

from typing import Any

GPT2_VOCAB_SIZE = 50257

_LANGUAGE = {
    "vocab_size": GPT2_VOCAB_SIZE,
    "max_position_embeddings": 1024,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
}
_CAUSAL_MSSA = {**_LANGUAGE, "attention_type": "mssa", "normalize_query": True}
_VISION = {"image_size": 224, "patch_size": 16, "num_channels": 3, "num_labels": 1000, "attention_type": "mssa"}
_VISION_NO_NORM = {**_VISION, "layer_norm": False}  # earlier version, Sec. 4.2: "we do *not* even use LayerNorm"


def _shape(base: dict[str, Any], layers: int, width: int, heads: int, **fields: Any) -> dict[str, Any]:
    return {**base, **fields, "num_hidden_layers": layers, "hidden_size": width, "num_attention_heads": heads}


_TINY_LM = {"vocab_size": 1024, "max_position_embeddings": 256, "bos_token_id": None, "eos_token_id": None}

PRESETS: dict[str, dict[str, Any]] = {
    "aot-mssa-l-base": _shape(_CAUSAL_MSSA, 24, 1024, 16),
    "aot-mssa-l-medium": _shape(_CAUSAL_MSSA, 36, 1280, 20),
    "aot-mssa-l-large": _shape(_CAUSAL_MSSA, 48, 1600, 25),
    "aot-mhsa-l-base": _shape(_LANGUAGE, 24, 896, 14, attention_type="mhsa"),
    # Earlier version, Table 1: the ablations print only their counts; GPT-2 Base's 12 x 768 with MSSA and a 4x MLP
    # in blocks 1-6 (Hybrid) or in all (Full MLP) reproduces both. GPT-2 Base itself: MHSA + MLP in every block.
    "aot-mssa-l-hybrid": _shape(_CAUSAL_MSSA, 12, 768, 12, mlp_layers="first_half"),
    "aot-mssa-l-full": _shape(_CAUSAL_MSSA, 12, 768, 12, mlp_layers="all"),
    "gpt2-base": _shape(_LANGUAGE, 12, 768, 12, attention_type="mhsa", mlp_layers="all"),
    # Earlier version, Table 2: the depths 12 / 24 / 32 are printed, the widths inferred.
    "aot-v-base": _shape(_VISION_NO_NORM, 12, 768, 12),
    "aot-v-large": _shape(_VISION_NO_NORM, 24, 1024, 16),
    "aot-v-huge": _shape(_VISION_NO_NORM, 32, 1152, 16),
    # ICML 2025, Tables 1-2: only the parameter counts are printed; depth and width inferred (ViT-B / ViT-S widths).
    "aot-mssa-v": _shape(_VISION, 17, 768, 12),
    "aot-mhsa-v": _shape(_VISION, 24, 384, 6, attention_type="mhsa"),
    # Tiny models for tests, demos and CPU experiments (layers, width, heads).
    "aot-mssa-l-tiny": _shape(_CAUSAL_MSSA, 4, 64, 4, **_TINY_LM),
    "aot-mhsa-l-tiny": _shape(_LANGUAGE, 4, 64, 4, attention_type="mhsa", **_TINY_LM),
    "aot-v-tiny": _shape(_VISION, 4, 64, 4, image_size=32, patch_size=4, num_labels=10),
}

# What each preset reproduces: (paper parameter count, relative tolerance, where the paper prints it), for the tests
# and the docs; the files are those of ../shared/papers (line numbers of the plain-text copies).
_ICML, _EARLIER = "aot-icml2025.txt", "aot-earlier-version.txt"
PAPER_PARAMETERS: dict[str, tuple[int, float, str]] = {
    "aot-mssa-l-base": (102_000_000, 0.015, f"{_ICML}:231 (Table 3; shape: Table 4, line 569)"),
    "aot-mssa-l-medium": (182_000_000, 0.015, f"{_ICML}:232 (Table 3; shape: Table 4, line 570)"),
    "aot-mssa-l-large": (326_000_000, 0.015, f"{_EARLIER}:337 (Table 1; shape inferred)"),
    "aot-mhsa-l-base": (122_000_000, 0.015, f"{_ICML}:233 (Table 3; shape: Table 4, line 571)"),
    "aot-mssa-l-hybrid": (81_000_000, 0.015, f"{_EARLIER}:338 (Table 1; shape inferred)"),
    "aot-mssa-l-full": (109_000_000, 0.015, f"{_EARLIER}:339 (Table 1; shape inferred)"),
    "gpt2-base": (124_000_000, 0.015, f"{_EARLIER}:340 (Table 1; GPT-2's 12 x 768 x 12)"),
    "aot-v-base": (16_000_000, 0.025, f"{_EARLIER}:359 (Table 2)"),
    "aot-v-large": (52_000_000, 0.025, f"{_EARLIER}:360 (Table 2)"),
    "aot-v-huge": (86_000_000, 0.025, f"{_EARLIER}:361 (Table 2)"),
    "aot-mssa-v": (22_000_000, 0.025, f"{_ICML}:194 (Table 1)"),
    "aot-mhsa-v": (15_000_000, 0.025, f"{_ICML}:202 (Table 2)"),
}


def list_presets() -> list[str]:
    """Names accepted by `AoTConfig.from_preset`."""
    return sorted(PRESETS)


def preset_kwargs(name: str) -> dict[str, Any]:
    """The config fields of preset `name` (a copy); raises `ValueError` listing the presets for an unknown name."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; choose one of {list_presets()}.")
    return dict(PRESETS[name])


__all__ = ["PAPER_PARAMETERS", "PRESETS", "list_presets", "preset_kwargs"]
