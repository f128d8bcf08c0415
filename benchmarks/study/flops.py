"""Training FLOPs of a causal LM, counted from its weights and its attention (Kaplan et al. 2020, Sec. 2.1).

Per token, a forward pass multiplies by every weight matrix once (2 FLOPs per weight: the output projection
included, embedding lookups not) and, in each attention layer, scores the query against the keys it sees and mixes
their values: 2·d FLOPs per key for the scores and 2·d for the mix, over (T + 1) / 2 keys on average in a causal
block of T tokens. Training costs three forwards (the backward is two). At equal parameters AoT-MSSA is six times
deeper than GPT-2, so its attention term is six times larger: equal parameters is not equal compute.

MSSA's one projection per head serves as query, key and value: it is one weight matrix, applied once, and counted
once. `tests/test_study.py` checks the count against torch's `FlopCounterMode` on small models.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .plan import VISION


def matmul_weights(model: torch.nn.Module) -> int:
    """Weights a token is multiplied by in one forward: every 2-D weight of a linear layer (transformers' `Conv1D`
    included) and the output projection, tied or not; embedding tables are lookups and do not count."""
    from transformers.pytorch_utils import Conv1D

    count = sum(m.weight.numel() for m in model.modules() if isinstance(m, (torch.nn.Linear, Conv1D)))
    head = model.get_output_embeddings()
    if head is not None and not isinstance(head, torch.nn.Linear):  # pragma: no cover - every model here has one
        count += head.weight.numel()
    return count


def forward_flops_per_token(model: torch.nn.Module, block_size: int) -> float:
    """FLOPs of one forward pass per token of a causal LM trained on blocks of `block_size` tokens."""
    config = model.config
    width = config.hidden_size
    keys = (block_size + 1) / 2  # the mean number of keys a causal query sees
    # A k-NN model still scores every visible key (it keeps the best k of them, then mixes only those).
    return 2 * matmul_weights(model) + config.num_hidden_layers * 4 * width * keys


def _meta_model(model_or_dir: str | Path | torch.nn.Module, auto_class: str) -> torch.nn.Module:
    """The model given, or the one a saved folder's config builds (with transformers' `auto_class`), on the meta
    device."""
    if isinstance(model_or_dir, torch.nn.Module):
        return model_or_dir
    import transformers

    import aot_transformers  # noqa: F401  (registers AoT with the Auto classes)

    with torch.device("meta"):
        return getattr(transformers, auto_class).from_config(transformers.AutoConfig.from_pretrained(model_or_dir))


def training_flops_per_token(model_dir: str | Path | torch.nn.Module, block_size: int) -> float:
    """Forward and backward FLOPs per training token (three forwards) of a saved model folder or a model."""
    return 3 * forward_flops_per_token(_meta_model(model_dir, "AutoModelForCausalLM"), block_size)


def image_training_flops(model_dir: str | Path | torch.nn.Module, patch_tokens: int) -> float:
    """Forward and backward FLOPs per training image of a saved image classifier (or a model): every linear weight
    once per token (the class token included) and bidirectional attention over all of them (every query sees every
    key)."""
    model = _meta_model(model_dir, "AutoModelForImageClassification")
    config, tokens = model.config, patch_tokens + 1
    return 3 * (2 * matmul_weights(model) * tokens + config.num_hidden_layers * 4 * config.hidden_size * tokens**2)


def planned_flops(run, block_size: int) -> float:
    """Training FLOPs of a run of the plan before it runs: its model as `aot train` builds it from the run's
    arguments, on the meta device, counted as its record will count them."""
    from transformers import AutoModelForCausalLM, AutoModelForImageClassification

    from aot_transformers.training.image import parse_image_arguments
    from aot_transformers.training.lm import parse_lm_arguments
    from aot_transformers.training.model_setup import build_config

    language = run.section == "language"
    model_args = (parse_lm_arguments if language else parse_image_arguments)([*run.arguments, "--output_dir", "-"])[0]
    config = build_config(model_args, "aot-mssa-l-tiny", "text-generation" if language else "image-classification")
    if not language:  # the dataset sets the head's classes when the run starts; the preset's 1000 would count 100x
        config.num_labels = VISION.num_classes
    with torch.device("meta"):
        model = (AutoModelForCausalLM if language else AutoModelForImageClassification).from_config(config)
    if language:
        return training_flops_per_token(model, block_size) * run.tokens
    return image_training_flops(model, (config.image_size // config.patch_size) ** 2) * run.tokens
