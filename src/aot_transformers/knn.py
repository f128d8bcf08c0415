"""k-NN attention for any transformers model (KVT, Wang et al., https://arxiv.org/abs/2106.00515): the package's
exact, chunked kernel.

KVT's claim is that keeping each query's k best keys is a drop-in for the attention of *any* transformer. Importing
this module (or `aot_transformers`) registers the kernel below in transformers' public `AttentionInterface` under the
name `"knn"`, with its mask function (boolean masks, as SDPA's) in `AttentionMaskInterface` — without the latter,
transformers would build no mask and silently ignore padding. Nothing else of transformers changes. Every model whose
attention goes through `ALL_ATTENTION_FUNCTIONS` then runs k-NN attention with one call:

    from aot_transformers.knn import use_knn_attention
    model = use_knn_attention(AutoModelForCausalLM.from_pretrained(name_or_folder), knn_k=0.5)

or, equivalently, with `config.knn_k` set and `attn_implementation="knn"` (the kernel then checks `knn_k` at the
first forward). `knn_k` is read from the model's config: an int keeps that many keys per query, a float in (0, 1]
keeps `ceil(knn_k * n)` of the `n` keys a query may see (the paper's rule of thumb is n/2). Exactly min(k, visible
keys) keys are kept (the lowest positions among keys tied at the k-th score: the rule of `attention_aot`'s
docstring). Causal and bidirectional models, padding, grouped-query attention (fewer key/value heads), KV caches,
soft-capping (Gemma 2), sinks (GPT-OSS) and position biases (T5) all work; `knn_chunk_size` (default 256) caps how
many queries are scored at once.

AoT models run this kernel too when the package is imported: their own file (`attention_aot`, the remote-code unit)
holds an exact reference computed in one piece, which a folder loaded without the package runs — the same values and
gradients, with memory quadratic in the length as eager attention's. This kernel runs in chunks of queries sized by a
byte budget; its backward reads the kept keys saved per query (small integer k) or recomputes each chunk from four
numbers saved per query: memory O(chunk · Tk + T · (D + k)) per head, and no step reads a tensor value into Python.
Shapes: `query` (B, H, Tq, D), `key`/`value` (B, Hkv, Tk, D), C a chunk of queries.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .attention_aot import _is_causal, _keep, _masks, knn_kept_mask, resolve_knn_k
from .configuration_aot import check_knn_k, check_number

KNN_ATTENTION = "knn"
_TWO_STAGE_GROUP = 4  # keys per group of `_top_width`'s two-stage top-k (benchmarks/README.md, k-NN kernel)
# Bytes of (B, H, C, Tk) temporaries a chunk of C queries may hold, as `_KNN_CHUNK_BUFFERS` score-sized buffers: this
# sets C on every device (`knn_chunk_size` caps it; benchmarks/README.md, k-NN kernel).
_KNN_CHUNK_BUDGET, _KNN_CHUNK_BUFFERS = 32 * 2**20, 4
_GROUP = 32  # keys per group of `_nth_one`'s first binary search
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64}  # the integers `_ordered` reads each float width as


def _ordered(bits: Tensor) -> Tensor:
    """float32/64 bits (as same-width integers) as integers in the float order, except -0.0 just below +0.0 (a
    refinement: ties are resolved on the float scores), and back (the map is its own inverse): CPU `topk` compares
    integers faster than floats. A negative float's magnitude bits are flipped: a larger integer is a larger float."""
    flips = bits >> (8 * bits.element_size() - 1)
    return flips.bitwise_and_(torch.iinfo(bits.dtype).max).bitwise_xor_(bits)


