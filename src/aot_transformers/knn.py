"""k-NN attention for any transformers model (KVT, Wang et al., https://arxiv.org/abs/2106.00515).

KVT's claim is that keeping each query's k best keys is a drop-in for the attention of *any* transformer. Importing
this module (or `aot_transformers`) registers the package's exact, chunked k-NN kernel in transformers'
`AttentionInterface` under the name `"knn"`, with its mask function (boolean masks, as SDPA's) in
`AttentionMaskInterface` — without the latter, transformers would build no mask and silently ignore padding. Every
model whose attention goes through `ALL_ATTENTION_FUNCTIONS` then runs k-NN attention with one argument:

    import aot_transformers.knn
    model = AutoModelForCausalLM.from_pretrained(name_or_folder, attn_implementation="knn", knn_k=0.5)

`knn_k` is read from the model's config: an int keeps that many keys per query, a float in (0, 1] keeps
`ceil(knn_k * n)` of the `n` keys a query may see (the paper's rule of thumb is n/2). Exactly min(k, visible keys)
keys are kept (the lowest positions among keys tied at the k-th score). Causal and bidirectional models, padding,
grouped-query attention (fewer key/value heads) and KV caches all work; `knn_chunk_size` (default 256) sets how
many queries are scored at once.
"""

from __future__ import annotations

from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .attention_aot import knn_attention_forward
from .configuration_aot import check_knn_k, check_number

KNN_ATTENTION = "knn"
# The installed package's kernel, whatever a model folder's copy of `attention_aot` registered before it (AoT models
# run their own file's kernel either way).
AttentionInterface.register(KNN_ATTENTION, knn_attention_forward)
AttentionMaskInterface.register(KNN_ATTENTION, sdpa_mask)

# `from_pretrained(..., knn_k=0.5)` hands a keyword to the config only if the config already has that attribute
# (otherwise it goes to the model's `__init__`, which rejects it). A class-level default makes every config accept
# `knn_k` (and `knn_chunk_size`); a value given is stored on the instance and saved with the config.
for _name in ("knn_k", "knn_chunk_size"):
    if not hasattr(PretrainedConfig, _name):
        setattr(PretrainedConfig, _name, None)


_check_and_adjust_attn_implementation = PreTrainedModel._check_and_adjust_attn_implementation


def _check_knn_settings_at_load(self, attn_implementation, *args, **kwargs):
    """Bad `knn_k` / `knn_chunk_size` raise when the model is built or switched to "knn", not at its first forward."""
    if attn_implementation == KNN_ATTENTION:
        check_knn_k(getattr(self.config, "knn_k", None))
        if (chunk_size := getattr(self.config, "knn_chunk_size", None)) is not None:
            check_number("knn_chunk_size", chunk_size)
    return _check_and_adjust_attn_implementation(self, attn_implementation, *args, **kwargs)


if not getattr(_check_and_adjust_attn_implementation, "_aot_knn_checks", False):
    _check_knn_settings_at_load._aot_knn_checks = True
    PreTrainedModel._check_and_adjust_attn_implementation = _check_knn_settings_at_load


__all__ = ["KNN_ATTENTION", "check_knn_k", "knn_attention_forward"]
