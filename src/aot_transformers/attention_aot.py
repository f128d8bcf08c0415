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
others to -inf and takes the softmax (KVT, Wang et al., https://arxiv.org/abs/2106.00515). The tie rule, used by
every k-NN path of this file (chunked kernel, its backward, the one-piece path for weights and export, the
reference): a query keeps exactly min(k, visible keys) keys — with a fractional k, min(ceil(k · visible), visible)
and at least 1 — and where several keys tie at the k-th largest score, the ones with the lowest key index are kept.
Memory: the kernel runs in chunks of `knn_chunk_size` queries and its backward recomputes each chunk's scores from
two numbers saved per query (the k-th score and, where keys tie at it, a cutoff), so forward + backward use
O(knn_chunk_size · Tk + T · D) memory per head for every k, integer or fractional; only `output_attentions`
materialises the (Tq, Tk) weights.

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


def _topk_scores(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Unsorted top-k values along the last dim, faster than a plain `torch.topk` on CPU for small k.

    The top-k elements of a row all lie in the k groups (of `_TWO_STAGE_GROUP` neighbours) with the largest
    maxima: an element outside them is beaten by k group maxima. So a top-k over the group maxima, a gather of
    those groups and a top-k over k·group candidates give the exact result while touching the full row only once,
    with a cheap max reduction.
    """
    n = scores.shape[-1]
    group = _TWO_STAGE_GROUP
    if n % group != 0 or n < 4 * group * k:
        return torch.topk(scores, k, dim=-1, sorted=False)[0]
    grouped = scores.unflatten(-1, (n // group, group))  # (..., G, S)
    _, top_groups = torch.topk(grouped.amax(dim=-1), k, dim=-1, sorted=False)  # (..., k)
    candidate_idx = (top_groups.unsqueeze(-1) * group + torch.arange(group, device=scores.device)).flatten(-2)
    return torch.topk(scores.gather(-1, candidate_idx), k, dim=-1, sorted=False)[0]  # (..., k) of k·S candidates


def _order_bits(values: torch.Tensor) -> torch.Tensor:
    """Integers with the order of the floats `values` (and, applied to those integers, the floats' bits back).

    Negative floats order their magnitude bits backwards, so those bits are flipped; `topk` of a large k on the
    integers is about 1.5x faster on CPU than on the floats. -0.0 lands just below +0.0; as floats they compare
    equal, and the k-th largest integer maps back to the k-th largest float either way.
    """
    if values.is_floating_point():
        values = values.view({8: torch.int64, 4: torch.int32}[values.element_size()])
    shift = values.element_size() * 8 - 1
    return (values >> shift).bitwise_and_((1 << shift) - 1).bitwise_xor_(values)


def _knn_keep(
    scores: torch.Tensor, mask: torch.Tensor | None, knn_k: int | float, max_k: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The keys each query keeps, by the module docstring's rule, and the O(1)-per-query statistics that redo it.

    Args:
        scores: (B, H, C, Tk) scores of a chunk of queries, masked keys at -inf. Left unchanged.
        mask: Boolean (B, H, C, Tk), True where a query may attend, or None.
        knn_k: As in `resolve_knn_k`.
        max_k: The largest number of keys a query of this chunk keeps (`_max_knn_k`), or None to select with a
            full sort and no data-dependent branch (for `torch.export`, where it is a symbolic expression).

    Returns:
        `rejected` (B, H, C, Tk) boolean, True for the keys not kept (masked ones included), `threshold`
        (B, H, C, 1), the k-th largest visible score, and `cutoff` (B, H, C, 1) or None: the kept keys are
        `(scores > threshold) | ((scores == threshold) & (key index <= cutoff))`, which is how the backward
        rebuilds them from recomputed scores (`_rejected_by_threshold`).
    """
    num_keys = scores.shape[-1]
    if mask is not None:
        num_visible = mask.sum(dim=-1, keepdim=True)  # (B, H, C, 1)
    else:
        num_visible = torch.full_like(scores[..., :1], num_keys, dtype=torch.long)
    keep = resolve_knn_k(knn_k, num_visible)
    if max_k is None:  # export: a sort of the floats themselves (ONNX has no bit-reinterpreting view)
        ordered, _ = torch.sort(scores, dim=-1, descending=True)
        threshold = ordered.gather(-1, keep - 1)  # (B, H, C, 1)
        del ordered
    elif max_k >= num_keys:  # every visible key is kept
        threshold = scores.masked_fill(scores == float("-inf"), float("inf")).amin(dim=-1, keepdim=True)
        return scores < threshold, threshold, None
    else:
        # Small k: two-stage top-k on the floats; large k: one top-k on the order-preserving integers.
        two_stage = num_keys % _TWO_STAGE_GROUP == 0 and num_keys >= 4 * _TWO_STAGE_GROUP * (max_k + 1)
        order = scores if two_stage else _order_bits(scores)  # (B, H, C, Tk)
        extra = max_k - keep  # the top-max_k's smallest is the keep-th largest once `extra` fake maxima are added
        if mask is not None and bool((extra > 0).any()):
            # `extra` never exceeds the masked keys of a row (min and ceil are 1-Lipschitz): promote the first ones.
            hidden = ~mask
            top_value = float("inf") if two_stage else torch.iinfo(order.dtype).max
            order = order.masked_fill(hidden & (hidden.cumsum(dim=-1) <= extra), top_value)
            del hidden
        # The (k+1)-th largest tells whether more keys than k tie at the k-th: no full-row count is needed.
        top = _topk_scores(order, max_k + 1)  # (B, H, C, k + 1)
        del order
        last_two = top.topk(2, dim=-1, largest=False, sorted=True)[0]
        if not two_stage:
            last_two = _order_bits(last_two).view(scores.dtype)
        del top
        threshold, following = last_two[..., 1:], last_two[..., :1]  # (B, H, C, 1) each
        tie_rows = (following == threshold).flatten()
        if not bool(tie_rows.any()):
            return scores < threshold, threshold, None
        # Ties beyond k are rare (float32 collisions near the k-th score: a few rows in 10^5): resolve only them.
        tie_rows = tie_rows.nonzero().squeeze(1)
    keep = keep.expand(threshold.shape)
    if max_k is None:  # every row, with no data-dependent shape
        cutoff = _tie_cutoff(scores, threshold, keep)
    else:
        flat = lambda tensor: tensor.reshape(-1, tensor.shape[-1])  # (B·H·C, ·)
        cutoff = torch.full_like(threshold, num_keys, dtype=torch.long)  # rows without excess ties keep them all
        flat(cutoff)[tie_rows] = _tie_cutoff(flat(scores)[tie_rows], flat(threshold)[tie_rows], flat(keep)[tie_rows])
    return _rejected_by_threshold(scores, threshold, cutoff), threshold, cutoff


def _tie_cutoff(scores: torch.Tensor, threshold: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Index of the last key kept among those tied at `threshold`, for rows of `scores` (..., Tk) keeping `keep`."""
    excess = (scores >= threshold).sum(dim=-1, keepdim=True) - keep  # > 0 where more keys than kept tie
    tied = scores == threshold
    # The last tied key kept is the (tied - excess)-th one by key index: its position is the number of key
    # positions whose running count of tied keys is still below that.
    wanted = tied.sum(dim=-1, keepdim=True) - excess
    return (tied.cumsum(dim=-1) < wanted).sum(dim=-1, keepdim=True)


def _rejected_by_threshold(scores: torch.Tensor, threshold: torch.Tensor, cutoff: torch.Tensor | None) -> torch.Tensor:
    """The keys `_knn_keep` did not keep, rebuilt from its statistics."""
    if cutoff is None:
        return scores < threshold
    positions = torch.arange(scores.shape[-1], device=scores.device)
    return (scores < threshold) | ((scores == threshold) & (positions > cutoff))


def _chunk_scores(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """Scores of a chunk of queries in at least float32, masked keys at -inf; the backward recomputes them with
    this same function, so they match the forward's bit for bit."""
    scores = torch.matmul(query * scaling, key.transpose(-1, -2))  # (B, H, C, Tk)
    if scores.dtype not in (torch.float32, torch.float64):
        scores = scores.float()
    if mask is not None and mask.numel() < scores.numel():
        # A mask shared by the batch and heads (the implied causal one): adding a -inf bias is much faster on CPU
        # than `masked_fill_` with a broadcast boolean.
        scores.add_(torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device).masked_fill_(~mask, -math.inf))
    elif mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    return scores


def _reject(scores: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """In place, push the rejected scores so low that their softmax weight is exactly 0.

    Adding -1e30 (exp underflows to 0 for any score above -1e29) is about 5x faster on CPU than `masked_fill_`.
    """
    return scores.add_(rejected, alpha=-1e30)


def _dropout_generator(seed: int, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def _chunk_keys(
    mask: torch.Tensor | None, causal_offset: int | None, start: int, stop: int, num_keys: int, device: torch.device
) -> tuple[int, torch.Tensor | None]:
    """The number of leading keys that queries start:stop may see, and their mask (None: all of them).

    With an implied causal mask (`causal_offset`: query i sees keys up to i + offset) the chunk scores only the
    keys up to its last query's, about half the work, and builds its (C, Tk) mask rather than reading a (Tq, Tk) one.
    """
    if causal_offset is None:
        return num_keys, None if mask is None else mask[:, :, start:stop]
    end = min(num_keys, stop + causal_offset)
    rows = torch.arange(start, stop, device=device)[:, None] + causal_offset
    return end, (torch.arange(end, device=device) <= rows)[None, None]  # (1, 1, C, Tk')


class _KnnAttentionFunction(torch.autograd.Function):
    """Chunked exact k-NN attention whose backward recomputes each chunk's scores (as flash attention does).

    The forward keeps, per query, the k-th largest visible score (`threshold`) and, where more keys tie at it than
    are kept, a tie cutoff: at most two numbers per query. The backward recomputes the chunk's scores with the same
    function, rebuilds the kept set from the threshold (no top-k) and the probabilities with the same softmax. Peak
    memory is a few (B, H, C, Tk) chunk buffers plus the (B, H, T, D) inputs, output and gradients:
    O(C · Tk + T · D) for every k, integer or fractional.
    """

    @staticmethod
    def forward(ctx, query, key, value, mask, causal_offset, scaling, knn_k, chunk_size, dropout, seed):
        batch, heads, q_len, _ = query.shape
        num_keys = key.shape[-2]
        stat_dtype = torch.promote_types(query.dtype, torch.float32)
        output = query.new_empty(batch, heads, q_len, value.shape[-1])
        thresholds = torch.empty(batch, heads, q_len, 1, dtype=stat_dtype, device=query.device)
        cutoffs = None
        generator = _dropout_generator(seed, query.device) if dropout > 0.0 else None
        for start in range(0, q_len, chunk_size):
            stop = min(start + chunk_size, q_len)
            end, chunk_mask = _chunk_keys(mask, causal_offset, start, stop, num_keys, query.device)
            scores = _chunk_scores(query[:, :, start:stop], key[:, :, :end], chunk_mask, scaling)  # (B, H, C, Tk')
            rejected, threshold, cutoff = _knn_keep(scores, chunk_mask, knn_k, _max_knn_k(knn_k, end))
            thresholds[:, :, start:stop] = threshold
            if cutoff is not None:
                if cutoffs is None:  # the key count: rows without excess ties keep every tied key
                    cutoffs = torch.full_like(thresholds, num_keys, dtype=torch.long)
                cutoffs[:, :, start:stop] = cutoff
            probs = torch.softmax(_reject(scores, rejected), dim=-1)  # (B, H, C, Tk')
            del rejected, scores
            if generator is not None:
                probs.mul_(torch.rand(probs.shape, device=probs.device, generator=generator) >= dropout)
                probs.div_(1.0 - dropout)
            output[:, :, start:stop] = torch.matmul(probs.to(value.dtype), value[:, :, :end])
            del probs
        ctx.save_for_backward(query, key, value, mask, thresholds, cutoffs)
        ctx.causal_offset, ctx.scaling, ctx.chunk_size = causal_offset, scaling, chunk_size
        ctx.dropout, ctx.seed = dropout, seed
        return output

    @staticmethod
    def backward(ctx, grad_output):
        query, key, value, mask, thresholds, cutoffs = ctx.saved_tensors
        dropout = ctx.dropout
        generator = _dropout_generator(ctx.seed, query.device) if dropout > 0.0 else None
        grad_query = torch.empty_like(query)
        grad_key = torch.zeros_like(key)
        grad_value = torch.zeros_like(value)
        for start in range(0, query.shape[2], ctx.chunk_size):
            stop = min(start + ctx.chunk_size, query.shape[2])
            chunk_query = query[:, :, start:stop]
            end, chunk_mask = _chunk_keys(mask, ctx.causal_offset, start, stop, key.shape[-2], query.device)
            chunk_key, chunk_value = key[:, :, :end], value[:, :, :end]
            scores = _chunk_scores(chunk_query, chunk_key, chunk_mask, ctx.scaling)  # (B, H, C, Tk'), as forward
            cutoff = None if cutoffs is None else cutoffs[:, :, start:stop]
            rejected = _rejected_by_threshold(scores, thresholds[:, :, start:stop], cutoff)
            probs = torch.softmax(_reject(scores, rejected), dim=-1)  # the forward's P
            del rejected, scores
            grad_out = grad_output[:, :, start:stop]  # (B, H, C, D)
            grad_probs = torch.matmul(grad_out, chunk_value.transpose(-1, -2)).to(probs.dtype)  # (B, H, C, Tk')
            if generator is not None:
                # The forward's dropout mask, drawn again from the same seed: the output used P ∘ M / (1 - p).
                dropped = torch.rand(probs.shape, device=probs.device, generator=generator) >= dropout
                dropped = dropped.to(probs.dtype).div_(1.0 - dropout)
                grad_value[:, :, :end] += torch.matmul((probs * dropped).to(value.dtype).transpose(-1, -2), grad_out)
                grad_probs.mul_(dropped)
                del dropped
            else:
                grad_value[:, :, :end] += torch.matmul(probs.to(value.dtype).transpose(-1, -2), grad_out)
            # Softmax backward dS = P ∘ (dP - rowsum(P ∘ dP)); the scores' scaling goes on the (C, D) products.
            grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype).to(query.dtype)
            del probs, grad_probs
            grad_query[:, :, start:stop] = torch.matmul(grad_scores, chunk_key).mul_(ctx.scaling)
            grad_key[:, :, :end] += torch.matmul(grad_scores.transpose(-1, -2), chunk_query * ctx.scaling)
            del grad_scores
        return grad_query, grad_key, grad_value, None, None, None, None, None, None, None


def _knn_attention_dense(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    knn_k: int | float,
    dropout: float,
    generator: torch.Generator | None,
    max_k: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """k-NN attention in one piece through autograd, returning (B, H, Tq, D) output and (B, H, Tq, Tk) weights.

    Used when the weights are requested (they then carry gradients to the query and key, as dense attention's do)
    and under `torch.export` (one chunk, `max_k=None`: a sort instead of a top-k of symbolic size, no branch on
    data). The kept set is the same as the chunked kernel's.
    """
    scores = torch.matmul(query * scaling, key.transpose(-1, -2))  # (B, H, Tq, Tk)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    with torch.no_grad():
        rejected = _knn_keep(scores.detach(), mask, knn_k, max_k)[0]
    weights = torch.softmax(scores.masked_fill(rejected, float("-inf")), dim=-1).to(query.dtype)
    dropped = weights
    if dropout > 0.0:
        dropped = weights * (torch.rand(weights.shape, device=weights.device, generator=generator) >= dropout)
        dropped = dropped / (1.0 - dropout)
    return torch.matmul(dropped, value), weights


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

    Forward + backward memory is O(`knn_chunk_size` · Tk + T · D) for every k: the backward recomputes each
    chunk's scores from three saved numbers per query instead of saving the kept keys. `knn_k` defaults to
    `module.config.knn_k`. With `output_attentions`, the kernel computes the (B, H, Tq, Tk) weights in one piece
    and returns them differentiable (a loss on them trains the query and key, as with dense attention); the weights
    are before dropout, as in `eager_attention_forward`. Under `torch.export` it runs as one chunk, with no Python
    branch on the sequence length or on data. `generator` seeds the dropout mask.
    """
    if knn_k is None:
        knn_k = module.config.knn_k
    if knn_chunk_size is None:
        knn_chunk_size = getattr(getattr(module, "config", None), "knn_chunk_size", None) or 256
    is_causal = _module_is_causal(module, is_causal)
    exporting = torch.compiler.is_exporting()
    if output_attentions or exporting:
        mask = _explicit_mask(attention_mask, is_causal, query.shape[2], key.shape[2], query.device)
        if mask is not None:
            mask = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        max_k = None if exporting else _max_knn_k(knn_k, key.shape[2])
        output, weights = _knn_attention_dense(query, key, value, mask, scaling, knn_k, dropout, generator, max_k)
        return output.transpose(1, 2).contiguous(), weights if output_attentions else None
    causal_offset = None
    if attention_mask is None and is_causal and query.shape[2] > 1:  # built chunk by chunk, never (Tq, Tk)
        causal_offset = key.shape[2] - query.shape[2]
    mask = _ensure_visible_key(_boolean_mask(attention_mask))
    if mask is not None:
        mask = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    seed = 0
    if dropout > 0.0:  # the backward redraws the forward's dropout mask from this seed
        seed = int(torch.randint(0, 2**62, (), generator=generator, device=generator.device if generator else "cpu"))
    output = _KnnAttentionFunction.apply(
        query, key, value, mask, causal_offset, scaling, knn_k, knn_chunk_size, dropout, seed
    )
    return output.transpose(1, 2).contiguous(), None


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
    """Slow reference k-NN attention (full score matrix, stable sort, gather), written from the module docstring's
    rule alone. For tests only; ignores dropout."""
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
    # A stable descending sort lists tied scores by key index: the first `keep` entries are the kept keys.
    values, indices = torch.sort(scores, dim=-1, descending=True, stable=True)
    keep = resolve_knn_k(knn_k, num_visible)
    values = values.masked_fill(torch.arange(scores.shape[-1]) >= keep, float("-inf"))
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
    if knn_k is not None:  # the module docstring's tie rule, as in the k-NN kernel
        full_mask = None if mask is None else mask.expand_as(scores)
        masked = scores if mask is None else scores.masked_fill(~full_mask, float("-inf"))
        with torch.no_grad():
            rejected, _, _ = _knn_keep(masked.detach(), full_mask, knn_k, _max_knn_k(knn_k, scores.shape[-1]))
        mask = ~rejected
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