def _top_width(scores: Tensor, visible: Tensor | None, keep: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """Indices of the `width` (< Tk) largest of a chunk's (B, H, C, Tk) scores, each query's `keep`-th largest
    visible score and how many of the keys it keeps tie at that score, (B, H, C, 1) each. A query that keeps fewer
    than `width` keys gets `width - keep` of its hidden keys promoted to +inf, so that the width-th largest is its
    keep-th largest visible score; that many hidden keys exist (min and ceil are 1-Lipschitz). For a small width,
    the top entries of a row all lie in the `width` groups (of `_TWO_STAGE_GROUP` neighbours) with the largest
    maxima: a top-k of the maxima, then of their entries."""
    num_keys, promoted, candidates = scores.shape[-1], None, None
    if visible is not None:
        hidden = ~visible
        promoted = hidden & (hidden.cumsum(dim=-1, dtype=torch.int32) <= width - keep)
    if num_keys % _TWO_STAGE_GROUP != 0 or num_keys < 4 * _TWO_STAGE_GROUP * width:
        order = _ordered(scores.view(_BITS[scores.dtype]))
    else:
        maxima = scores.unflatten(-1, (-1, _TWO_STAGE_GROUP)).amax(dim=-1)  # (B, H, C, Tk / group)
        if promoted is not None:
            maxima = maxima.masked_fill(promoted.unflatten(-1, (-1, _TWO_STAGE_GROUP)).any(dim=-1), math.inf)
        groups = torch.topk(maxima, width, dim=-1, sorted=False)[1].unsqueeze(-1) * _TWO_STAGE_GROUP
        candidates = (groups + torch.arange(_TWO_STAGE_GROUP, device=scores.device)).flatten(-2)
        order = _ordered(scores.gather(-1, candidates).view(_BITS[scores.dtype]))  # (B, H, C, width · group)
        if promoted is not None:
            promoted = promoted.expand(*scores.shape[:-1], num_keys).gather(-1, candidates)
    if promoted is not None:
        order.masked_fill_(promoted, torch.iinfo(order.dtype).max)
    values, indices = torch.topk(order, width, dim=-1, sorted=False)
    indices = indices if candidates is None else candidates.gather(-1, indices)
    least = values.amin(dim=-1, keepdim=True)  # the threshold's integer, and how many of the top width tie at it
    tied = torch.eq(values, least, out=torch.empty_like(values, dtype=scores.dtype))  # a bool sum would cast
    return indices, _ordered(least).view(scores.dtype), tied.sum(dim=-1, keepdim=True)


def _knn_threshold(
    scores: Tensor, visible: Tensor | None, knn_k: int | float, max_k: int
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Two numbers per query of a chunk's (B, H, C, Tk) `scores` (hidden keys at -inf; `visible` a boolean mask or
    None) that give the keys it keeps by the rule of `attention_aot`'s docstring: `threshold`, the k-th largest visible
    score, and `cutoff`, the index of the last key kept among those tied at it (None: every visible key is kept),
    (B, H, C, 1) each, and their `_kept_mask`. `max_k`: `resolve_knn_k(knn_k, Tk)`."""
    if max_k >= scores.shape[-1]:  # every visible key is kept
        threshold = scores.masked_fill(scores == -math.inf, math.inf).amin(dim=-1, keepdim=True)
        return threshold, None, _kept_mask(scores, threshold, None)
    # The kept tied keys are the first `kept_tied` of them by key index (float counts: exact below 2**24 keys).
    threshold, kept_tied = _top_width(scores, visible, _keep(knn_k, scores, visible), max_k)[1:]
    cutoff = _nth_one(torch.eq(scores, threshold, out=torch.empty_like(scores)), kept_tied)
    return threshold, cutoff, _kept_mask(scores, threshold, cutoff)


def _nth_one(ones: Tensor, nth: Tensor) -> Tensor:
    """Index of the `nth` one (float, 1-based, (B, H, C, 1)) of each row of the float 0/1 `ones` (B, H, C, Tk): a
    binary search in the running count of its groups of `_GROUP` keys, then in the found group's. (A running count of
    the whole row is a sequential pass, slower than the group sums and small searches.)"""
    groups = ones.unflatten(-1, (-1, _GROUP if ones.shape[-1] % _GROUP == 0 else ones.shape[-1]))  # (.., Tk/G, G)
    counts = groups.sum(dim=-1)
    running = counts.cumsum(dim=-1)
    group = torch.searchsorted(running, nth).clamp_(max=counts.shape[-1] - 1)  # (B, H, C, 1)
    within = groups.gather(-2, group.unsqueeze(-1).expand(*group.shape, groups.shape[-1])).squeeze(-2)
    nth = nth - (running - counts).gather(-1, group)  # its rank within the group
    return group * groups.shape[-1] + torch.searchsorted(within.cumsum_(dim=-1), nth)


def _kept_mask(scores: Tensor, threshold: Tensor, cutoff: Tensor | None) -> Tensor:
    """The keys kept by `_knn_threshold`'s statistics as floats, 1 kept and 0 not: one comparison with a per-key
    threshold, `threshold` up to the `cutoff` and the next float past it. The step to it is never 0 (a denormal
    flushed to zero: then the least normal float, as the flushed scores tie) nor inf (0 · inf is NaN). One fresh
    (C, Tk) buffer: on CPU each costs page faults, and a comparison writes floats faster than bools."""
    if cutoff is not None:
        positions = torch.arange(scores.shape[-1], device=scores.device, dtype=scores.dtype)  # exact below 2**24 keys
        step = torch.nextafter(threshold, threshold.new_tensor(math.inf)) - threshold
        step = torch.where(step > 0, step, torch.finfo(scores.dtype).tiny).clamp_(max=torch.finfo(scores.dtype).max)
        threshold = torch.gt(positions, cutoff, out=torch.empty_like(scores)).mul_(step).add_(threshold)
    return torch.ge(scores, threshold, out=torch.empty_like(scores) if cutoff is None else threshold)


def _knn_kept_keys(scores: Tensor, visible: Tensor | None, knn_k: int | float, width: int) -> tuple[Tensor, Tensor]:
    """The keys each query keeps as indices, and their scores, (B, H, C, width) each; a query that keeps fewer fills
    the other slots with hidden keys (at -inf). `topk` returns some of the keys tied at the k-th score: their slots
    get the lowest-index tied keys instead (the rule), by a binary search in the running count of the tied keys."""
    if width >= scores.shape[-1]:
        return torch.arange(scores.shape[-1], device=scores.device).expand(scores.shape), scores
    indices, threshold, _ = _top_width(scores, visible, _keep(knn_k, scores, visible), width)
    kept_scores = scores.gather(-1, indices)
    tied = kept_scores == threshold  # as many slots as kept tied keys
    running = torch.eq(scores, threshold, out=torch.empty_like(scores)).cumsum_(dim=-1)  # exact below 2**24 keys
    lowest = torch.searchsorted(running, tied.cumsum(dim=-1, dtype=running.dtype))
    return torch.where(tied, lowest, indices), kept_scores


def _scores(
    query: Tensor, key: Tensor, visible: Tensor | None, bias: Tensor | None, scaling: float, softcap: float | None
) -> Tensor:
    """Attention scores in at least float32, as eager attention forms them: scaled products, soft-capping
    (`softcap · tanh(s / softcap)`, Gemma 2), an additive bias, and -inf where a query may not attend. The chunked
    backward recomputes them with this same function, so they match the forward's bit for bit."""
    scores = torch.matmul(query * scaling, key.transpose(-1, -2))  # (B, H, C, Tk)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:  # in place, unless the bias broadcasts the scores to a larger shape
        in_place = torch.broadcast_shapes(scores.shape, bias.shape) == scores.shape
        scores = scores.add_(bias) if in_place else scores + bias
    if visible is not None:
        scores = scores.masked_fill_(~visible, -math.inf)
    return scores


