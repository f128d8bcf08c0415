"""Attention-based clustering (Maulen-Soto, Marion, Boyer 2025, https://arxiv.org/abs/2505.13112).

Data: sequences X = (X_1, …, X_L) of i.i.d. tokens in R^d from a mixture of K Gaussians with orthonormal centroids
μ*_1..μ*_K, equal weights 1/K and isotropic noise σ: X_ℓ = μ*_{z_ℓ} + σ ξ_ℓ. Write C = E[X Xᵀ] = P/K + σ² I with P the
projection onto the centroids' span.

Predictors (tokens as rows):

- `linear_attention_predictor` — T_lin, one linear-attention head per centroid estimate μ_k with query = key = μ_k,
  `T(X)_ℓ = (Kλ/L) Σ_k Σ_m ⟨μ_k, X_ℓ⟩⟨μ_k, X_m⟩ V(X_m)`, which for the paper's K = 2 is the factor 2λ/L. With
  `values="identity"` (the paper's predictor) V(x) = x; with `values="projected"` V(x) = μ_k μ_kᵀ x, which is MSSA
  with rank-1 subspaces and φ linear and is computed by `aot_transformers.attention_aot.subspace_attention`.
- `softmax_attention_predictor` — the softmax heads of Appendix H with a centering ψ:
  `Σ_k Σ_m (softmax_m(λ⟨μ_k, X_ℓ⟩⟨μ_k, X_m⟩) − ψ/L) V(X_m)`, λ and ψ learned.
- `in_context_quantizer` — attention with Q = K = V = I and no trained parameter,
  `T_ctx(X)_ℓ = (2λ/L) Σ_m ⟨X_ℓ, X_m⟩ X_m`: `subspace_attention` with the single subspace U = I and φ linear.

The risk of a predictor is the reconstruction error (1/L) Σ_ℓ E‖X_ℓ − T(X)_ℓ‖². The oracle quantizer, which maps each
token to its true centroid, has risk dσ².

Closed forms (derived in README.md, section "clustering", and checked by Monte Carlo in the tests):

- `unbiased_temperature`: the λ for which E[T_lin(X)_ℓ | z_ℓ] = μ*_{z_ℓ} at μ = μ* (Prop. 4.1). For identity values
  λ = L / (K(1 + (K+2)σ²) + (L−1)(1 + Kσ²)), tending to 1/(1 + Kσ²).
- `oracle_risk_limit`: at μ = μ* and L → ∞, T_lin → λ(1 + Kσ²) P X, so with the limit temperature the risk is
  E‖(I − P)X‖² = σ²(d − K), i.e. σ²(d − 2) for two centroids (Prop. 4.2).
- `in_context_quantization_risk_limit`: as L → ∞, T_ctx → 2λ C X and the risk tends to
  tr(C) − 4λ tr(C²) + 4λ² tr(C³), minimised at λ = tr(C²) / (2 tr(C³)) (Prop. 5.2); compared with dσ².
- `*_risk_exact`: the exact finite-L risks, from Gaussian moments (noncentral χ² moments of ‖X‖², ‖PX‖²).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..attention_aot import subspace_attention
from ._common import (
    Claim,
    Stopwatch,
    check_choice,
    check_int,
    check_real,
    format_command,
    make_generator,
    new_figure,
    output_dir,
    save_figure,
    write_json,
    write_summary,
)

VALUES = ("identity", "projected")
INITS = ("span", "random")
PREDICTORS = ("linear", "softmax")


# --------------------------------------------------------------------------------------------------------------------
# Data.
# --------------------------------------------------------------------------------------------------------------------


def _check_mixture(dim: int, num_clusters: int, sigma: float) -> None:
    check_int("num_clusters", num_clusters)
    check_int("dim", dim)
    if dim < num_clusters:
        raise ValueError(
            f"`dim` (d = {dim}) must be >= `num_clusters` (K = {num_clusters}): K orthonormal centroids need d >= K."
        )
    check_real("sigma", sigma, 0.0)


def orthonormal_centroids(
    dim: int, num_clusters: int = 2, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """K random orthonormal centroids in R^d, as rows (K, d)."""
    _check_mixture(dim, num_clusters, 0.0)
    basis, _ = torch.linalg.qr(torch.randn(dim, num_clusters, generator=generator, dtype=torch.float64))
    return basis.T.to(dtype).contiguous()


def sample_gaussian_mixture(
    num_sequences: int,
    seq_len: int,
    centroids: torch.Tensor,
    sigma: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of i.i.d. tokens X_ℓ = μ*_{z_ℓ} + σ ξ_ℓ with z_ℓ uniform over the K centroids.

    Args:
        num_sequences: B.
        seq_len: L.
        centroids: μ* as rows (K, d).
        sigma: σ >= 0.
        generator: Random generator.

    Returns:
        `tokens` (B, L, d) in the centroids' dtype and `labels` (B, L).
    """
    check_int("num_sequences", num_sequences)
    check_int("seq_len", seq_len)
    num_clusters, dim = centroids.shape
    _check_mixture(dim, num_clusters, sigma)
    labels = torch.randint(num_clusters, (num_sequences, seq_len), generator=generator)
    noise = torch.randn(num_sequences, seq_len, dim, generator=generator, dtype=centroids.dtype)
    return centroids[labels] + sigma * noise, labels


