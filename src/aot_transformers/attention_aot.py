"""Attention kernels of AoT models: dense eager attention and exact k-NN attention, with transformers' kernel signature
(`ALL_ATTENTION_FUNCTIONS`): `kernel(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs) ->
(output, weights)`. Shapes: `query`, `key`, `value` (B, H, T, D), `output` (B, Tq, H, D), `weights` (B, H, Tq, Tk).
`attention_mask` is boolean (True: may attend), additive float (a bias) or None, which means what it means to SDPA:
`is_causal` aligned top-left (query i sees keys 0..i, as for a static-cache prefill) when the module is causal and
Tq > 1, else every key.

k-NN attention (KVT, https://arxiv.org/abs/2106.00515) keeps, for each query, the k highest-scoring keys it may see:
exactly min(k, visible) keys — with a fractional k, min(ceil(k · visible), visible), at least 1 — the lowest key
indices among keys tied at the k-th score. Computed here in one piece, by eager attention with `knn_k` (memory
O(Tq · Tk)), for a model loaded without the package, whose `aot_transformers.knn` registers a chunked kernel with the
same values and memory linear in the length (as transformers keeps flash attention out of its model files).
Remote-code unit.
"""

import math
from fractions import Fraction

import torch
from torch import nn
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs


def resolve_knn_k(knn_k: int | float, num_visible: torch.Tensor | int) -> torch.Tensor | int:
    """Keys kept by each query, min(k, n) and at least 1, for `num_visible` (n) an integer tensor of any shape or a
    Python int (a shape, not data: then an int)."""
    if isinstance(knn_k, float):
        # k · n rounded up in integers, so that every device (MPS has no float64) counts the same keys; 0.1 · 10 is 1.
        ratio = Fraction(knn_k).limit_denominator(1 << 20)
        knn_k = (num_visible * ratio.numerator + ratio.denominator - 1) // ratio.denominator
    if isinstance(num_visible, torch.Tensor):
        return num_visible.clamp(max=knn_k).clamp(min=1)
    return max(1, min(num_visible, knn_k))


def _keep(knn_k: int | float, scores: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """Keys kept by each query of `scores` (B, H, C, Tk), (B|1, H|1, C|1, 1)."""
    every = torch.full((1,) * scores.dim(), scores.shape[-1], device=scores.device)
    return resolve_knn_k(knn_k, every if visible is None else visible.sum(dim=-1, keepdim=True))


def knn_kept_mask(scores: torch.Tensor, visible: torch.Tensor | None, knn_k: int | float) -> torch.Tensor:
    """Which keys each query of `scores` (B, H, Tq, Tk; hidden keys at -inf) keeps, by the module docstring's rule, as
    a boolean mask: the keys above the k-th largest visible score (a sort and a gather, so that k stays data, not a
    shape: `torch.export` keeps the length dynamic), then the first of the keys tied at it, by key index."""
    keep = _keep(knn_k, scores, visible)
    threshold = torch.sort(scores, dim=-1, descending=True)[0].gather(-1, (keep - 1).expand(*scores.shape[:-1], 1))
    above, tied = scores > threshold, scores == threshold
    kept_tied = keep - above.sum(dim=-1, keepdim=True)  # the first `kept_tied` tied keys by index are kept
    return above | (tied & (tied.to(scores.dtype).cumsum(dim=-1) <= kept_tied))  # float counts: exact below 2**24


def _masks(attention_mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A mask as (visible, bias): a boolean mask says where a query may attend; an additive float mask adds its finite
    entries as a bias and hides the keys below half the dtype's lowest value. A query that may see no key (a padding
    row) sees every key, so that no row is all -inf; no real token reads it."""
    visible = bias = None
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        bias, visible = attention_mask, attention_mask > torch.finfo(attention_mask.dtype).min / 2
    elif attention_mask is not None:
        visible = attention_mask
    return None if visible is None else visible | ~visible.any(dim=-1, keepdim=True), bias


def _is_causal(module: nn.Module | None, is_causal: bool | None, q_len: int) -> bool:
    """Causal as SDPA reads a missing mask: the argument, else the module's flag (causal when unsaid), and never for a
    single query (it sees every key) or a bare call with no module."""
    if is_causal is None:
        is_causal = module is not None and getattr(module, "is_causal", True)
    return bool(is_causal) and q_len > 1


def eager_attention_forward(
    module: nn.Module | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    knn_k: int | float | None = None,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention in one piece through autograd with explicit (B, H, Tq, Tk) weights (before dropout), the `"eager"`
    backend: boolean or additive masks, and a missing mask read as SDPA reads it (module docstring). Scores in at
    least float32; with `knn_k`, -inf where a query keeps no key (the weights then carry gradients as dense
    attention's do)."""
    visible, bias = _masks(attention_mask)
    if visible is None and _is_causal(module, is_causal, query.shape[2]):  # keys past the last query: never seen
        visible = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).tril()
    scores = torch.matmul(query * scaling, key.transpose(-1, -2))  # (B, H, Tq, Tk)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if bias is not None:  # in place, unless the bias broadcasts the scores to a larger shape
        in_place = torch.broadcast_shapes(scores.shape, bias.shape) == scores.shape
        scores = scores.add_(bias) if in_place else scores + bias
    if visible is not None:
        scores = scores.masked_fill_(~visible, -math.inf)
    if knn_k is not None:
        with torch.no_grad():
            kept = knn_kept_mask(scores.detach(), visible, knn_k)
        scores = scores.masked_fill(~kept, -math.inf)
    weights = torch.softmax(scores, dim=-1).to(query.dtype)
    kept = torch.rand(weights.shape, device=weights.device) >= dropout if dropout > 0.0 else None
    output = torch.matmul(weights if kept is None else weights * kept / (1 - dropout), value)  # (B, H, Tq, D)
    return output.transpose(1, 2).contiguous(), weights


# "knn" gets SDPA's boolean mask function from transformers' masking utilities (without one, transformers would build
# no mask and ignore padding); the kernel itself is looked up by the model (`modeling_aot._attention_function`).
AttentionMaskInterface.register("knn", sdpa_mask)

__all__ = ["eager_attention_forward", "knn_kept_mask", "resolve_knn_k"]