def _softmax(scores: Tensor, sinks: Tensor | None) -> Tensor:
    """Softmax over the keys; attention sinks (GPT-OSS, one logit per head) take probability mass and no value."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sink = sinks.to(scores.dtype).reshape(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]


def _kept_softmax(
    scores: Tensor, sinks: Tensor | None, kept: Tensor, top: Tensor | None = None, total: Tensor | None = None
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """In place of `scores`, the softmax over the keys where the float mask `kept` is 1 (a product: cheaper than a
    masked fill) and the sinks, as exp(s - top) and its `top` (the largest visible score: always kept) and `total`,
    (B, H, C, 1); the forward divides its (C, D) output by `total`. Given the forward's: P (four passes, no sum)."""
    if top is not None:
        return scores.sub_(top).exp_().mul_(kept).div_(total)
    sink = None if sinks is None else sinks.to(scores.dtype).reshape(1, -1, 1, 1)
    top = scores.amax(dim=-1, keepdim=True)
    top = top if sink is None else torch.maximum(top, sink)
    weights = scores.sub_(top).exp_().mul_(kept)
    return weights, top, weights.sum(dim=-1, keepdim=True) + (0.0 if sink is None else (sink - top).exp())


def _chunks(
    visible: Tensor | None, bias: Tensor | None, causal: bool, query: Tensor, key: Tensor, chunk_size: int
) -> Iterator[tuple[int, int, int, Tensor | None, Tensor | None]]:
    """Per chunk of queries start:stop: (start, stop, end, visible, bias), with `end` the leading keys they may see.
    With the implied causal mask (query i sees keys 0..i) a chunk scores only those, and builds its (C, Tk') mask."""
    for start in range(0, query.shape[2], chunk_size):
        stop = min(start + chunk_size, query.shape[2])
        end = min(key.shape[2], stop) if causal else key.shape[2]
        chunk_visible = None if visible is None else visible[:, :, start:stop]
        if causal:
            rows = torch.arange(start, stop, device=query.device)[:, None]
            chunk_visible = (torch.arange(end, device=query.device) <= rows)[None, None]  # (1, 1, C, Tk')
        yield start, stop, end, chunk_visible, None if bias is None else bias[:, :, start:stop, :end]