# --------------------------------------------------------------------------------------------------------------------
# Predictors, risk, regulariser, distance.
# --------------------------------------------------------------------------------------------------------------------


def linear_attention_predictor(
    tokens: torch.Tensor, heads: torch.Tensor, lam: float | torch.Tensor, values: str = "identity"
) -> torch.Tensor:
    """T_lin: one linear-attention head per row μ_k of `heads`, query = key = μ_k, factor Kλ/L (2λ/L for K = 2).

    Args:
        tokens: X (B, L, d).
        heads: μ (K, d).
        lam: λ.
        values: `"identity"` (V = I, the paper's predictor) or `"projected"` (V = μ_k μ_kᵀ: MSSA with rank-1
            subspaces and φ linear, through `subspace_attention`).

    Returns:
        T_lin(X) (B, L, d).
    """
    check_choice("values", values, VALUES)
    num_heads, seq_len = heads.shape[0], tokens.shape[1]
    scaling = num_heads * lam / seq_len
    if values == "projected":
        return subspace_attention(tokens, heads.unsqueeze(-1).to(tokens.dtype), phi="linear", scaling=scaling)
    coordinates = tokens @ heads.T.to(tokens.dtype)  # (B, L, K): ⟨μ_k, X_ℓ⟩
    # Summing the K rank-1 score matrices before applying them to the identity values.
    scores = coordinates @ coordinates.transpose(-1, -2)  # (B, L, L)
    return scaling * scores @ tokens


