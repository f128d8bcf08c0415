"""The rows of the comparisons: which model each is, built from the package's presets or from transformers' peers.

AoT rows start from the papers' presets (`aot-mssa-l-base`, `aot-mhsa-l-base`; `aot-mssa-v`, `aot-mhsa-v`, and
`aot-v-base` for the row without LayerNorm) with the size fields scaled down. Peers are transformers' own
`GPT2LMHeadModel` and `ViTForImageClassification`, built by `benchmarks.peers` as `aot train --model_type` builds its
baselines; their k-NN twins run
the package's k-NN kernel through transformers' attention registry (`attn_implementation="aot_knn"`), so every
k-NN row uses the same exact top-k code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..peers import peer_model

KNN_ATTENTION = "aot_knn"


@dataclass(frozen=True)
class Row:
    """One model of a comparison.

    Attributes:
        name: Short id used in file names and tables (`aot-mssa+knn`).
        label: Name in the report.
        family: `"gpt2"`, `"vit"` or `"aot"`.
        fields: Config fields: AoT config overrides of `preset`, or the peer's size.
        preset: The package preset an AoT row starts from.
        knn: The row uses k-NN attention (k = `knn_k` of the plan).
        main: A main row (trained with every seed); other rows use the first seed only.
        dense: For a k-NN row, the name of its dense twin.
    """

    name: str
    label: str
    family: str
    fields: dict
    preset: str | None = None
    knn: bool = False
    main: bool = True
    dense: str | None = None


def _with_knn(rows: list[Row]) -> list[Row]:
    twins = [
        Row(f"{row.name}+knn", f"{row.label} + k-NN", row.family, row.fields, row.preset, True, False, row.name)
        for row in rows
    ]
    return rows + twins


# The earlier AoT paper's Table 1 counts (embedding included): AoT Base 102M, Hybrid 81M, Full MLP 109M. It prints no
# shapes for Hybrid and Full MLP; GPT-2 Base's 12 x 768 with MSSA attention and MLP ratio 4 (MLPs in blocks 1-6 or
# in all 12) reproduces both counts, so their non-embedding weights are inferred as below (AoT Base is the 24 x 1024
# `aot-mssa-l-base` preset; tests/test_replicate.py rebuilds all three shapes and checks these numbers).
PAPER_ABLATIONS = {
    "aot": {"total": 101_846_016, "non_embedding": 50_382_848, "shape": "24 x 1024"},
    "hybrid": {"total": 81_116_928, "non_embedding": 42_519_552, "shape": "12 x 768, MLP 4x in blocks 1-6"},
    "full": {"total": 109_460_736, "non_embedding": 70_863_360, "shape": "12 x 768, MLP 4x in all blocks"},
}
# At width ~100 the shared 50,257 x d embedding is >90% of every row, so the ablations keep AoT-MSSA's width (same
# embedding) and match the paper's *non-embedding* ratios (hybrid 0.84x, full 1.41x AoT): a quarter of AoT-MSSA's
# depth, with the MLP widened to 14/3 of the width, gets both within 1.5%.
ABLATION_DEPTH_DIVISOR = 4
ABLATION_MLP_RATIO = 14 / 3


def language_rows(plan) -> list[Row]:
    """GPT-2, AoT-MSSA and AoT-MHSA at equal parameters (same width and vocabulary, so the same embedding; AoT
    layers hold 2d² (MSSA) or 4d² (MHSA) weights against GPT-2's 12d², so AoT is 6x / 3x deeper), the hybrid and
    full-MLP ablations of AoT-MSSA at the earlier paper's non-embedding proportions (`PAPER_ABLATIONS`), and a
    k-NN twin of each."""
    d, heads, depth = plan.hidden_size, plan.num_attention_heads, plan.gpt2_layers
    common = {"hidden_size": d, "num_attention_heads": heads, "max_position_embeddings": plan.block_size}
    ablation_depth = max(2, 6 * depth // ABLATION_DEPTH_DIVISOR)
    ablation = {**common, "num_hidden_layers": ablation_depth, "mlp_ratio": ABLATION_MLP_RATIO}
    rows = [
        Row("gpt2", f"GPT-2 ({depth} x {d})", "gpt2", {**common, "num_hidden_layers": depth}),
        Row(
            "aot-mssa",
            f"AoT-MSSA ({6 * depth} x {d})",
            "aot",
            {**common, "num_hidden_layers": 6 * depth},
            "aot-mssa-l-base",
        ),
        Row(
            "aot-mhsa",
            f"AoT-MHSA ({3 * depth} x {d})",
            "aot",
            {**common, "num_hidden_layers": 3 * depth},
            "aot-mhsa-l-base",
        ),
        Row(
            "aot-mssa-hybrid-paper",
            f"AoT-MSSA hybrid (MLP {ABLATION_MLP_RATIO:.3g}x in first half, {ablation_depth} x {d})",
            "aot",
            {**ablation, "mlp_layers": "first_half"},
            "aot-mssa-l-base",
            main=False,
        ),
        Row(
            "aot-mssa-full-paper",
            f"AoT-MSSA full (MLP {ABLATION_MLP_RATIO:.3g}x in all layers, {ablation_depth} x {d})",
            "aot",
            {**ablation, "mlp_layers": "all"},
            "aot-mssa-l-base",
            main=False,
        ),
    ]
    return _with_knn(rows)


def vision_rows(plan) -> list[Row]:
    """ViT and AoT of the same depth and width (as the paper's AoT-V-Base has ViT-Base's shape, without MLPs):
    AoT-MSSA with and without LayerNorm, AoT-MHSA; and a k-NN twin of each."""
    common = {
        "hidden_size": plan.hidden_size,
        "num_attention_heads": plan.num_attention_heads,
        "num_hidden_layers": plan.num_hidden_layers,
        "patch_size": plan.patch_size,
    }
    shape = f"{plan.num_hidden_layers} x {plan.hidden_size}"
    rows = [
        Row("vit", f"ViT ({shape}, MLP 4x)", "vit", common),
        Row("aot-mssa", f"AoT-MSSA ({shape})", "aot", common, "aot-mssa-v"),
        Row(
            "aot-mssa-noln",
            f"AoT-MSSA without LayerNorm ({shape})",
            "aot",
            {**common, "layer_norm": False},
            "aot-v-base",
        ),
        Row("aot-mhsa", f"AoT-MHSA ({shape})", "aot", {**common, "attention_type": "mhsa"}, "aot-mhsa-v"),
    ]
    return _with_knn(rows)


# ---------------------------------------------------------------------------------------------------------------
# k-NN attention for transformers' own models


def _peer_knn_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention signature around the package's exact, chunked k-NN kernel; `knn_k` comes from the
    peer's config and causality from the attention module (GPT-2: causal, ViT: not)."""
    from aot_transformers.knn import knn_attention_forward

    kwargs.pop("is_causal", None)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return knn_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        scaling,
        dropout,
        is_causal=bool(getattr(module, "is_causal", False)),
        knn_k=module.config.knn_k,
        **kwargs,
    )


