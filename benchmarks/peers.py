"""transformers' own models as the benchmarks' peers (GPT-2, Llama, Mistral, ViT), built the way
`aot train lm|image --model_type gpt2|llama|vit` builds its baseline.

One builder for every comparison: the sizes go through `aot_transformers.training.model_setup.baseline_config`
(the peer's config at a preset's width, depth, heads, context or image size, its MLP at `mlp_ratio` times the
width, no dropout), so a benchmark's peer and a trained baseline are the same model. What a benchmark sets beyond
the sizes (special tokens, labels, `knn_k`, a different MLP width) it passes in the peer's own field names.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig, PreTrainedModel

from aot_transformers import AoTConfig
from aot_transformers.training.model_setup import BASELINE_SIZE_FIELDS, baseline_config

# The AoT config fields that size a peer (its preset's), beyond which every field is the peer's own.
_SIZE_FIELDS = {*BASELINE_SIZE_FIELDS["text-generation"], *BASELINE_SIZE_FIELDS["image-classification"], "mlp_ratio"}


def peer_config(model_type: str, attn_implementation: str = "sdpa", **fields: Any) -> PretrainedConfig:
    """The config of transformers' `model_type` (`gpt2`, `llama`, `mistral`, `vit`) for a benchmark.

    Args:
        model_type: transformers' model type of the peer.
        attn_implementation: the attention backend the peer runs (`sdpa`, or `knn` / a registered name).
        **fields: the sizes in AoT's (transformers' standard) names — `vocab_size`, `hidden_size`,
            `num_hidden_layers`, `num_attention_heads`, `max_position_embeddings`, `image_size`, `patch_size`,
            `num_channels`, `mlp_ratio` — and any other field in the peer's own names, set after the sizes.
    """
    task = "image-classification" if model_type == "vit" else "text-generation"
    sizes = {name: fields.pop(name) for name in list(fields) if name in _SIZE_FIELDS}
    # The preset only carries sizes; AoT's own default special tokens (GPT-2's 50256) are not the peer's.
    preset = AoTConfig(bos_token_id=None, eos_token_id=None, pad_token_id=None, **sizes)
    config = baseline_config(model_type, task, preset)
    config.update(fields)
    config._attn_implementation = attn_implementation
    return config


def peer_model(auto_class: type, model_type: str, attn_implementation: str = "sdpa", **fields: Any) -> PreTrainedModel:
    """A freshly initialised peer: the class `auto_class` (a transformers Auto class) maps `peer_config(...)` to,
    built from that config as `aot train` builds its baseline (seed the run first)."""
    config = peer_config(model_type, attn_implementation, **fields)
    return auto_class._model_mapping[type(config)](config)
