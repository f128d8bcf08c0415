"""Multi-head subspace self-attention as a function (the AoT paper's Eq. (4) with a choice of φ), the operator
the experiments run with known subspaces: rank-1 heads and φ linear for clustering, U = I for in-context quantization
and the k-NN studies."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..knn import _knn_threshold, resolve_knn_k


def _apply_phi(
    scores: torch.Tensor, phi: str | Callable[[torch.Tensor], torch.Tensor], mask: torch.Tensor | None
) -> torch.Tensor:
    if phi == "linear":
        return scores if mask is None else scores.masked_fill(~mask, 0.0)
    masked = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    if callable(phi):
        return phi(masked)
    if phi == "softmax":
        return torch.softmax(masked, dim=-1)
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
    `u = X U_k` (B, N, p), `A = scaling · u uᵀ`, output `Σ_k φ(A) u U_kᵀ`. The models' MSSA layer computes exactly
    this with `tie_output_projection=True` and without query normalisation (tested); by default it learns a separate
    output projection instead of `[U_1 … U_K]` and, in the causal LM, normalises the queries.

    Args:
        hidden_states: Tokens `X` of shape (B, N, d), the shape of the output.
        subspaces: Bases `U_k` of shape (K, d, p) (K heads of rank p).
        phi: `"softmax"` over the keys, `"linear"` (scores used as weights), or a callable applied to the
            (B, K, N, N) score tensor (masked entries set to -inf) returning weights of the same shape.
        scaling: Factor on the scores.
        attention_mask: Boolean (B or 1, 1 or K, N, N), True where a query may attend to a key.
        knn_k: Keep only the top-k scores per query before φ (dropped scores become -inf for softmax, 0 for linear).
    """
    if hidden_states.dim() != 3 or subspaces.dim() != 3 or hidden_states.shape[-1] != subspaces.shape[1]:
        raise ValueError(
            f"`hidden_states` must be (B, N, d) and `subspaces` (K, d, p) with the same d; got "
            f"{tuple(hidden_states.shape)} and {tuple(subspaces.shape)}."
        )
    projected = torch.einsum("bnd,kdp->bknp", hidden_states, subspaces)  # (B, K, N, p)
    scores = scaling * torch.matmul(projected, projected.transpose(-1, -2))  # (B, K, N, N)
    mask = attention_mask
    if knn_k is not None:  # the k-NN kernel's tie rule (`attention_aot`)
        full_mask = None if mask is None else mask.expand_as(scores)
        masked = scores if mask is None else scores.masked_fill(~full_mask, float("-inf"))
        with torch.no_grad():
            max_k = resolve_knn_k(knn_k, scores.shape[-1])
            rejected = _knn_threshold(masked.detach(), full_mask, knn_k, max_k)[2] == 0
        mask = ~rejected
    weights = _apply_phi(scores, phi, mask)
    mixed = torch.matmul(weights.to(projected.dtype), projected)  # (B, K, N, p)
    return torch.einsum("bknp,kdp->bnd", mixed, subspaces)


__all__ = ["subspace_attention"]
