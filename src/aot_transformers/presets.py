"""Named configurations of the papers' models, reached through `AoTConfig.from_preset(name, **overrides)`.

Parameter counts (nanoGPT's convention for language models: everything but the position table):
AoT-MSSA-L Base / Medium / Large ≈ 102M / 182M / 326M, AoT-MHSA-L Base ≈ 122M, all with GPT-2's 50,257-token
vocabulary; vision AoT Base / Large / Huge ≈ 16M / 52M / 86M at 224 px, patch 16, 1,000 classes.
`tests/test_presets.py` checks each against the paper on the meta device.
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

PRESETS: dict[str, dict[str, Any]] = {
    "aot-mssa-l-base": {**_CAUSAL_MSSA, "num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16},
    "aot-mssa-l-medium": {**_CAUSAL_MSSA, "num_hidden_layers": 36, "hidden_size": 1280, "num_attention_heads": 20},
    "aot-mssa-l-large": {**_CAUSAL_MSSA, "num_hidden_layers": 48, "hidden_size": 1600, "num_attention_heads": 25},
    "aot-mhsa-l-base": {
        **_LANGUAGE,
        "attention_type": "mhsa",
        "num_hidden_layers": 24,
        "hidden_size": 896,
        "num_attention_heads": 14,
    },
    "aot-v-base": {**_VISION, "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12},
    "aot-v-large": {**_VISION, "num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16},
    "aot-v-huge": {**_VISION, "num_hidden_layers": 32, "hidden_size": 1152, "num_attention_heads": 16},
    # Tiny models for tests, demos and CPU experiments.
    "aot-mssa-l-tiny": {
        **_CAUSAL_MSSA,
        "vocab_size": 1024,
        "max_position_embeddings": 256,
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "bos_token_id": None,
        "eos_token_id": None,
    },
    "aot-mhsa-l-tiny": {
        **_LANGUAGE,
        "attention_type": "mhsa",
        "vocab_size": 1024,
        "max_position_embeddings": 256,
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "bos_token_id": None,
        "eos_token_id": None,
    },
    "aot-v-tiny": {
        **_VISION,
        "image_size": 32,
        "patch_size": 4,
        "num_labels": 10,
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "num_attention_heads": 4,
    },
}

# What each preset reproduces: (paper parameter count, relative tolerance), for the tests and the docs.
PAPER_PARAMETERS: dict[str, tuple[int, float]] = {
    "aot-mssa-l-base": (102_000_000, 0.015),
    "aot-mssa-l-medium": (182_000_000, 0.015),
    "aot-mssa-l-large": (326_000_000, 0.015),
    "aot-mhsa-l-base": (122_000_000, 0.015),
    "aot-v-base": (16_000_000, 0.025),
    "aot-v-large": (52_000_000, 0.025),
    "aot-v-huge": (86_000_000, 0.025),
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
