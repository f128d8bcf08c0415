"""k-NN attention for any transformers model (KVT, Wang et al., https://arxiv.org/abs/2106.00515).

KVT's claim is that keeping each query's k best keys is a drop-in for the attention of *any* transformer. Importing
this module (or `aot_transformers`) registers the package's exact, chunked k-NN kernel in transformers' public
`AttentionInterface` under the name `"knn"`, with its mask function (boolean masks, as SDPA's) in
`AttentionMaskInterface` — without the latter, transformers would build no mask and silently ignore padding. Nothing
else of transformers changes. Every model whose attention goes through `ALL_ATTENTION_FUNCTIONS` then runs k-NN
attention with one call:

    from aot_transformers.knn import use_knn_attention
    model = use_knn_attention(AutoModelForCausalLM.from_pretrained(name_or_folder), knn_k=0.5)

or, equivalently, with `config.knn_k` set and `attn_implementation="knn"` (the kernel then checks `knn_k` at the
first forward). `knn_k` is read from the model's config: an int keeps that many keys per query, a float in (0, 1]
keeps `ceil(knn_k * n)` of the `n` keys a query may see (the paper's rule of thumb is n/2). Exactly min(k, visible
keys) keys are kept (the lowest positions among keys tied at the k-th score). Causal and bidirectional models,
padding, grouped-query attention (fewer key/value heads) and KV caches all work; `knn_chunk_size` (default 256) sets
how many queries are scored at once.
"""

from __future__ import annotations

from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .attention_aot import knn_attention_forward
from .configuration_aot import check_knn_k, check_number

KNN_ATTENTION = "knn"
# The installed package's kernel, whatever a model folder's copy of `attention_aot` registered before it (AoT models
# run their own file's kernel either way).
AttentionInterface.register(KNN_ATTENTION, knn_attention_forward)
AttentionMaskInterface.register(KNN_ATTENTION, sdpa_mask)


def use_knn_attention(model: PreTrainedModel, knn_k: int | float, knn_chunk_size: int | None = None):
    """Switch `model` (any transformers model) to k-NN attention keeping `knn_k` keys per query, in place; returns
    it. Bad values raise here, naming the argument. `knn_k` is stored in the config (and its sub-configs), so
    `save_pretrained` keeps it."""
    settings = {"knn_k": check_knn_k(knn_k)}
    if knn_chunk_size is not None:
        settings["knn_chunk_size"] = check_number("knn_chunk_size", knn_chunk_size)
    sub_configs = (getattr(model.config, key, None) for key in model.config.sub_configs)
    for config in (model.config, *filter(None, sub_configs)):
        for name, value in settings.items():
            setattr(config, name, value)
    model.set_attn_implementation(KNN_ATTENTION)
    return model


__all__ = ["KNN_ATTENTION", "check_knn_k", "knn_attention_forward", "use_knn_attention"]