def register_knn_attention() -> None:
    """Make `attn_implementation="aot_knn"` available to every transformers model (idempotent). Its masks are
    boolean, True where a query may attend, as the package kernel expects."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(KNN_ATTENTION, _peer_knn_attention)
    AttentionMaskInterface.register(KNN_ATTENTION, sdpa_mask)


# ---------------------------------------------------------------------------------------------------------------
# Builders


def build_causal_lm(row: Row, vocab_size: int, knn_k: float, bos_token_id: int | None = None) -> torch.nn.Module:
    """The causal LM of `row`, freshly initialised (seed it first)."""
    fields = dict(row.fields)
    if row.family == "gpt2":
        from transformers import AutoModelForCausalLM

        if row.knn:
            register_knn_attention()
        return peer_model(
            AutoModelForCausalLM,
            "gpt2",
            KNN_ATTENTION if row.knn else "sdpa",
            vocab_size=vocab_size,
            bos_token_id=bos_token_id,
            eos_token_id=bos_token_id,
            knn_k=knn_k if row.knn else None,
            **fields,
        )
    from aot_transformers import AoTConfig, AoTForCausalLM

    config = AoTConfig.from_preset(
        row.preset,
        vocab_size=vocab_size,
        bos_token_id=bos_token_id,
        eos_token_id=bos_token_id,
        knn_k=knn_k if row.knn else None,
        use_cache=False,
        **fields,
    )
    return AoTForCausalLM(config)


def build_image_classifier(row: Row, image_size: int, id2label: dict[int, str], knn_k: float) -> torch.nn.Module:
    """The image classifier of `row`, freshly initialised (seed it first)."""
    fields = dict(row.fields)
    labels = {
        "num_labels": len(id2label),
        "id2label": dict(id2label),
        "label2id": {name: i for i, name in id2label.items()},
    }
    if row.family == "vit":
        from transformers import AutoModelForImageClassification

        if row.knn:
            register_knn_attention()
        return peer_model(
            AutoModelForImageClassification,
            "vit",
            KNN_ATTENTION if row.knn else "sdpa",
            image_size=image_size,
            num_channels=3,
            knn_k=knn_k if row.knn else None,
            **fields,
            **labels,
        )
    from aot_transformers import AoTConfig, AoTForImageClassification

    config = AoTConfig.from_preset(
        row.preset, image_size=image_size, knn_k=knn_k if row.knn else None, **fields, **labels
    )
    return AoTForImageClassification(config)


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    """Parameters: all (tied weights once), and without position embeddings (nanoGPT's count, the papers')."""
    unique = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in unique.values())
    positions = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and name.split(".")[-1] in ("wpe", "embed_positions"):
            positions += module.weight.numel()
    return {"total": total, "without_positions": total - positions}
