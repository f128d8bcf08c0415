"""MSSA's CPU training kernel, the `"shared_projection"` attention backend that `aot train` selects for MSSA on CPU.

It runs only where `shared_projection_applies` (a CPU training step of a short sequence without a mask); every other
call is transformers' SDPA. It is not part of the remote-code unit: saved folders load with `"sdpa"`. Importing this
module (the package does) registers the backend; `python -m benchmarks.bench_attention` measures it against SDPA.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

# Longest sequence, by `is_causal`, for which MSSA training on CPU uses the shared-projection kernel below instead
# of SDPA (where `python -m benchmarks.bench_attention` finds it faster on a training step). Set both to 0 for SDPA.
SHARED_KERNEL_MAX_LENGTH: dict[bool, int] = {True: 256, False: 128}
# Queries per block of the causal shared-projection kernel: each block scores only the keys up to its last query.
_SHARED_KERNEL_BLOCK = 64


class _SharedProjectionAttention(torch.autograd.Function):
    """softmax(s · U Uᵀ) U for MSSA, where one tensor U (B, H, T, D) is query, key and value.

    CPU SDPA recomputes the scores in its backward and runs small heads at a fraction of the matmul rate; for
    short sequences it is faster to keep the probabilities P and use batched matmuls. With query = key = value the
    three input gradients fold into two matmuls: dU = (dS + dSᵀ) U + Pᵀ dO, with dS the softmax backward of
    P ∘ (dO Uᵀ) times s. Causal attention runs in blocks of `_SHARED_KERNEL_BLOCK` queries that score only the keys
    up to their last query. Saved for the backward: U and P (T² / 2 floats per
    head when causal, T² when not) — which is why this kernel is used only up to `SHARED_KERNEL_MAX_LENGTH`.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, states: Tensor, scaling: float, is_causal: bool) -> Tensor:
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
    def backward(ctx: FunctionCtx, grad_output: Tensor) -> tuple[Tensor, None, None]:
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


def shared_projection_applies(
    query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, dropout: float, is_causal: bool
) -> bool:
    """Whether `_SharedProjectionAttention` can and should run a call: one tensor as query, key and value (MSSA
    without cache and without query normalisation), no mask, no dropout, a CPU fp32 step that will be differentiated
    (inference keeps SDPA, which saves nothing for a backward), and at most `SHARED_KERNEL_MAX_LENGTH` tokens."""
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


def shared_projection_attention_forward(
    module: torch.nn.Module | None,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """The `"shared_projection"` backend: `_SharedProjectionAttention` when `shared_projection_applies`, exactly the
    `"sdpa"` backend for every other call (a cache, a mask, inference, MHSA, longer sequences). Continuous batching
    accepts only the `"sdpa"`, `"paged|eager"` and flash backends."""
    if is_causal is None:
        is_causal = module is not None and bool(getattr(module, "is_causal", True))
    if shared_projection_applies(query, key, value, attention_mask, dropout, is_causal):
        output = _SharedProjectionAttention.apply(query, scaling, is_causal)  # (B, H, T, D)
        return output.transpose(1, 2).contiguous(), None
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal)


AttentionInterface.register("shared_projection", shared_projection_attention_forward)
AttentionMaskInterface.register("shared_projection", sdpa_mask)

__all__ = ["SHARED_KERNEL_MAX_LENGTH", "shared_projection_applies", "shared_projection_attention_forward"]