def softmax_attention_predictor(
    tokens: torch.Tensor,
    heads: torch.Tensor,
    lam: float | torch.Tensor,
    psi: float | torch.Tensor,
    values: str = "identity",
    exclude_self: bool = True,
) -> torch.Tensor:
    """Softmax heads with centering (Appendix H): Σ_k Σ_m (softmax_m(λ⟨μ_k,X_ℓ⟩⟨μ_k,X_m⟩) − ψ/L) V(X_m).

    The centering removes ψ times the uniform average of the values, which a head returns when its scores carry no
    information: with K heads, ψ = (K−1)/K cancels the K − 1 uninformative heads of a token.

    Args:
        tokens: X (B, L, d).
        heads: μ (K, d).
        lam: Inverse temperature λ.
        psi: Centering ψ.
        values: `"identity"` or `"projected"` (through `subspace_attention` with a callable φ).
        exclude_self: Mask each token's own key. Without it, a large λ lets a head attend to the token itself and
            copy it, which drives the reconstruction risk to 0 without finding any centroid.

    Returns:
        (B, L, d).
    """
    check_choice("values", values, VALUES)
    seq_len = tokens.shape[1]
    mask = ~torch.eye(seq_len, dtype=torch.bool) if exclude_self else None  # (L, L), True = may attend
    visible = seq_len - 1 if exclude_self else seq_len

    def phi(scores: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(scores, dim=-1) - psi / visible
        return weights if mask is None else weights * mask

    if values == "projected":
        return subspace_attention(
            tokens,
            heads.unsqueeze(-1).to(tokens.dtype),
            phi=phi,
            scaling=lam,
            attention_mask=None if mask is None else mask[None, None],
        )
    coordinates = (tokens @ heads.T.to(tokens.dtype)).transpose(1, 2)  # (B, K, L)
    scores = lam * coordinates.unsqueeze(-1) * coordinates.unsqueeze(-2)  # (B, K, L, L)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return phi(scores).sum(1) @ tokens


def in_context_quantizer(tokens: torch.Tensor, lam: float) -> torch.Tensor:
    """T_ctx(X)_ℓ = (2λ/L) Σ_m ⟨X_ℓ, X_m⟩ X_m: attention with Q = K = V = I (the single subspace U = I, φ linear)."""
    identity = torch.eye(tokens.shape[-1], dtype=tokens.dtype).unsqueeze(0)  # (1, d, d)
    return subspace_attention(tokens, identity, phi="linear", scaling=2.0 * lam / tokens.shape[1])


def reconstruction_risk(tokens: torch.Tensor, prediction: torch.Tensor) -> torch.Tensor:
    """Empirical risk: ‖X_ℓ − T(X)_ℓ‖² averaged over all positions of all sequences (they are exchangeable)."""
    return (tokens - prediction).square().sum(-1).mean()


def centroid_regulariser(tokens: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """Empirical Σ_{k<k'} E[⟨μ_k, X⟩² ⟨μ_k', X⟩²] over the tokens (for K = 2: E[⟨μ₀,X⟩²⟨μ₁,X⟩²]).

    It is small when each token correlates with at most one head, which breaks the rotation symmetry of the risk
    inside the centroids' span. Multiply by ρ to get the penalty.
    """
    squared = (tokens @ heads.T.to(tokens.dtype)).square().reshape(-1, heads.shape[0])  # (B·L, K)
    pairs = squared.sum(-1).square() - squared.square().sum(-1)  # 2 Σ_{k<k'} a_k a_k'
    return 0.5 * pairs.mean()


def centroid_regulariser_closed_form(heads: torch.Tensor, centroids: torch.Tensor, sigma: float) -> torch.Tensor:
    """The population value of `centroid_regulariser` for unit heads.

    Given the cluster c, u = ⟨μ_k, X⟩ and v = ⟨μ_k', X⟩ are jointly Gaussian with means m_u = ⟨μ_k, μ*_c⟩,
    m_v = ⟨μ_k', μ*_c⟩, variances σ²‖μ‖² and covariance s = σ²⟨μ_k, μ_k'⟩; Isserlis' theorem gives
    E[u²v²] = (m_u² + σ²‖μ_k‖²)(m_v² + σ²‖μ_k'‖²) + 2s² + 4 m_u m_v s. Averaged over the K clusters.
    """
    sigma = check_real("sigma", sigma, 0.0)
    means = heads @ centroids.T  # (K_heads, K_clusters)
    gram = heads @ heads.T
    total = heads.new_zeros(())
    for k, k2 in itertools.combinations(range(heads.shape[0]), 2):
        mu, mv, s = means[k], means[k2], sigma**2 * gram[k, k2]
        var_u, var_v = sigma**2 * gram[k, k], sigma**2 * gram[k2, k2]
        total = total + ((mu**2 + var_u) * (mv**2 + var_v) + 2 * s**2 + 4 * mu * mv * s).mean()
    return total


def centroid_distance(heads: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Distance of the heads to the centroids, invariant to the heads' signs and order.

    `min over permutations π of (Σ_k min_{s=±1} ‖μ_k − s μ*_π(k)‖²)^{1/2}`, the Frobenius distance between the two
    frames up to a signed permutation: the risk cannot tell μ_k from −μ_k (μ_k enters every predictor twice) nor the
    heads apart (they are summed).
    """
    if heads.shape != centroids.shape:
        raise ValueError(f"`heads` {tuple(heads.shape)} and `centroids` {tuple(centroids.shape)} must have one shape.")
    heads, centroids = heads.detach().to(torch.float64), centroids.to(torch.float64)
    # min_s ‖a − s b‖² = ‖a‖² + ‖b‖² − 2|⟨a, b⟩|
    cost = heads.square().sum(-1, keepdim=True) + centroids.square().sum(-1) - 2 * (heads @ centroids.T).abs()
    num = heads.shape[0]
    best = min(sum(cost[k, perm[k]] for k in range(num)) for perm in itertools.permutations(range(num)))
    return best.clamp(min=0.0).sqrt()


# --------------------------------------------------------------------------------------------------------------------
# Closed forms.
# --------------------------------------------------------------------------------------------------------------------


def unbiased_temperature(sigma: float, seq_len: int, num_clusters: int = 2, values: str = "identity") -> float:
    """λ for which T_lin at μ = μ* is unbiased: E[T_lin(X)_ℓ | z_ℓ = c] = μ*_c (Prop. 4.1).

    Derivation (README): the m = ℓ term contributes Σ_k E[⟨μ*_k, X⟩² X | c] = (1 + (K+2)σ²) μ*_c for identity values
    ((1 + 3σ²) μ*_c for projected values), each of the L − 1 other tokens E[⟨μ*_c, X⟩ X] = (1/K + σ²) μ*_c; with the
    factor Kλ/L the bias vanishes at λ = L / (K·m_self + (L − 1)(1 + Kσ²)).
    """
    sigma = check_real("sigma", sigma, 0.0)
    check_int("seq_len", seq_len)
    check_int("num_clusters", num_clusters)
    check_choice("values", values, VALUES)
    own = 1 + (num_clusters + 2) * sigma**2 if values == "identity" else 1 + 3 * sigma**2
    return seq_len / (num_clusters * own + (seq_len - 1) * (1 + num_clusters * sigma**2))


def oracle_quantizer_risk(dim: int, sigma: float) -> float:
    """Risk dσ² of the oracle quantizer, which maps every token to its true centroid."""
    check_int("dim", dim)
    return dim * check_real("sigma", sigma, 0.0) ** 2


def oracle_risk_limit(dim: int, sigma: float, num_clusters: int = 2) -> float:
    """Prop. 4.2: lim_{L→∞} risk of T_lin at μ = μ* with the unbiased temperature, σ²(d − K) (σ²(d − 2) for K = 2)."""
    _check_mixture(dim, num_clusters, sigma)
    return sigma**2 * (dim - num_clusters)


def oracle_linear_attention_risk_limit(dim: int, sigma: float, lam: float, num_clusters: int = 2) -> float:
    """L → ∞ risk of T_lin at μ = μ* for any λ: T → cPX with c = λ(1 + Kσ²), risk (1 − c)²(1 + Kσ²) + σ²(d − K)."""
    _check_mixture(dim, num_clusters, sigma)
    c = lam * (1 + num_clusters * sigma**2)
    return (1 - c) ** 2 * (1 + num_clusters * sigma**2) + sigma**2 * (dim - num_clusters)


def _second_moments(dim: int, sigma: float, num_clusters: int) -> dict[str, float]:
    """Moments of one token X = μ* + σξ (‖μ*‖ = 1) used by the exact risks.

    ‖X‖²/σ² and ‖PX‖²/σ² are noncentral χ² with d and K degrees of freedom and noncentrality 1/σ²; their raw
    moments follow from the cumulants κ_n = 2^{n−1}(n−1)!(k + nλ). Written in σ so that σ = 0 is allowed.
    """
    s2 = sigma**2

    def chi_moments(k: int) -> tuple[float, float, float]:
        m1 = 1 + k * s2
        m2 = m1**2 + 2 * k * s2**2 + 4 * s2
        m3 = m1**3 + 6 * m1 * (k * s2**2 + 2 * s2) + 8 * (k * s2**3 + 3 * s2**2)
        return m1, m2, m3

    x1, x2, x3 = chi_moments(dim)
    p1, p2, p3 = chi_moments(num_clusters)
    q1 = (dim - num_clusters) * s2  # E‖(I − P)X‖², independent of PX
    a = 1 / num_clusters + s2  # eigenvalue of C on the centroids' span
    return {
        "x1": x1,
        "x2": x2,
        "x3": x3,
        "p1": p1,
        "p2": p2,
        "p3": p3,
        "q1": q1,
        "a": a,
        "trC2": num_clusters * a**2 + (dim - num_clusters) * s2**2,
        "trC3": num_clusters * a**3 + (dim - num_clusters) * s2**3,
    }


def in_context_quantization_risk_limit(dim: int, sigma: float, lam: float, num_clusters: int = 2) -> float:
    """Prop. 5.2: lim_{L→∞} risk of T_ctx, tr(C) − 4λ tr(C²) + 4λ² tr(C³)."""
    _check_mixture(dim, num_clusters, sigma)
    m = _second_moments(dim, sigma, num_clusters)
    return m["x1"] - 4 * lam * m["trC2"] + 4 * lam**2 * m["trC3"]


def in_context_quantization_optimal_temperature(dim: int, sigma: float, num_clusters: int = 2) -> float:
    """The λ minimising the limit risk of T_ctx: tr(C²) / (2 tr(C³))."""
    _check_mixture(dim, num_clusters, sigma)
    m = _second_moments(dim, sigma, num_clusters)
    return m["trC2"] / (2 * m["trC3"])


def in_context_quantization_risk_exact(
    dim: int, sigma: float, seq_len: int, lam: float, num_clusters: int = 2
) -> float:
    """Exact finite-L risk of T_ctx = 2λ Ĉ X_ℓ with Ĉ = (1/L) Σ_m X_m X_mᵀ (the token itself included).

    E[XᵀĈX] = (m4 + (L−1) tr C²)/L and E[XᵀĈ²X] = (m6 + 3(L−1) E[‖X‖² XᵀCX] + (L−1)(L−2) tr C³)/L², splitting the
    double sum over (m, m') by which indices coincide with ℓ.
    """
    _check_mixture(dim, num_clusters, sigma)
    check_int("seq_len", seq_len)
    m, length = _second_moments(dim, sigma, num_clusters), seq_len
    s2 = sigma**2
    # E[‖X‖² XᵀCX] with XᵀCX = ‖PX‖²/K + σ²‖X‖² and E[‖X‖²‖PX‖²] = E‖PX‖⁴ + E‖PX‖² E‖QX‖².
    cross = (m["p2"] + m["p1"] * m["q1"]) / num_clusters + s2 * m["x2"]
    first = (m["x2"] + (length - 1) * m["trC2"]) / length
    second = (m["x3"] + 3 * (length - 1) * cross + (length - 1) * (length - 2) * m["trC3"]) / length**2
    c = 2 * lam
    return m["x1"] - 2 * c * first + c**2 * second


def oracle_linear_attention_risk_exact(
    dim: int, sigma: float, seq_len: int, lam: float, num_clusters: int = 2
) -> float:
    """Exact finite-L risk of T_lin (identity values) at μ = μ*: T_ℓ = Kλ Ĉ P X_ℓ.

    Same expansion as `in_context_quantization_risk_exact`, with CP = aP (a = 1/K + σ²) and PX ⟂ (I − P)X.
    """
    _check_mixture(dim, num_clusters, sigma)
    check_int("seq_len", seq_len)
    m, length = _second_moments(dim, sigma, num_clusters), seq_len
    a = m["a"]
    x_px = m["p2"] + m["p1"] * m["q1"]  # E[‖X‖²‖PX‖²]
    first = (x_px + (length - 1) * num_clusters * a**2) / length  # E[XᵀĈPX]
    px4_x = m["p3"] + m["p2"] * m["q1"]  # E[‖PX‖⁴‖X‖²]
    second = (
        px4_x + (length - 1) * (a * x_px + 2 * a * m["p2"]) + (length - 1) * (length - 2) * num_clusters * a**3
    ) / length**2  # E[XᵀPĈ²PX]
    c = num_clusters * lam
    return m["x1"] - 2 * c * first + c**2 * second


# --------------------------------------------------------------------------------------------------------------------
# Monte Carlo risks.
# --------------------------------------------------------------------------------------------------------------------


def _monte_carlo(dim, sigma, seq_len, num_sequences, seed, num_clusters, predictor) -> float:
    _check_mixture(dim, num_clusters, sigma)
    check_int("seq_len", seq_len)
    check_int("num_sequences", num_sequences)
    generator = make_generator(seed)
    centroids = orthonormal_centroids(dim, num_clusters, generator)
    total, chunk = 0.0, max(1, 2_000_000 // (seq_len * seq_len))  # keep each (B, L, L) block near 16 MB
    for start in range(0, num_sequences, chunk):
        size = min(chunk, num_sequences - start)
        tokens, _ = sample_gaussian_mixture(size, seq_len, centroids, sigma, generator)
        total += float(reconstruction_risk(tokens, predictor(tokens, centroids))) * size
    return total / num_sequences


def in_context_quantization_risk(
    d: int, sigma: float, L: int, lam: float, num_sequences: int, seed: int = 0, num_clusters: int = 2
) -> float:
    """Monte Carlo risk of the in-context quantizer T_ctx, averaged over all L positions of every sequence."""
    return _monte_carlo(d, sigma, L, num_sequences, seed, num_clusters, lambda x, _: in_context_quantizer(x, lam))


def oracle_linear_attention_risk(
    d: int, sigma: float, L: int, lam: float, num_sequences: int, seed: int = 0, num_clusters: int = 2
) -> float:
    """Monte Carlo risk of T_lin (identity values) with the heads at the true centroids, averaged over positions."""
    return _monte_carlo(
        d, sigma, L, num_sequences, seed, num_clusters, lambda x, mu: linear_attention_predictor(x, mu, lam)
    )


# --------------------------------------------------------------------------------------------------------------------
# Training: projected (Riemannian) SGD on the sphere.
# --------------------------------------------------------------------------------------------------------------------


def initial_heads(centroids: torch.Tensor, init: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """Starting heads on the unit sphere.

    `"span"`: a uniformly random orthonormal frame of the centroids' span — on the manifold of orthonormal frames of
    that span, where the large-L risk is flat; `"random"`: independent uniform points on the sphere.
    """
    check_choice("init", init, INITS)
    num, dim = centroids.shape
    if init == "random":
        heads = torch.randn(num, dim, generator=generator, dtype=centroids.dtype)
        return heads / heads.norm(dim=-1, keepdim=True)
    rotation, _ = torch.linalg.qr(torch.randn(num, num, generator=generator, dtype=torch.float64))
    return (rotation.to(centroids.dtype) @ centroids).contiguous()


def riemannian_sgd_step(heads: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
    """One projected SGD step on the product of unit spheres.

    The gradient is projected on each sphere's tangent space (g − ⟨g, μ⟩μ), the step taken, and the point
    retracted onto the sphere by normalisation.
    """
    tangent = grad - (grad * heads).sum(-1, keepdim=True) * heads
    moved = heads - lr * tangent
    return moved / moved.norm(dim=-1, keepdim=True)


def train_heads(
    dim: int = 5,
    num_clusters: int = 2,
    sigma: float = 0.3,
    lam: float = 0.6,
    seq_len: int = 30,
    lr: float = 0.01,
    batch_size: int = 256,
    steps: int = 10_000,
    rho: float = 0.0,
    init: str = "span",
    predictor: str = "linear",
    values: str = "identity",
    psi: float = 1.0,
    record_every: int = 100,
    seed: int = 0,
) -> dict[str, Any]:
    """Learn the heads without labels by projected SGD on fresh batches (risk + ρ · regulariser).

    Args:
        dim: d.
        num_clusters: K (number of centroids and of heads).
        sigma: Noise σ >= 0.
        lam: λ (fixed for the linear predictor; the starting value, learned, for softmax heads).
        seq_len: L.
        lr: Step size.
        batch_size: Sequences per step.
        steps: Number of SGD steps.
        rho: ρ >= 0, weight of the regulariser Σ_{k<k'} E[⟨μ_k,X⟩²⟨μ_k',X⟩²].
        init: `"span"` (on the manifold of frames of the centroids' span) or `"random"`.
        predictor: `"linear"` (T_lin) or `"softmax"` (Appendix H heads; λ and ψ learned by plain SGD).
        values: `"identity"` or `"projected"` (see `linear_attention_predictor`).
        psi: Starting centering ψ (softmax heads).
        record_every: Record distance and risk every this many steps.
        seed: Seed of centroids, initialisation and data.

    Returns:
        `steps` and `distance`/`risk` histories (lists), final `heads`, `centroids`, `lam`, `psi`, `seconds`.
    """
    _check_mixture(dim, num_clusters, sigma)
    lam = check_real("lam", lam, 0.0, open_min=True)
    rho = check_real("rho", rho, 0.0)
    lr = check_real("lr", lr, 0.0, open_min=True)
    check_int("seq_len", seq_len)
    check_int("batch_size", batch_size)
    check_int("steps", steps)
    check_int("record_every", record_every)
    check_choice("predictor", predictor, PREDICTORS)
    check_choice("values", values, VALUES)
    generator = make_generator(seed)
    centroids = orthonormal_centroids(dim, num_clusters, generator, dtype=torch.float32)
    heads = initial_heads(centroids, init, generator)
    log_lam = torch.tensor(math.log(lam), requires_grad=predictor == "softmax")  # λ > 0 through its log
    psi_param = torch.tensor(float(psi), requires_grad=predictor == "softmax")
    history: dict[str, list[float]] = {"steps": [], "distance": [], "risk": []}
    clock = Stopwatch()
    for step in range(steps + 1):
        if step % record_every == 0 or step == steps:
            history["steps"].append(step)
            history["distance"].append(float(centroid_distance(heads, centroids)))
        if step == steps:
            break
        tokens, _ = sample_gaussian_mixture(batch_size, seq_len, centroids, sigma, generator)
        heads_var = heads.clone().requires_grad_(True)
        if predictor == "linear":
            prediction = linear_attention_predictor(tokens, heads_var, lam, values)
        else:
            prediction = softmax_attention_predictor(tokens, heads_var, log_lam.exp(), psi_param, values)
        risk = reconstruction_risk(tokens, prediction)
        loss = risk + rho * centroid_regulariser(tokens, heads_var) if rho > 0 else risk
        params = [heads_var] + ([log_lam, psi_param] if predictor == "softmax" else [])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            heads = riemannian_sgd_step(heads, grads[0], lr)
            if predictor == "softmax":
                log_lam -= lr * grads[1]
                psi_param -= lr * grads[2]
        if step % record_every == 0:
            history["risk"].append(float(risk.detach()))
    return {
        **history,
        "heads": heads,
        "centroids": centroids,
        "lam": float(log_lam.detach().exp()),
        "psi": float(psi_param.detach()),
        "seconds": clock.seconds(),
    }


def plateau(distances: Sequence[float], fraction: float = 0.2) -> float:
    """The median distance over the last `fraction` of the recorded steps (the plateau of a training curve)."""
    tail = torch.tensor(distances[-max(1, int(len(distances) * fraction)) :], dtype=torch.float64)
    return float(tail.median())


def _pca_2d(points: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Project `points` on the two leading principal directions of `reference` (both (N, d))."""
    mean = reference.mean(0)
    _, _, vh = torch.linalg.svd(reference - mean, full_matrices=False)
    return (points - mean) @ vh[:2].T


# --------------------------------------------------------------------------------------------------------------------
# The study.
# --------------------------------------------------------------------------------------------------------------------


def _curve(run_: dict[str, Any]) -> dict[str, Any]:
    return {
        "steps": run_["steps"],
        "distance": run_["distance"],
        "risk": run_["risk"],
        "seconds": run_["seconds"],
        "plateau": plateau(run_["distance"]),
        "lam": run_["lam"],
        "psi": run_["psi"],
    }


def run(
    out: str | Path | None = None,
    dim: int = 5,
    seq_len: int = 30,
    sigmas: Sequence[float] = (0.3, 1.0),
    lams: Sequence[float] = (0.6, 0.2),
    manifold_rho: float = 0.2,
    rhos: Sequence[float] = (0.0, 0.05, 0.2),
    lr: float = 0.01,
    batch_size: int = 256,
    steps: int = 10_000,
    k3_dim: int = 6,
    softmax_steps: int = 4000,
    mc_sequences: int = 400,
    mc_seq_len: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Figures 1–4 and the closed forms of the clustering paper.

    Args:
        out: Output folder (default `out/experiments/clustering`).
        dim: d of Figures 1–2.
        seq_len: L of the training runs.
        sigmas: σ of Figure 1 (paired with `lams`).
        lams: λ for each σ.
        manifold_rho: ρ of Figure 1 (heads initialised on the manifold of frames of the centroids' span).
        rhos: ρ sweep of Figure 2 (random initialisation, first σ/λ pair).
        lr: SGD step size.
        batch_size: Sequences per step.
        steps: SGD steps per linear-attention run.
        k3_dim: d of the K = 3 run.
        softmax_steps: Steps of the softmax-heads run.
        mc_sequences: Monte Carlo sequences for the closed-form checks.
        mc_seq_len: L of the Monte Carlo checks (large, to approach the L → ∞ limits).
        seed: Seed.

    Returns:
        The results dictionary also written to `results.json`.
    """
    options = dict(
        dim=dim,
        seq_len=seq_len,
        sigmas=list(sigmas),
        lams=list(lams),
        manifold_rho=manifold_rho,
        rhos=list(rhos),
        lr=lr,
        batch_size=batch_size,
        steps=steps,
        k3_dim=k3_dim,
        softmax_steps=softmax_steps,
        mc_sequences=mc_sequences,
        mc_seq_len=mc_seq_len,
        seed=seed,
    )
    if len(sigmas) != len(lams) or not sigmas:
        raise ValueError(
            f"`sigmas` and `lams` must be non-empty and of equal length, got {list(sigmas)} and {list(lams)}."
        )
    for sigma in sigmas:
        _check_mixture(dim, 2, sigma)
    for lam in lams:
        check_real("lams", lam, 0.0, open_min=True)
    for rho in (*rhos, manifold_rho):
        check_real("rho", rho, 0.0)
    _check_mixture(k3_dim, 3, sigmas[0])
    folder = output_dir(out, "clustering")
    clock = Stopwatch()
    claims: list[Claim] = []
    figures: list[str] = []
    results: dict[str, Any] = {"study": "clustering", "options": options}
    common = dict(seq_len=seq_len, lr=lr, batch_size=batch_size, seed=seed)

    # Figure 1: heads start on the manifold where the risk is flat (frames of the centroids' span); ρ picks the frame.
    results["figure1"] = {}
    fig, axes = new_figure()
    paper_plateau = {0.3: "plateau ≈ 1e-2", 1.0: "plateau ≈ 1e-1 (higher than for σ = 0.3)"}
    for sigma, lam in zip(sigmas, lams, strict=True):
        curve = _curve(train_heads(dim, 2, sigma, lam, steps=steps, rho=manifold_rho, init="span", **common))
        results["figure1"][f"sigma={sigma}"] = curve
        axes[0, 0].semilogy(curve["steps"], curve["distance"], label=f"σ = {sigma}, λ = {lam}")
        claims.append(
            Claim(
                f"Fig. 1: distance, init on the manifold, σ={sigma}, λ={lam}, ρ={manifold_rho}",
                f"{curve['distance'][0]:.2f} → plateau {curve['plateau']:.1e}",
                paper_plateau.get(sigma, "decreases to a plateau"),
                curve["plateau"] < 0.1 * curve["distance"][0],
            )
        )
    if len(sigmas) >= 2:
        plateaus = [results["figure1"][f"sigma={s}"]["plateau"] for s in sigmas[:2]]
        claims.append(
            Claim(
                f"Fig. 1: plateau ratio σ={sigmas[1]} / σ={sigmas[0]}",
                f"{plateaus[1] / plateaus[0]:.1f}",
                "≈ 10 (1e-1 vs 1e-2)",
                None,
            )
        )
    axes[0, 0].set(
        xlabel="SGD step",
        ylabel="distance to the centroids",
        title=f"Fig. 1: init on the manifold, ρ = {manifold_rho}",
    )
    axes[0, 0].legend()
    figures.append(save_figure(fig, folder / "fig1_manifold_init.png"))

    # Figure 2: random initialisation, ρ sweep.
    results["figure2"] = {}
    fig, axes = new_figure()
    sigma, lam = sigmas[0], lams[0]
    trained_heads = None
    for rho in rhos:
        run_ = train_heads(dim, 2, sigma, lam, steps=steps, rho=rho, init="random", **common)
        results["figure2"][f"rho={rho}"] = _curve(run_)
        trained_heads = run_ if trained_heads is None or rho == 0.2 else trained_heads
        axes[0, 0].semilogy(run_["steps"], run_["distance"], label=f"ρ = {rho}")
    axes[0, 0].set(
        xlabel="SGD step", ylabel="distance to the centroids", title=f"Fig. 2: random init, σ = {sigma}, λ = {lam}"
    )
    axes[0, 0].legend()
    figures.append(save_figure(fig, folder / "fig2_random_init_rho.png"))
    fig2 = results["figure2"]
    claims.append(
        Claim(
            "Fig. 2 (random init): plateau per ρ",
            ", ".join(f"{key}: {value['plateau']:.1e}" for key, value in fig2.items()),
            "without ρ the heads stop at a random frame of the span; ρ = 0.2 reaches the centroids",
            None,
        )
    )
    if "rho=0.2" in fig2 and "rho=0.0" in fig2:
        claims.append(
            Claim(
                "Fig. 2: ρ = 0.2 ends closer to the centroids than ρ = 0",
                f"{fig2['rho=0.2']['plateau']:.1e} vs {fig2['rho=0.0']['plateau']:.1e}",
                "regularisation needed from a random start",
                fig2["rho=0.2"]["plateau"] < 0.1 * fig2["rho=0.0"]["plateau"],
            )
        )

    # K = 3 centroids.
    k3_rho = 0.2 if 0.2 in rhos else max(rhos, default=manifold_rho)
    results["k3"] = _curve(train_heads(k3_dim, 3, sigma, lam, steps=steps, rho=k3_rho, init="random", **common))
    claims.append(
        Claim(
            f"K = 3, d = {k3_dim}, random init, ρ = {k3_rho}: distance",
            f"{results['k3']['distance'][0]:.2f} → plateau {results['k3']['plateau']:.1e}",
            "the 3 heads recover the 3 centroids",
            results["k3"]["plateau"] < 0.05,
        )
    )

    # Softmax heads with centering, λ and ψ learned (Appendix H); MSSA-style values (see README).
    soft = _curve(
        train_heads(
            dim,
            2,
            sigma,
            3.0,
            steps=softmax_steps,
            rho=0.0,
            init="random",
            predictor="softmax",
            values="projected",
            psi=0.5,
            record_every=max(1, softmax_steps // 50),
            **common,
        )
    )
    results["softmax"] = soft
    claims.append(
        Claim(
            "Softmax heads + centering ψ (λ, ψ learned, MSSA values, ρ = 0): distance",
            f"{soft['distance'][0]:.2f} → {soft['distance'][-1]:.2f} (λ = {soft['lam']:.2f}, ψ = {soft['psi']:.2f})",
            "softmax heads also align with the centroids",
            soft["distance"][-1] < 0.25 * soft["distance"][0],
        )
    )
    fig, axes = new_figure()
    axes[0, 0].semilogy(results["k3"]["steps"], results["k3"]["distance"], label=f"K = 3, d = {k3_dim} (linear)")
    axes[0, 0].semilogy(soft["steps"], soft["distance"], label="K = 2, softmax heads")
    axes[0, 0].set(xlabel="SGD step", ylabel="distance to the centroids", title="K = 3 and softmax heads")
    axes[0, 0].legend()
    figures.append(save_figure(fig, folder / "k3_and_softmax.png"))

    # Closed forms against Monte Carlo.
    checks = []
    for sigma in sigmas:
        lam_unbiased = unbiased_temperature(sigma, mc_seq_len)
        lam_ctx = in_context_quantization_optimal_temperature(dim, sigma)
        c = {
            "sigma": sigma,
            "L": mc_seq_len,
            "unbiased_lambda": lam_unbiased,
            "unbiased_lambda_limit": 1 / (1 + 2 * sigma**2),
            "oracle_risk_mc": oracle_linear_attention_risk(dim, sigma, mc_seq_len, lam_unbiased, mc_sequences, seed),
            "oracle_risk_exact": oracle_linear_attention_risk_exact(dim, sigma, mc_seq_len, lam_unbiased),
            "oracle_risk_limit": oracle_risk_limit(dim, sigma),
            "ctx_lambda": lam_ctx,
            "ctx_risk_mc": in_context_quantization_risk(dim, sigma, mc_seq_len, lam_ctx, mc_sequences, seed),
            "ctx_risk_exact": in_context_quantization_risk_exact(dim, sigma, mc_seq_len, lam_ctx),
            "ctx_risk_limit": in_context_quantization_risk_limit(dim, sigma, lam_ctx),
            "oracle_quantizer_risk": oracle_quantizer_risk(dim, sigma),
        }
        c["ctx_ratio_to_oracle_quantizer"] = c["ctx_risk_limit"] / c["oracle_quantizer_risk"]
        checks.append(c)
        claims.append(
            Claim(
                f"Prop. 4.2: oracle T_lin risk, σ={sigma}, L={mc_seq_len}, unbiased λ={lam_unbiased:.3f} "
                "(MC / exact / limit)",
                f"{c['oracle_risk_mc']:.4f} / {c['oracle_risk_exact']:.4f} / {c['oracle_risk_limit']:.4f}",
                f"→ σ²(d−2) = {c['oracle_risk_limit']:.4f} as L → ∞ (MC within 3% of exact)",
                abs(c["oracle_risk_mc"] / c["oracle_risk_exact"] - 1) < 0.03,
            )
        )
        claims.append(
            Claim(
                f"Prop. 5.2: in-context quantizer, σ={sigma}, λ*={lam_ctx:.3f} (MC / exact / limit)",
                f"{c['ctx_risk_mc']:.4f} / {c['ctx_risk_exact']:.4f} / {c['ctx_risk_limit']:.4f}; "
                f"ratio to dσ²: {c['ctx_ratio_to_oracle_quantizer']:.3f}",
                f"below the oracle quantizer's dσ² = {c['oracle_quantizer_risk']:.3f} (MC within 3% of exact)",
                abs(c["ctx_risk_mc"] / c["ctx_risk_exact"] - 1) < 0.03 and c["ctx_ratio_to_oracle_quantizer"] < 1,
            )
        )
    results["closed_form_checks"] = checks

    # Figures 3 and 4: PCA of the inputs and of the outputs (trained T_lin; the parameter-free T_ctx).
    sigma = sigmas[0]
    centroids = orthonormal_centroids(dim, 2, make_generator(seed), dtype=torch.float32).double()
    tokens, labels = sample_gaussian_mixture(8, 128, centroids, sigma, make_generator(seed + 1))
    outputs = {
        "inputs X": tokens,
        "trained T_lin(X)": linear_attention_predictor(
            tokens, trained_heads["heads"].double(), unbiased_temperature(sigma, 128)
        ),
        "in-context T_ctx(X) (no parameters)": in_context_quantizer(
            tokens, in_context_quantization_optimal_temperature(dim, sigma)
        ),
    }
    fig, axes = new_figure(ncols=3, size=(4.0, 3.6))
    flat_inputs = tokens.reshape(-1, dim)
    for ax, (title, values) in zip(axes[0], outputs.items(), strict=True):
        coords = _pca_2d(values.reshape(-1, dim), flat_inputs)
        ax.scatter(coords[:, 0], coords[:, 1], c=labels.reshape(-1), s=4, cmap="coolwarm")
        ax.set(title=title, xlabel="PC 1 of the inputs", ylabel="PC 2 of the inputs")
    figures.append(save_figure(fig, folder / "fig3_fig4_pca.png"))
    results["pca_spread"] = {
        title: float((values.reshape(-1, dim) - centroids[labels.reshape(-1)]).norm(dim=-1).mean())
        for title, values in outputs.items()
    }

    results["seconds"] = clock.seconds()
    results["claims"] = [c.as_dict() for c in claims]
    write_json(folder / "results.json", results)
    write_summary(
        folder / "summary.md",
        "Attention-based clustering (Maulen-Soto, Marion, Boyer)",
        claims,
        command=format_command("clustering", options),
        figures=figures,
        notes=[
            "Distance: min over signed permutations of the Frobenius distance between the heads and the centroids.",
            "Closed forms are derived in experiments/README.md (clustering section); MC = Monte Carlo.",
            "Mean distance of each output to its token's centroid (PCA figure): "
            + ", ".join(f"{k}: {v:.3f}" for k, v in results["pca_spread"].items()),
            f"Wall time {results['seconds']:.0f} s.",
        ],
    )
    return results
