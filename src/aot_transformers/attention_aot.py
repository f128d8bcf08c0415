"""Attention backends of aot-transformers, and the functional subspace-attention operator.

Every backend has transformers' kernel signature (`ALL_ATTENTION_FUNCTIONS`):

    backend(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs) -> (output, weights)

with `query` (B, H, Tq, D), `key`/`value` (B, H, Tk, D), `attention_mask` broadcastable to (B, H, Tq, Tk) — boolean,
True where a query may attend, or an additive float mask — or None (every key; causal when `module.is_causal`),
`output` (B, Tq, H, D) and `weights` (B, H, Tq, Tk) or None. The models pick one backend by name,
`ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)`:

- `"eager"` (`eager_attention_forward`): dense, returns the weights;
- `"sdpa"`: transformers' own `scaled_dot_product_attention` integration;
- `"shared_projection"` (`shared_projection_attention_forward`): MSSA's kernel for CPU training steps, SDPA
  otherwise (`aot train` selects it for MSSA on CPU);
- `"knn"` (`knn_attention_backend` around `knn_attention_forward`): k-NN attention, for AoT (the default whenever
  `config.knn_k` is set) and for any transformers model (`aot_transformers.knn`).

The last two are registered below in `AttentionInterface`, with their mask function in `AttentionMaskInterface`.

k-NN attention keeps, for each query, the k keys with the highest scores among the keys it may see, masks the
others to -inf and takes the softmax (KVT, Wang et al., https://arxiv.org/abs/2106.00515). k is clamped per query
to the number of keys it may see. Ties at the k-th score are broken by `torch.topk`'s order, so exactly
min(k, visible keys) keys are kept.

This file is part of the remote-code unit: it imports only torch and transformers.

Shape legend: B batch, H heads, Tq/Tk query/key length, D head width, C query-chunk length, K kept keys.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

# Below this many candidate keys per kept key, the two-stage threshold search does not pay for itself.
_TWO_STAGE_GROUP = 4


def resolve_knn_k(knn_k: int | float, num_visible: torch.Tensor) -> torch.Tensor:
    """Number of keys each query keeps.

    Args:
        knn_k: An int (keep that many keys) or a float in (0, 1] (keep `ceil(knn_k * n)` of the `n` visible keys).
        num_visible: Integer tensor, the number of keys each query may see.

    Returns:
        Integer tensor like `num_visible`: `min(k, n)`, and at least 1 where `n >= 1`.
    """
    if isinstance(knn_k, float):
        k = torch.ceil(num_visible.to(torch.float64) * knn_k).to(num_visible.dtype)
    else:
        k = torch.full_like(num_visible, knn_k)
    return torch.minimum(k, num_visible).clamp(min=1)


def _max_knn_k(knn_k: int | float, num_keys: int) -> int:
    if isinstance(knn_k, float):
        return min(num_keys, max(1, math.ceil(knn_k * num_keys)))
    return min(num_keys, knn_k)


def _topk_scores(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted top-k values and indices along the last dim, faster than `torch.topk` on CPU for small k.

    The top-k elements of a row all lie in the k groups (of `_TWO_STAGE_GROUP` neighbours) with the largest
    maxima: an element outside them is beaten by k group maxima. So a top-k over the group maxima, a gather of
    those groups and a top-k over k·group candidates give the exact result while touching the full row only once,
    with a cheap max reduction.
    """
    n = scores.shape[-1]
    group = _TWO_STAGE_GROUP
    if n % group != 0 or n < 4 * group * k:
        return torch.topk(scores, k, dim=-1, sorted=True)
    grouped = scores.unflatten(-1, (n // group, group))  # (..., G, S)
    _, top_groups = torch.topk(grouped.amax(dim=-1), k, dim=-1, sorted=False)  # (..., k)
    candidate_idx = (top_groups.unsqueeze(-1) * group + torch.arange(group, device=scores.device)).flatten(-2)
    candidates = scores.gather(-1, candidate_idx)  # (..., k·S)
    values, pos = torch.topk(candidates, k, dim=-1, sorted=True)
    return values, candidate_idx.gather(-1, pos)


def _knn_select(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    knn_k: int | float,
    max_k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept key indices and their probabilities for one chunk of queries.

    Returns `indices` (B, H, C, K) and `probs` (B, H, C, K) in at least float32; dropped slots have probability 0.
    """
    scores = torch.matmul(query * scaling, key.transpose(-1, -2))  # (B, H, C, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    values, indices = _topk_scores(scores, max_k)  # (B, H, C, K), sorted descending
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    if mask is not None or isinstance(knn_k, float):
        if mask is not None:
            num_visible = mask.sum(dim=-1, keepdim=True)
        else:
            num_visible = torch.full((1, 1, 1, 1), key.shape[-2], device=key.device)
        keep = resolve_knn_k(knn_k, num_visible.to(torch.long))  # (B, 1|H, C, 1)
        rank = torch.arange(max_k, device=query.device)
        values = values.masked_fill(rank >= keep, float("-inf"))
    return indices, torch.softmax(values, dim=-1)


def _densify(indices: torch.Tensor, sparse: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Scatter (B, H, C, K) values at key positions `indices` into a zero (B, H, C, Tk) chunk.

    On CPU a zero-filled chunk and one matmul beat gathering K rows of D values per query.
    """
    dense = sparse.new_zeros(*sparse.shape[:-1], num_keys)
    return dense.scatter_(-1, indices, sparse)


class _KnnAttentionFunction(torch.autograd.Function):
    """Chunked exact k-NN attention whose backward keeps only the kept indices and probabilities.

    Peak extra memory is O(C · Tk) for one chunk of scores, and O(Tq · K) for what is saved for the backward,
    which rebuilds each chunk's sparse probability matrix from the saved indices instead of keeping Tq × Tk scores.
    """

    @staticmethod
    def forward(ctx, query, key, value, mask, scaling, knn_k, chunk_size, dropout, generator):
        batch, heads, q_len, _ = query.shape
        num_keys = key.shape[-2]
        max_k = _max_knn_k(knn_k, num_keys)
        prob_dtype = torch.promote_types(query.dtype, torch.float32)
        output = query.new_empty(batch, heads, q_len, value.shape[-1])
        all_indices = torch.empty(batch, heads, q_len, max_k, dtype=torch.long, device=query.device)
        all_probs = torch.empty(batch, heads, q_len, max_k, dtype=prob_dtype, device=query.device)
        for start in range(0, q_len, chunk_size):
            stop = min(start + chunk_size, q_len)
            chunk_mask = None if mask is None else mask[:, :, start:stop]
            indices, probs = _knn_select(query[:, :, start:stop], key, chunk_mask, scaling, knn_k, max_k)
            if dropout > 0.0:
                keep = torch.rand(probs.shape, device=probs.device, generator=generator) >= dropout
                probs = probs * keep / (1.0 - dropout)
            output[:, :, start:stop] = torch.matmul(_densify(indices, probs.to(value.dtype), num_keys), value)
            all_indices[:, :, start:stop] = indices
            all_probs[:, :, start:stop] = probs
        ctx.save_for_backward(query, key, value, all_indices, all_probs)
        ctx.scaling = scaling
        ctx.chunk_size = chunk_size
        return output, all_indices, all_probs

    @staticmethod
    def backward(ctx, grad_output, _grad_indices, _grad_probs):
        query, key, value, all_indices, all_probs = ctx.saved_tensors
        num_keys = key.shape[-2]
        grad_query = torch.empty_like(query)
        grad_key = torch.zeros_like(key)
        grad_value = torch.zeros_like(value)
        for start in range(0, query.shape[2], ctx.chunk_size):
            stop = min(start + ctx.chunk_size, query.shape[2])
            indices = all_indices[:, :, start:stop]  # (B, H, C, K)
            probs = all_probs[:, :, start:stop].to(query.dtype)  # dropout already folded in
            grad_out = grad_output[:, :, start:stop]  # (B, H, C, D)
            dense_probs = _densify(indices, probs, num_keys)  # (B, H, C, Tk)
            grad_value += torch.matmul(dense_probs.transpose(-1, -2), grad_out)
            grad_probs = torch.matmul(grad_out, value.transpose(-1, -2)).gather(-1, indices)  # (B, H, C, K)
            # Softmax backward on the kept slots. With dropout, p is the dropped-and-rescaled probability and
            # dS = p * (dP - sum(p * dP)) still holds because the dropout mask is a constant factor.
            grad_scores = probs * (grad_probs - (probs * grad_probs).sum(-1, keepdim=True)) * ctx.scaling
            dense_grad_scores = _densify(indices, grad_scores, num_keys)  # (B, H, C, Tk)
            grad_query[:, :, start:stop] = torch.matmul(dense_grad_scores, key)
            grad_key += torch.matmul(dense_grad_scores.transpose(-1, -2), query[:, :, start:stop])
        return grad_query, grad_key, grad_value, None, None, None, None, None, None


# Longest sequence, by `is_causal`, for which MSSA training on CPU uses the shared-projection kernel below instead
# of SDPA: where it was faster on a training step (forward + backward, heads of 64, 1 and 2 threads) and keeps at
# most ~1.7x SDPA's saved bytes; `python -m benchmarks.bench_attention` measures both. Set both to 0 for SDPA only.
SHARED_KERNEL_MAX_LENGTH: dict[bool, int] = {True: 256, False: 128}
# Queries per block of the causal shared-projection kernel: each block scores only the keys up to its last query.
_SHARED_KERNEL_BLOCK = 64


class _SharedProjectionAttention(torch.autograd.Function):
    """softmax(s · U Uᵀ) U for MSSA, where one tensor U (B, H, T, D) is query, key and value.

    CPU SDPA recomputes the scores in its backward and runs small heads at a fraction of the matmul rate; for
    short sequences it is faster to keep the probabilities P and use batched matmuls. With query = key = value the
    three input gradients fold into two matmuls: dU = (dS + dSᵀ) U + Pᵀ dO, with dS the softmax backward of
    P ∘ (dO Uᵀ) times s. Causal attention runs in blocks of `_SHARED_KERNEL_BLOCK` queries that score only the keys
    up to their last query (about half of the T × T products). Saved for the backward: U and P (T² / 2 floats per
    head when causal, T² when not) — which is why this kernel is used only up to `SHARED_KERNEL_MAX_LENGTH`.
    """

    @staticmethod
    def forward(ctx, states, scaling, is_causal):
        batch, heads, length, dim = states.shape
        flat = states.reshape(batch * heads, length, dim)  # (BH, T, D)
        block = _SHARED_KERNEL_BLOCK if is_causal else length
        outputs, probs = [], []
        for start in range(0, length, block):
            stop = min(start + block, length)
            keys = flat[:, :stop] if is_causal else flat  # (BH, Tk, D)
            scores = torch.baddbmm(
                flat.new_zeros(()).expand(1, 1, 1), flat[:, start:stop], keys.transpose(1, 2), beta=0, alpha=scaling
            )  # (BH, C, Tk)
            if is_causal:  # the keys after each query, all inside the block's own diagonal square
                future = torch.ones(stop - start, stop - start, dtype=torch.bool, device=flat.device).triu_(1)
                scores[:, :, start:].masked_fill_(future, float("-inf"))
            weights = torch.softmax(scores, dim=-1)
            outputs.append(torch.bmm(weights, keys))
            probs.append(weights)
        ctx.save_for_backward(flat, *probs)
        ctx.scaling, ctx.block = scaling, block
        output = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        return output.view(batch, heads, length, dim)

    @staticmethod
    def backward(ctx, grad_output):
        flat, *probs = ctx.saved_tensors
        batch_heads, length, dim = flat.shape
        grad = grad_output.reshape(batch_heads, length, dim)
        if len(probs) == 1:  # one block, square scores: the query and key gradients fold into one matmul
            weights = probs[0]
            grad_scores = torch._softmax_backward_data(torch.bmm(grad, flat.transpose(1, 2)), weights, -1, flat.dtype)
            grad_states = torch.bmm((grad_scores + grad_scores.transpose(1, 2)).mul_(ctx.scaling), flat)
            grad_states.baddbmm_(weights.transpose(1, 2), grad)
            return grad_states.view(grad_output.shape), None, None
        # Causal blocks: block i's queries are rows start:stop, its keys and values rows :stop.
        as_query = []  # each block's gradient through its queries
        as_key_value = torch.zeros_like(flat)  # the gradient through the keys and values, summed over blocks
        for weights, start in zip(probs, range(0, length, ctx.block), strict=True):
            stop = start + weights.shape[1]
            keys, block_grad = flat[:, :stop], grad[:, start:stop]
            grad_scores = torch._softmax_backward_data(
                torch.bmm(block_grad, keys.transpose(1, 2)), weights, -1, flat.dtype
            ).mul_(ctx.scaling)  # (BH, C, Tk)
            as_query.append(torch.bmm(grad_scores, keys))
            key_value = torch.bmm(grad_scores.transpose(1, 2), flat[:, start:stop])
            as_key_value[:, :stop] += key_value.baddbmm_(weights.transpose(1, 2), block_grad)
        grad_states = as_key_value.add_(torch.cat(as_query, dim=1))
        return grad_states.view(grad_output.shape), None, None


def _module_is_causal(module: torch.nn.Module | None, is_causal: bool | None) -> bool:
    """The causality a kernel applies when it gets no mask: the `is_causal` argument, else the module's flag (as in
    transformers' SDPA integration: causal when the module does not say), and bidirectional for a bare call with no
    module."""
    if is_causal is not None:
        return bool(is_causal)
    if module is None:
        return False
    return bool(getattr(module, "is_causal", True))


def _boolean_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """A mask as booleans, True where a query may attend: boolean masks pass through; additive float masks (eager
    masks, continuous batching) keep the entries that add more than half the dtype's lowest value."""
    if attention_mask is None or attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2


def _ensure_visible_key(mask: torch.Tensor | None) -> torch.Tensor | None:
    """Let queries that may see no key (e.g. left padding) see every key, so that no row is all -inf.

    Such queries are padding: their outputs are never read by real tokens, which cannot attend to them.
    """
    if mask is None:
        return None
    return mask | ~mask.any(dim=-1, keepdim=True)


def _explicit_mask(
    attention_mask: torch.Tensor | None, is_causal: bool, query_length: int, key_length: int, device: torch.device
) -> torch.Tensor | None:
    """The boolean mask to apply: `attention_mask`, or the causal mask it stands for when None and `is_causal`.

    The last query sits at the last key, so with a cache (Tq < Tk) query i sees keys up to Tk - Tq + i.
    """
    attention_mask = _boolean_mask(attention_mask)
    if attention_mask is None and is_causal and query_length > 1:
        offset = key_length - query_length
        rows = torch.arange(query_length, device=device)[:, None] + offset
        attention_mask = (torch.arange(key_length, device=device)[None, :] <= rows)[None, None]
    return _ensure_visible_key(attention_mask)


def shared_projection_applies(query, key, value, attention_mask, dropout: float, is_causal: bool) -> bool:
    """Whether `_SharedProjectionAttention` can and should run a call: one tensor as query, key and value (MSSA
    without cache and without query normalisation), no mask, no dropout, fp32 on CPU, a step that will be
    differentiated, and a sequence no longer than `SHARED_KERNEL_MAX_LENGTH` (inference keeps SDPA, which saves
    nothing for a backward)."""
    return (
        query is key
        and key is value
        and attention_mask is None
        and dropout == 0.0
        and query.device.type == "cpu"
        and query.dtype == torch.float32
        and torch.is_grad_enabled()
        and query.requires_grad
        and 1 < query.shape[2] <= SHARED_KERNEL_MAX_LENGTH[bool(is_causal)]
    )


def knn_attention_forward(
    module: torch.nn.Module | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    knn_k: int | float | None = None,
    knn_chunk_size: int | None = None,
    output_attentions: bool = False,
    generator: torch.Generator | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exact k-NN attention computed in chunks of `knn_chunk_size` queries (see the module docstring).

    `knn_k` defaults to `module.config.knn_k`. Returns attention weights (B, H, Tq, Tk) only when
    `output_attentions` is set.
    """
    if knn_k is None:
        knn_k = module.config.knn_k
    if knn_chunk_size is None:
        knn_chunk_size = getattr(getattr(module, "config", None), "knn_chunk_size", 256)
    is_causal = _module_is_causal(module, is_causal)
    mask = _explicit_mask(attention_mask, is_causal, query.shape[2], key.shape[2], query.device)
    if mask is not None:
        mask = mask.expand(query.shape[0], -1, query.shape[2], key.shape[2])
    output, indices, probs = _KnnAttentionFunction.apply(
        query, key, value, mask, scaling, knn_k, knn_chunk_size, dropout, generator
    )
    weights = None
    if output_attentions:
        weights = query.new_zeros(*query.shape[:3], key.shape[2]).scatter_(-1, indices, probs.to(query.dtype))
    return output.transpose(1, 2).contiguous(), weights


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
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slow reference k-NN attention (full score matrix, `torch.topk`, gather). For tests only."""
    if knn_k is None:
        knn_k = module.config.knn_k
    is_causal = _module_is_causal(module, is_causal)
    mask = _explicit_mask(attention_mask, is_causal, query.shape[2], key.shape[2], query.device)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
        num_visible = mask.expand_as(scores).sum(-1, keepdim=True)
    else:
        num_visible = torch.full((*scores.shape[:-1], 1), scores.shape[-1], dtype=torch.long)
    max_k = _max_knn_k(knn_k, scores.shape[-1])
    values, indices = torch.topk(scores, max_k, dim=-1)
    keep = resolve_knn_k(knn_k, num_visible)
    values = values.masked_fill(torch.arange(max_k) >= keep, float("-inf"))
    probs = torch.softmax(values.to(torch.promote_types(values.dtype, torch.float32)), dim=-1).to(query.dtype)
    output = (
        probs.unsqueeze(-1)
        * value.unsqueeze(2)
        .expand(-1, -1, probs.shape[2], -1, -1)
        .gather(3, indices.unsqueeze(-1).expand(-1, -1, -1, -1, value.shape[-1]))
    ).sum(-2)
    weights = torch.zeros_like(scores).scatter(-1, indices, probs)
    return output.transpose(1, 2).contiguous(), weights


def eager_attention_forward(
    module: torch.nn.Module | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention with explicit weights, the `"eager"` backend.

    Takes boolean masks (True = may attend) and transformers' additive eager masks alike; with no mask it applies the
    causal mask when the module is causal.
    """
    is_causal = _module_is_causal(module, is_causal)
    mask = _explicit_mask(attention_mask, is_causal, query.shape[2], key.shape[2], query.device)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    training = module.training if module is not None else False
    weights_dropped = F.dropout(weights, p=dropout, training=training)
    output = torch.matmul(weights_dropped, value)  # (B, H, Tq, D)
    return output.transpose(1, 2).contiguous(), weights


def shared_projection_attention_forward(
    module: torch.nn.Module | None,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The `"shared_projection"` backend: MSSA's kernel where it pays, transformers' SDPA everywhere else.

    `_SharedProjectionAttention` runs when `shared_projection_applies` (one tensor as query, key and value, a CPU
    training step of at most `SHARED_KERNEL_MAX_LENGTH` tokens, no mask, no dropout); every other call (a cache, a
    mask, inference, MHSA, longer sequences) is exactly the `"sdpa"` backend. Select it with
    `attn_implementation="shared_projection"` (`aot train` does for MSSA on CPU). Continuous batching accepts only
    the `"sdpa"`, `"paged|eager"` and flash backends.
    """
    is_causal = _module_is_causal(module, is_causal)
    if shared_projection_applies(query, key, value, attention_mask, dropout, is_causal):
        output = _SharedProjectionAttention.apply(query, scaling, is_causal)  # (B, H, T, D)
        return output.transpose(1, 2).contiguous(), None
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal)


def check_knn_k(knn_k) -> int | float:
    """Return `knn_k` as a Python int or float if it is a valid k (an int >= 1 or a float in (0, 1]); raise a
    clear error naming the value otherwise (numpy scalars are accepted)."""
    allowed = "an int >= 1 (keys kept per query) or a float in (0, 1] (the fraction of the keys a query may see)"
    if knn_k is None:
        raise ValueError(
            f"attn_implementation='knn' needs `knn_k` in the model's config: {allowed}, e.g. "
            "`from_pretrained(..., attn_implementation='knn', knn_k=0.5)`."
        )
    if isinstance(knn_k, bool) or not isinstance(knn_k, numbers.Real):
        raise TypeError(f"`knn_k` must be {allowed}, got {knn_k!r} ({type(knn_k).__name__}).")
    if isinstance(knn_k, numbers.Integral):
        if knn_k < 1:
            raise ValueError(f"`knn_k` must be {allowed}, got {knn_k}.")
        return int(knn_k)
    if not 0.0 < float(knn_k) <= 1.0:
        raise ValueError(f"`knn_k` must be {allowed}, got {knn_k}.")
    return float(knn_k)


def knn_attention_backend(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The `"knn"` backend for any transformers model: k and the chunk size from `module.config` (`knn_k`,
    `knn_chunk_size`), key/value heads repeated for grouped-query attention, then `knn_attention_forward`."""
    config = getattr(module, "config", None)
    knn_k = check_knn_k(kwargs.pop("knn_k", None) or getattr(config, "knn_k", None))
    chunk_size = kwargs.pop("knn_chunk_size", None) or getattr(config, "knn_chunk_size", None) or 256
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # GQA: (B, H_kv, Tk, D) -> (B, H, Tk, D), each key/value head serving `groups` query heads
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    return knn_attention_forward(
        module, query, key, value, attention_mask, knn_k=knn_k, knn_chunk_size=chunk_size, **kwargs
    )


# The package's backends, by the names `attn_implementation=` takes. Each is registered with transformers'
# `AttentionInterface` and with the mask function it reads in `AttentionMaskInterface` (boolean masks, as SDPA's:
# without one, transformers would build no mask at all and padding would be silently ignored).
ATTENTION_BACKENDS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor | None]]] = {
    "knn": knn_attention_backend,
    "shared_projection": shared_projection_attention_forward,
}
for _name, _backend in ATTENTION_BACKENDS.items():
    AttentionInterface.register(_name, _backend)
    AttentionMaskInterface.register(_name, sdpa_mask)


def _apply_phi(
    scores: torch.Tensor, phi: str | Callable[[torch.Tensor], torch.Tensor], mask: torch.Tensor | None
) -> torch.Tensor:
    if callable(phi):
        return phi(scores if mask is None else scores.masked_fill(~mask, float("-inf")))
    if phi == "softmax":
        return torch.softmax(scores if mask is None else scores.masked_fill(~mask, float("-inf")), dim=-1)
    if phi == "linear":
        return scores if mask is None else scores.masked_fill(~mask, 0.0)
    raise ValueError(f"`phi` must be 'softmax', 'linear' or a callable, got {phi!r}.")


def subspace_attention(
    hidden_states: torch.Tensor,
    subspaces: torch.Tensor,
    phi: str | Callable[[torch.Tensor], torch.Tensor] = "softmax",
    scaling: float = 1.0,
    attention_mask: torch.Tensor | None = None,
    knn_k: int | float | None = None,
) -> torch.Tensor:
    r"""Multi-head subspace self-attention as a function, the AoT paper's Eq. (4) with a choice of φ.

    `MSSA(Z) = Σ_k U_k U_kᵀ Z φ(scaling · Zᵀ U_k U_kᵀ Z)` with tokens as rows: for head k,
    `u = X U_k` (B, N, p), `A = scaling · u uᵀ`, output `Σ_k φ(A) u U_kᵀ`. The experiments use it with known
    subspaces: with rank-1 `U_k = μ_k` and φ linear it is the two-head clustering predictor of Maulen-Soto et al.;
    with a single `U = I` and φ linear, in-context quantization. The models' MSSA layer computes exactly this with
    `tie_output_projection=True` and without query normalisation (tested); by default it learns a separate output
    projection instead of `[U_1 … U_K]` and, in the causal LM, normalises the queries.

    Args:
        hidden_states: Tokens `X` of shape (B, N, d).
        subspaces: Bases `U_k` of shape (K, d, p) (K heads of rank p).
        phi: `"softmax"` over the keys, `"linear"` (scores used as weights), or a callable applied to the
            (B, K, N, N) score tensor (masked entries set to -inf) returning weights of the same shape.
        scaling: Factor on the scores.
        attention_mask: Boolean (B or 1, 1 or K, N, N), True where a query may attend to a key.
        knn_k: Keep only the top-k scores per query before φ (dropped scores become -inf for softmax, 0 for linear).

    Returns:
        Tensor of shape (B, N, d).
    """
    if hidden_states.dim() != 3 or subspaces.dim() != 3 or hidden_states.shape[-1] != subspaces.shape[1]:
        raise ValueError(
            f"`hidden_states` must be (B, N, d) and `subspaces` (K, d, p) with the same d; got "
            f"{tuple(hidden_states.shape)} and {tuple(subspaces.shape)}."
        )
    projected = torch.einsum("bnd,kdp->bknp", hidden_states, subspaces)  # (B, K, N, p)
    scores = scaling * torch.matmul(projected, projected.transpose(-1, -2))  # (B, K, N, N)
    mask = attention_mask
    if knn_k is not None:
        masked = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
        max_k = _max_knn_k(knn_k, scores.shape[-1])
        num_visible = (
            mask.expand_as(scores).sum(-1, keepdim=True)
            if mask is not None
            else torch.full((*scores.shape[:-1], 1), scores.shape[-1], dtype=torch.long)
        )
        _, indices = torch.topk(masked, max_k, dim=-1)  # sorted: rank r holds the (r+1)-th best key
        kept = torch.arange(max_k, device=scores.device) < resolve_knn_k(knn_k, num_visible)
        topk_mask = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, indices, kept.expand_as(indices))
        mask = topk_mask if mask is None else mask & topk_mask
    weights = _apply_phi(scores, phi, mask)
    mixed = torch.matmul(weights.to(projected.dtype), projected)  # (B, K, N, p)
    return torch.einsum("bknp,kdp->bnd", mixed, subspaces)


__all__ = [
    "ATTENTION_BACKENDS",
    "SHARED_KERNEL_MAX_LENGTH",
    "check_knn_k",
    "eager_attention_forward",
    "knn_attention_backend",
    "knn_attention_forward",
    "knn_attention_reference",
    "resolve_knn_k",
    "shared_projection_attention_forward",
    "subspace_attention",
]