def _saves_kept_keys(knn_k: int | float, max_k: int, head_dim: int, softcap: float | None, dropout: float) -> bool:
    """Whether the backward reads each query's kept keys (int32 indices and probabilities, saved by the forward)
    instead of recomputing the scores: for an integer k of at most the head width (then at most twice the query's
    bytes: linear in the length), without soft-capping or dropout (whose backward needs more)."""
    return isinstance(knn_k, int) and max_k <= head_dim and softcap is None and dropout == 0.0


class _KnnAttentionFunction(torch.autograd.Function):
    """Chunked exact k-NN attention whose backward holds no (Tq, Tk) tensor (as flash attention). For a small integer
    k (`_saves_kept_keys`) the forward saves each query's kept keys and probabilities, (B, H, Tq, k); otherwise the
    k-th largest visible score, a tie cutoff and the softmax's maximum and total, from which the backward recomputes
    the chunk's scores, kept set (no top-k) and probabilities. Dropout masks are drawn again from the saved state."""

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        visible: Tensor | None,
        bias: Tensor | None,
        sinks: Tensor | None,
        causal: bool,
        scaling: float,
        softcap: float | None,
        knn_k: int | float,
        chunk_size: int,
        dropout: float,
        rng: torch.Generator | None,
    ) -> Tensor:
        (batch, heads, q_len, _), num_keys = query.shape, key.shape[-2]
        stat_dtype = torch.promote_types(query.dtype, torch.float32)
        max_k = resolve_knn_k(knn_k, num_keys)
        save_kept = _saves_kept_keys(knn_k, max_k, query.shape[-1], softcap, dropout)
        per_query = batch * heads * num_keys * stat_dtype.itemsize * _KNN_CHUNK_BUFFERS  # `chunk_size` caps the chunks
        chunk_size = max(1, min(chunk_size, _KNN_CHUNK_BUDGET // max(1, per_query)))
        output = query.new_empty(batch, heads, q_len, value.shape[-1])
        # Saved per query: the kept keys' indices and probabilities, or threshold, tie cutoff, softmax maximum, total.
        width = max_k if save_kept else 1
        stats = [query.new_empty(batch, heads, q_len, width, dtype=dtype) for dtype in (torch.int32, stat_dtype)]
        stats = stats if save_kept else [*stats[::-1], torch.empty_like(stats[1]), torch.empty_like(stats[1])]
        generator = None
        if dropout > 0.0:  # the backward replays the masks from the generator's state at the start
            generator = rng or torch.default_generator
            if rng is None and query.device.type != "cpu":  # the device's global generator
                generator = torch.get_device_module(query.device.type).default_generators[query.device.index or 0]
            ctx.rng_state = generator.get_state()
        for start, stop, end, chunk_visible, chunk_bias in _chunks(visible, bias, causal, query, key, chunk_size):
            scores = _scores(query[:, :, start:stop], key[:, :, :end], chunk_visible, chunk_bias, scaling, softcap)
            width, total = resolve_knn_k(knn_k, end), None
            if save_kept:
                indices, kept_scores = _knn_kept_keys(scores, chunk_visible, knn_k, width)
                probs = _softmax(kept_scores, sinks)  # (B, H, C, width)
                stats[0][:, :, start:stop, :width], stats[1][:, :, start:stop, :width] = indices, probs
                probs = scores.zero_().scatter_(-1, indices, probs)  # (B, H, C, Tk')
            else:
                threshold, cutoff, kept = _knn_threshold(scores, chunk_visible, knn_k, width)
                probs, top, total = _kept_softmax(scores, sinks, kept)  # P = probs / total
                chunk_stats = (threshold, end if cutoff is None else cutoff, top, total)
                for stat, chunk_stat in zip(stats, chunk_stats, strict=True):
                    stat[:, :, start:stop] = chunk_stat
            del scores
            if generator is not None:
                probs = probs * (torch.rand(probs.shape, device=probs.device, generator=generator) >= dropout)
                probs = probs / (1.0 - dropout)
            chunk_output = torch.matmul(probs.to(value.dtype), value[:, :, :end])
            output[:, :, start:stop] = chunk_output if total is None else chunk_output / total
            del probs
        ctx.save_for_backward(query, key, value, visible, bias, sinks, output, *stats)
        ctx.options = causal, scaling, softcap, knn_k, chunk_size, dropout, save_kept
        return output

    @staticmethod
    def backward(ctx: FunctionCtx, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        query, key, value, visible, bias, sinks, output, *stats = ctx.saved_tensors
        causal, scaling, softcap, knn_k, chunk_size, dropout, save_kept = ctx.options
        generator = torch.Generator(device=query.device).set_state(ctx.rng_state) if dropout > 0.0 else None
        grad_query, grad_key, grad_value = torch.empty_like(query), torch.zeros_like(key), torch.zeros_like(value)
        grad_bias = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[4] else None
        stat_dtype = torch.promote_types(query.dtype, torch.float32)
        grad_sinks = torch.zeros_like(sinks, dtype=stat_dtype) if ctx.needs_input_grad[5] else None
        # The softmax backward is dS = P ∘ (dP - rowsum(P ∘ dP)), and rowsum(P ∘ dP) = rowsum(dO ∘ O) (as flash
        # attention): a (T, D) product in place of a (C, Tk) one per chunk. A sink has no value, so its dP is 0.
        rows = (grad_output.to(stat_dtype) * output.to(stat_dtype)).sum(dim=-1, keepdim=True)  # (B, H, Tq, 1)
        for start, stop, end, chunk_visible, chunk_bias in _chunks(visible, bias, causal, query, key, chunk_size):
            chunk_query, chunk_key, chunk_value = query[:, :, start:stop], key[:, :, :end], value[:, :, :end]
            grad_out, row = grad_output[:, :, start:stop], rows[:, :, start:stop]  # (B, H, C, D), (B, H, C, 1)
            grad_probs = torch.matmul(grad_out, chunk_value.transpose(-1, -2)).to(stat_dtype)  # (B, H, C, Tk')
            if save_kept:  # the softmax backward on the kept keys only (the others have P = dS = 0)
                width = resolve_knn_k(knn_k, end)
                indices = stats[0][:, :, start:stop, :width].long()
                probs = stats[1][:, :, start:stop, :width]  # (B, H, C, width)
                dense = probs.new_zeros(*indices.shape[:-1], end).scatter_(-1, indices, probs)  # P
                grad_value[:, :, :end] += torch.matmul(dense.to(value.dtype).transpose(-1, -2), grad_out)
                grad_kept = grad_probs.gather(-1, indices).sub_(row).mul_(probs)
                grad_scores = dense.scatter_(-1, indices, grad_kept)  # the same slots
            else:
                scores = _scores(chunk_query, chunk_key, chunk_visible, chunk_bias, scaling, softcap)
                threshold, cutoff, top, total = (stat[:, :, start:stop] for stat in stats)
                kept = _kept_mask(scores, threshold, cutoff)
                probs = _kept_softmax(scores, sinks, kept, top, total)  # the forward's P
                del scores, kept
                used = probs
                if generator is not None:  # the output used P ∘ M / (1 - p)
                    kept = torch.rand(probs.shape, device=probs.device, generator=generator) >= dropout
                    used = probs * kept / (1.0 - dropout)
                    grad_probs = grad_probs * kept / (1.0 - dropout)
                grad_value[:, :, :end] += torch.matmul(used.to(value.dtype).transpose(-1, -2), grad_out)
                del used
                grad_scores = grad_probs.sub_(row).mul_(probs)  # (B, H, C, Tk')
            if grad_sinks is not None:
                grad_sinks -= ((1.0 - probs.sum(dim=-1, keepdim=True)) * row).sum(dim=(0, 2, 3))
            del probs, grad_probs
            if grad_bias is not None:
                grad_bias[:, :, start:stop, :end] += grad_scores.sum_to_size(chunk_bias.shape).to(bias.dtype)
            if softcap is not None:  # through softcap · tanh(raw / softcap), `_scores` before the bias
                raw = torch.matmul(chunk_query * scaling, chunk_key.transpose(-1, -2)).to(grad_scores.dtype)
                grad_scores = grad_scores * (1 - torch.tanh(raw / softcap) ** 2)
            grad_scores = grad_scores.to(query.dtype)
            grad_query[:, :, start:stop] = torch.matmul(grad_scores, chunk_key).mul_(scaling)
            grad_key[:, :, :end] += torch.matmul(grad_scores.transpose(-1, -2), chunk_query * scaling)
            del grad_scores
        grad_sinks = None if grad_sinks is None else grad_sinks.to(sinks.dtype)
        return grad_query, grad_key, grad_value, None, grad_bias, grad_sinks, *([None] * 7)


def knn_attention_forward(
    module: torch.nn.Module | None,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    knn_k: int | float | None = None,
    knn_chunk_size: int | None = None,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    position_bias: Tensor | None = None,
    output_attentions: bool | None = None,
    generator: torch.Generator | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor | None]:
    """The `"knn"` backend, for AoT and any transformers model: exact k-NN attention (module docstring). `knn_k`,
    `knn_chunk_size` and `output_attentions` default to `module.config`'s; key/value heads are repeated for GQA;
    soft-capping (`softcap`, Gemma 2), sinks (`s_aux`, GPT-OSS) and additive biases (`position_bias`, T5; a float
    `attention_mask`) apply as in eager attention, before the top-k. With `output_attentions`, under `torch.compile`
    and `torch.export` it runs in one piece and returns the weights. `generator` draws the dropout masks."""
    config = getattr(module, "config", None)
    output_attentions = getattr(config, "output_attentions", False) if output_attentions is None else output_attentions
    knn_k = check_knn_k(knn_k if knn_k is not None else getattr(config, "knn_k", None))
    max_chunk = check_number("knn_chunk_size", knn_chunk_size or getattr(config, "knn_chunk_size", None) or 256)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if query.shape[1] != key.shape[1]:  # GQA: each key/value head serves H / Hkv query heads
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    visible, bias = _masks(attention_mask)
    if position_bias is not None:
        bias = position_bias if bias is None else bias + position_bias
    causal = visible is None and _is_causal(module, is_causal, query.shape[2])
    exporting = torch.compiler.is_exporting()
    if output_attentions or exporting or torch.compiler.is_compiling():
        # In one piece through autograd, with (B, H, Tq, Tk) weights (before dropout) that carry gradients as dense
        # attention's; exporting, the kept keys are `knn_kept_mask`'s sort, not a top-k of a symbolic k.
        if causal:  # keys past the last query: never seen
            visible = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).tril()
        scores = _scores(query, key, visible, bias, scaling, softcap)
        with torch.no_grad():
            if exporting:
                rejected = ~knn_kept_mask(scores.detach(), visible, knn_k)
            else:
                rejected = _knn_threshold(scores.detach(), visible, knn_k, resolve_knn_k(knn_k, key.shape[2]))[2] == 0
        weights = _softmax(scores.masked_fill(rejected, -math.inf), s_aux).to(query.dtype)
        used = weights
        if dropout > 0.0:
            used = weights * (torch.rand(weights.shape, device=weights.device, generator=generator) >= dropout)
            used = used / (1.0 - dropout)
        output = torch.matmul(used, value)
        return output.transpose(1, 2).contiguous(), weights if output_attentions else None
    output = _KnnAttentionFunction.apply(
        query, key, value, visible, bias, s_aux, causal, scaling, softcap, knn_k, max_chunk, dropout, generator
    )
    return output.transpose(1, 2).contiguous(), None


# The installed package's kernel, for every model (AoT models included) whose config asks for "knn".
AttentionInterface.register(KNN_ATTENTION, knn_attention_forward)
AttentionMaskInterface.register(KNN_ATTENTION, sdpa_mask)


def use_knn_attention(
    model: PreTrainedModel, knn_k: int | float, knn_chunk_size: int | None = None
) -> PreTrainedModel:
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


__all__ = ["KNN_ATTENTION", "check_knn_k", "knn_attention_forward", "resolve_knn_k", "use_knn_attention"]
