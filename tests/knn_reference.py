"""The test oracle of k-NN attention: the full score matrix, a stable sort and a gather, written from the rule in
`aot_transformers.attention_aot`'s docstring alone (min(k, visible) keys per query, lowest key index among ties)."""

from __future__ import annotations

import torch

from aot_transformers.attention_aot import resolve_knn_k


def _explicit_mask(module, attention_mask, is_causal, query_length, key_length):
    """The boolean mask a kernel applies: `attention_mask` (additive masks: entries above half the lowest value), or
    for None SDPA's reading — causal aligned top-left when the module is causal and Tq > 1, else every key. Queries
    that may see no key see every key."""
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    if is_causal is None:
        is_causal = module is not None and getattr(module, "is_causal", True)
    if attention_mask is None and is_causal and query_length > 1:
        attention_mask = torch.ones(query_length, key_length, dtype=torch.bool).tril()[None, None]
    if attention_mask is None:
        return None
    return attention_mask | ~attention_mask.any(dim=-1, keepdim=True)


def knn_attention_reference(
    module: torch.nn.Module | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    knn_k: int | float | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slow reference k-NN attention (full score matrix, stable sort, gather), written from the module docstring's
    rule alone. Scores as eager attention forms them (soft-capping, then an additive float mask as a bias); sinks
    (`s_aux`, one logit per head) join the softmax without a value. For tests only; ignores dropout."""
    if knn_k is None:
        knn_k = module.config.knn_k
    mask = _explicit_mask(module, attention_mask, is_causal, query.shape[2], key.shape[2])
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (B, H, Tq, Tk)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        scores = scores + attention_mask
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
        num_visible = mask.expand_as(scores).sum(-1, keepdim=True)
    else:
        num_visible = torch.full((*scores.shape[:-1], 1), scores.shape[-1], dtype=torch.long)
    # A stable descending sort lists tied scores by key index: the first `keep` entries are the kept keys.
    values, indices = torch.sort(scores, dim=-1, descending=True, stable=True)
    keep = resolve_knn_k(knn_k, num_visible)
    values = values.masked_fill(torch.arange(scores.shape[-1]) >= keep, float("-inf"))
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    if s_aux is not None:
        sinks = s_aux.to(values.dtype).reshape(1, -1, 1, 1).expand(*values.shape[:-1], 1)
        probs = torch.softmax(torch.cat([values, sinks], dim=-1), dim=-1)[..., :-1].to(query.dtype)
    else:
        probs = torch.softmax(values, dim=-1).to(query.dtype)
    output = (
        probs.unsqueeze(-1)
        * value.unsqueeze(2)
        .expand(-1, -1, probs.shape[2], -1, -1)
        .gather(3, indices.unsqueeze(-1).expand(-1, -1, -1, -1, value.shape[-1]))
    ).sum(-2)
    weights = torch.zeros_like(scores).scatter(-1, indices, probs)
    return output.transpose(1, 2).contiguous(), weights
