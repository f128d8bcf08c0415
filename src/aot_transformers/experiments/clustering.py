"""Attention-based clustering (Maulen-Soto, Marion, Boyer 2025; `../shared/papers/attention-based-clustering.txt`).

Data (P_σ), Section 2: tokens X_ℓ = μ*_{Z_ℓ} + σξ_ℓ with Z_ℓ uniform over K orthonormal centroids (the paper's
μ₀* = e_d, μ₁* = −e₁; App. G.4's e₁, e₄, e₆ for K = 3; App. G.2 draws them uniformly on the sphere).

Predictors (tokens as rows):

- `linear_attention_predictor` — T_lin of Eqs. (3)–(4): one head per row μ_k with query = key = μ_k and identity
  values, H(X)_ℓ = (2λ/L) Σ_m ⟨μ_k, X_ℓ⟩⟨μ_k, X_m⟩ X_m, T = Σ_k H_k. `values="projected"` (V = μ_k μ_kᵀ) is MSSA with
  rank-1 subspaces and φ linear, computed by `experiments.subspace.subspace_attention` — the link to AoT.
- `softmax_attention_predictor` — App. H, Eq. (34): Σ_k softmax_m(λ⟨μ_k, X_ℓ⟩⟨μ_k, X_m⟩) X_m − (ψ/L) Σ_m X_m,
  identity values, every token (itself included) visible, λ and ψ learned (PSGD_soft of App. F.1).
- `in_context_quantizer` — T_ctx of Eq. (12): (2λ/L) Σ_m ⟨X_ℓ, X_m⟩ X_m, `subspace_attention` with U = I.

Training is projected SGD on the spheres (PSGD, App. F.1; the Euclidean variant of App. G.3 with
`riemannian=False`), vectorised over independent runs (seeds × regularisation strengths). One deviation: the paper's
h (Eq. 28) scores the first token of each sequence; here every position of the sequence is scored (the tokens are
exchangeable, so the expected gradient is the same; its variance is lower, so the SGD plateaus sit lower).

The closed forms are in `clustering_theory`; this module holds the data, predictors, training loop and one
function per figure or claim. `run` writes results.json, summary.md and the figures.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from . import clustering_theory as theory
from ._common import (
    Option,
    Stopwatch,
    Study,
    check_choice,
    check_int,
    check_real,
    make_generator,
    new_figure,
    resolve_options,
)
from .clustering_theory import VALUES, _check_mixture
from .subspace import subspace_attention

INITS = ("manifold", "manifold_tilde", "sphere")
PREDICTORS = ("linear", "softmax")
REGULARISERS = ("pairwise", "product", "softmax", "softmax_squared")
CENTROIDS = ("canonical", "random")


# --------------------------------------------------------------------------------------------------------------------
# Data.
# --------------------------------------------------------------------------------------------------------------------


def canonical_centroids(dim: int, num_clusters: int = 2, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The paper's centroids as rows (K, d): μ₀* = e_d, μ₁* = −e₁ (App. F.2, G.1); e₁, e₄, e₆ for K = 3 (G.4)."""
    _check_mixture(dim, num_clusters, 0.0)
    if num_clusters > 3 or (num_clusters == 3 and dim < 6) or (num_clusters == 2 and dim < 2):
        return orthonormal_centroids(dim, num_clusters, make_generator(0), dtype)
    eye = torch.eye(dim, dtype=dtype)
    if num_clusters == 1:
        return eye[-1:].clone()
    if num_clusters == 2:
        return torch.stack([eye[-1], -eye[0]])
    return torch.stack([eye[0], eye[3], eye[5]])


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
    """(P_σ): sequences of i.i.d. tokens X_ℓ = μ*_{Z_ℓ} + σξ_ℓ with Z_ℓ uniform over the K centroids.

    Args:
        num_sequences: B.
        seq_len: L.
        centroids: μ* as rows, (K, d), or (R, K, d) for R independent runs with their own centroids.
        sigma: σ >= 0.
        generator: Random generator.

    Returns:
        `tokens` (B, L, d) — or (R, B, L, d) — in the centroids' dtype, and `labels` (B, L) — or (R, B, L).
    """
    check_int("num_sequences", num_sequences)
    check_int("seq_len", seq_len)
    num_clusters, dim = centroids.shape[-2:]
    _check_mixture(dim, num_clusters, sigma)
    lead = centroids.shape[:-2]
    labels = torch.randint(num_clusters, (*lead, num_sequences, seq_len), generator=generator)
    noise = torch.randn(*lead, num_sequences, seq_len, dim, generator=generator, dtype=centroids.dtype)
    if lead:
        runs = torch.arange(lead[0])[:, None, None]
        means = centroids[runs, labels]
    else:
        means = centroids[labels]
    return means + sigma * noise, labels


# --------------------------------------------------------------------------------------------------------------------
# Predictors, risk, regularisers, distances.
# --------------------------------------------------------------------------------------------------------------------


def _coordinates(tokens: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """⟨μ_k, X_ℓ⟩ as (..., L, K) for heads (K, d) with tokens (B, L, d), or heads (R, K, d) with tokens (R, B, L, d).

    Per-run heads multiply all of a run's B·L tokens in one matrix product (broadcasting over B runs B·R tiny ones).
    """
    heads = heads.to(tokens.dtype)
    if heads.dim() == 2:
        return tokens @ heads.T
    runs, batch, length, dim = tokens.shape
    return (tokens.reshape(runs, batch * length, dim) @ heads.transpose(-1, -2)).reshape(runs, batch, length, -1)


def linear_attention_predictor(
    tokens: torch.Tensor, heads: torch.Tensor, lam: float | torch.Tensor, values: str = "identity"
) -> torch.Tensor:
    """T_lin of Eqs. (3)–(4): Σ_k (2λ/L) Σ_m ⟨μ_k, X_ℓ⟩⟨μ_k, X_m⟩ V_k(X_m), one head per row of `heads`.

    Args:
        tokens: X (B, L, d), or (R, B, L, d) with heads (R, K, d).
        heads: μ (K, d) or (R, K, d).
        lam: λ (a float, or a tensor broadcasting against (R, 1, 1, 1)).
        values: `"identity"` (V = I, the paper's predictor) or `"projected"` (V_k = μ_k μ_kᵀ: MSSA with rank-1
            subspaces and φ linear, through `subspace_attention`; heads (K, d) only).

    Returns:
        T_lin(X), the shape of `tokens`.
    """
    check_choice("values", values, VALUES)
    scaling = 2 * lam / tokens.shape[-2]
    if values == "projected":
        if heads.dim() != 2:
            raise ValueError(f"`values='projected'` takes heads of shape (K, d), got {tuple(heads.shape)}.")
        return subspace_attention(tokens, heads.unsqueeze(-1).to(tokens.dtype), phi="linear", scaling=scaling)
    coordinates = _coordinates(tokens, heads)  # (..., L, K): ⟨μ_k, X_ℓ⟩
    # Σ_k Σ_m ⟨μ_k, X_ℓ⟩⟨μ_k, X_m⟩ X_m = C (Cᵀ X) with C = coordinates: the L × L score matrix C Cᵀ is never formed
    # (linear φ), so a step costs O(L·K·d) per sequence instead of O(L²·(K + d)).
    return scaling * coordinates @ (coordinates.transpose(-1, -2) @ tokens)


def softmax_attention_predictor(
    tokens: torch.Tensor, heads: torch.Tensor, lam: float | torch.Tensor, psi: float | torch.Tensor
) -> torch.Tensor:
    """App. H, Eqs. (30)–(34): Σ_k softmax_m(λ⟨μ_k, X_ℓ⟩⟨μ_k, X_m⟩) X_m − (ψ/L) Σ_m X_m.

    Identity values, every token visible (itself included), the centering ψ/L Σ_m X_m of the "shaped attention" of
    Eq. (34): without it a misaligned head returns the sequence mean (Remark H.1). ψ = 2 debiases both heads.

    Args:
        tokens: X (B, L, d) or (R, B, L, d).
        heads: μ (K, d) or (R, K, d).
        lam: Inverse temperature λ (float or tensor broadcasting against (R, 1, 1, 1)).
        psi: Centering ψ (same).

    Returns:
        The shape of `tokens`.
    """
    coordinates = _coordinates(tokens, heads).transpose(-1, -2)  # (..., K, L)
    lam_ = lam[..., None] if isinstance(lam, torch.Tensor) and lam.dim() else lam  # broadcast over the head axis
    scores = lam_ * coordinates.unsqueeze(-1) * coordinates.unsqueeze(-2)  # (..., K, L, L)
    attended = torch.softmax(scores, dim=-1).sum(-3) @ tokens  # Σ_k softmax(·) X
    return attended - psi * tokens.mean(-2, keepdim=True)


def in_context_quantizer(tokens: torch.Tensor, lam: float) -> torch.Tensor:
    """T_ctx of Eq. (12): (2λ/L) Σ_m ⟨X_ℓ, X_m⟩ X_m, attention with Q = K = V = I (the subspace U = I, φ linear)."""
    identity = torch.eye(tokens.shape[-1], dtype=tokens.dtype).unsqueeze(0)  # (1, d, d)
    return subspace_attention(tokens, identity, phi="linear", scaling=2.0 * lam / tokens.shape[-2])


def reconstruction_risk(tokens: torch.Tensor, prediction: torch.Tensor) -> torch.Tensor:
    """Eq. (5): ‖X_ℓ − T(X)_ℓ‖² averaged over positions and sequences; per run for (R, B, L, d) inputs."""
    errors = (tokens - prediction).square().sum(-1)
    return errors.mean() if tokens.dim() == 3 else errors.mean((-1, -2))


def centroid_regulariser(tokens: torch.Tensor, heads: torch.Tensor, kind: str = "pairwise") -> torch.Tensor:
    """The regularisers, empirical over the tokens (per run for (R, B, L, d) inputs).

    - `"pairwise"`: r = E[⟨μ₀, X⟩²⟨μ₁, X⟩²] (Eq. 17, Section 3.3); for K heads r⁽¹⁾ = Σ_{i<j} (App. G.4).
    - `"product"`: r⁽²⁾ = E[Π_i ⟨μ_i, X⟩²] (App. G.4).
    - `"softmax"`: r₀ = E[(⟨μ₀, X⟩ − 1)²(⟨μ₁, X⟩ − 1)²] + ⟨μ₀, μ₁⟩ (App. H, problem (P_ρ₀)), as printed.
    - `"softmax_squared"`: the same with ⟨μ₀, μ₁⟩² — a deviation. With the printed, unsquared term the objective
      is lower with anti-parallel heads than at the centroids (measured at σ = 0.3, ρ₀ = 0.5: 0.081 at the point
      PSGD_soft reaches, ⟨μ₀, μ₁⟩ = −0.89, against 0.397 at the centroids with the best λ, ψ), so Fig. 15 cannot
      come from it; squared, the term only asks for orthogonal heads, which the centroids are.
    """
    check_choice("kind", kind, REGULARISERS)
    coordinates = _coordinates(tokens, heads)  # (..., L, K)
    if kind == "pairwise":
        squared = coordinates.square()
        value = 0.5 * (squared.sum(-1).square() - squared.square().sum(-1))  # Σ_{i<j} a_i a_j
    elif kind == "product":
        value = coordinates.square().prod(-1)
    else:
        value = (coordinates[..., 0] - 1).square() * (coordinates[..., 1] - 1).square()
    value = value.mean((-1, -2))
    if kind.startswith("softmax"):
        inner = (heads[..., 0, :] * heads[..., 1, :]).sum(-1).to(value.dtype)
        value = value + (inner if kind == "softmax" else inner.square())
    return value


def _assignment_cost(heads: torch.Tensor, centroids: torch.Tensor, signed: bool) -> torch.Tensor:
    """min over permutations of Σ_k cost(μ_k, μ*_π(k)); heads, centroids (..., K, d) → (...)."""
    heads, centroids = heads.detach().to(torch.float64), centroids.to(torch.float64)
    inner = heads @ centroids.transpose(-1, -2)
    # ‖a − s b‖² = ‖a‖² + ‖b‖² − 2s⟨a, b⟩; the best sign gives −2|⟨a, b⟩|.
    cost = heads.square().sum(-1)[..., :, None] + centroids.square().sum(-1)[..., None, :]
    cost = cost - 2 * (inner if signed else inner.abs())
    num = heads.shape[-2]
    totals = [sum(cost[..., k, perm[k]] for k in range(num)) for perm in itertools.permutations(range(num))]
    return torch.stack(totals).min(0).values.clamp(min=0.0).sqrt()


def centroid_distance(heads: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Eq. (11): min over permutations π and signs s of (Σ_k ‖μ_k − s_k μ*_π(k)‖²)^{1/2}; batched over leading dims.

    The linear risk cannot tell μ_k from −μ_k (μ_k enters every head twice) nor the heads apart (they are summed).
    """
    if heads.shape[-2:] != centroids.shape[-2:]:
        raise ValueError(f"`heads` {tuple(heads.shape)} and `centroids` {tuple(centroids.shape)} must have one shape.")
    return _assignment_cost(heads, centroids, signed=False)


def signed_centroid_distance(heads: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Eq. (36) of App. H: √min{‖μ̂₀ − μ₀*‖² + ‖μ̂₁ − μ₁*‖², ‖μ̂₀ − μ₁*‖² + ‖μ̂₁ − μ₀*‖²} — sign flips count.

    The softmax heads are not sign-symmetric (the centering and r₀ break the symmetry), so this finer distance.
    """
    if heads.shape[-2:] != centroids.shape[-2:]:
        raise ValueError(f"`heads` {tuple(heads.shape)} and `centroids` {tuple(centroids.shape)} must have one shape.")
    return _assignment_cost(heads, centroids, signed=True)


# --------------------------------------------------------------------------------------------------------------------
# Initialisation and projected SGD.
# --------------------------------------------------------------------------------------------------------------------


def initial_heads(centroids: torch.Tensor, init: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """Starting heads on the unit spheres, (K, d) or (R, K, d) like `centroids`.

    - `"manifold"`: a random point of M (Eq. 9): μ_k ⟂ μ_j* for j ≠ k and the heads mutually orthogonal, drawn as
      Gaussian vectors projected (Gram–Schmidt) off the other centroids and the previous heads, then normalised.
    - `"manifold_tilde"`: a random point of M̃ (Eq. 16, App. A): only μ_k ⟂ μ_j* for j ≠ k.
    - `"sphere"`: independent uniform points on the sphere.
    """
    check_choice("init", init, INITS)
    num, dim = centroids.shape[-2:]
    heads = torch.randn(*centroids.shape, generator=generator, dtype=centroids.dtype)
    if init == "sphere":
        return heads / heads.norm(dim=-1, keepdim=True)
    rows = []
    for k in range(num):
        avoid = [centroids[..., j, :] for j in range(num) if j != k]
        if init == "manifold":
            avoid += rows
        vector = heads[..., k, :]
        basis: list[torch.Tensor] = []
        for direction in avoid:  # orthonormalise what to avoid, then project it out
            for b in basis:
                direction = direction - (direction * b).sum(-1, keepdim=True) * b
            direction = direction / direction.norm(dim=-1, keepdim=True)
            basis.append(direction)
            vector = vector - (vector * direction).sum(-1, keepdim=True) * direction
        rows.append(vector / vector.norm(dim=-1, keepdim=True))
    return torch.stack(rows, dim=-2)


def heads_on_manifold(centroids: torch.Tensor, kappas: Sequence[float]) -> torch.Tensor:
    """Heads on M (Eq. 9) with κ_k = ⟨μ_k*, μ_k⟩: μ_k = κ_k μ_k* + √(1 − κ_k²) v_k, v_k orthonormal ⟂ the centroids."""
    num, dim = centroids.shape
    if dim < 2 * num:
        raise ValueError(f"`dim` must be >= 2K = {2 * num} to place heads on M with |κ| < 1, got {dim}.")
    full, _ = torch.linalg.qr(torch.cat([centroids.T, torch.eye(dim, dtype=centroids.dtype)], dim=1))
    complement = full[:, num : 2 * num].T  # (K, d), orthonormal and ⟂ the centroids
    kappa = torch.tensor([float(k) for k in kappas], dtype=centroids.dtype)[:, None]
    return kappa * centroids + (1 - kappa.square()).clamp(min=0).sqrt() * complement


def projected_sgd_step(heads: torch.Tensor, grad: torch.Tensor, lr: float, riemannian: bool = True) -> torch.Tensor:
    """One step of PSGD (App. F.1), or of the Euclidean projected SGD of App. G.3 with `riemannian=False`.

    Riemannian: the gradient is projected on each sphere's tangent space (I − μμᵀ)g; both then step and retract
    onto the sphere by normalisation.
    """
    if riemannian:
        grad = grad - (grad * heads).sum(-1, keepdim=True) * heads
    moved = heads - lr * grad
    return moved / moved.norm(dim=-1, keepdim=True)


def riemannian_sgd_step(heads: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
    """The (PSGD) update of App. F.1: `projected_sgd_step` with the tangent projection."""
    return projected_sgd_step(heads, grad, lr, riemannian=True)


def train_heads(
    dim: int = 5,
    num_clusters: int = 2,
    sigma: float = 0.3,
    lam: float = 0.6,
    seq_len: int = 30,
    lr: float = 0.01,
    batch_size: int = 256,
    steps: int = 10_000,
    rho: float | Sequence[float] = 0.0,
    runs: int = 1,
    init: str = "manifold",
    predictor: str = "linear",
    regulariser: str = "pairwise",
    riemannian: bool = True,
    centroids: str = "canonical",
    psi: float = 2.0,
    record_every: int = 100,
    seed: int = 0,
) -> dict[str, Any]:
    """Learn the heads without labels by projected SGD on fresh batches of risk + ρ · regulariser (App. F.1).

    Independent runs are vectorised: one per (ρ, seed) pair, each with its own initialisation and data.

    Args:
        dim: d.
        num_clusters: K (number of centroids and of heads).
        sigma: Noise σ >= 0.
        lam: λ (fixed for T_lin; the initial value, learned, for softmax heads — App. H uses 3).
        seq_len: L.
        lr: Step size γ.
        batch_size: Sequences per step M.
        steps: PSGD iterations.
        rho: ρ >= 0, or a list of them (one group of `runs` runs per value).
        runs: Independent runs per ρ.
        init: `"manifold"` (M, Eq. 9), `"manifold_tilde"` (M̃, Eq. 16) or `"sphere"`.
        predictor: `"linear"` (T_lin) or `"softmax"` (App. H; λ and ψ learned by plain SGD, PSGD_soft).
        regulariser: `"pairwise"` (r, r⁽¹⁾), `"product"` (r⁽²⁾) or `"softmax"` (r₀); see `centroid_regulariser`.
        riemannian: Tangent-projected gradient (PSGD) or the Euclidean one (App. G.3).
        centroids: `"canonical"` (the paper's e_d, −e₁, …) or `"random"` (uniform on the sphere, App. G.2).
        psi: Initial centering ψ of softmax heads (App. F.1: 2).
        record_every: Record the distance every this many steps.
        seed: Seed of initialisation and data.

    Returns:
        `steps` (records), `distance` (records × runs, Eq. 11, or Eq. 36 for softmax heads), `rho` per run,
        `final` (per-run final distances), `heads`, `centroids`, `lam`, `psi` (per run), `seconds`.
    """
    _check_mixture(dim, num_clusters, sigma)
    lam = check_real("lam", lam, 0.0, open_min=True)
    rhos = [check_real("rho", r, 0.0) for r in (rho if isinstance(rho, Sequence) else [rho])]
    lr = check_real("lr", lr, 0.0, open_min=True)
    for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("steps", steps), ("runs", runs)):
        check_int(name, value)
    check_int("record_every", record_every)
    check_choice("predictor", predictor, PREDICTORS)
    check_choice("regulariser", regulariser, REGULARISERS)
    check_choice("centroids", centroids, CENTROIDS)
    if (predictor == "softmax" or regulariser.startswith("softmax")) and num_clusters != 2:
        raise ValueError(f"softmax heads and r₀ are defined for K = 2 (App. H), got `num_clusters` = {num_clusters}.")
    if init == "manifold" and dim < 2 * num_clusters - 1:
        raise ValueError(f"`init='manifold'` needs d >= 2K − 1 = {2 * num_clusters - 1}, got d = {dim}.")
    generator = make_generator(seed)
    total = len(rhos) * runs
    rho_t = torch.tensor([r for r in rhos for _ in range(runs)], dtype=torch.float32)
    if centroids == "canonical":
        mu_star = canonical_centroids(dim, num_clusters, torch.float32).expand(total, -1, -1).contiguous()
    else:
        mu_star = torch.randn(total, num_clusters, dim, generator=generator)
        mu_star = mu_star / mu_star.norm(dim=-1, keepdim=True)
    heads = initial_heads(mu_star, init, generator)
    lam_t = torch.full((total, 1, 1, 1), lam, requires_grad=predictor == "softmax")
    psi_t = torch.full((total, 1, 1, 1), float(psi), requires_grad=predictor == "softmax")
    distance = signed_centroid_distance if predictor == "softmax" else centroid_distance
    history: dict[str, list] = {"steps": [], "distance": []}
    clock = Stopwatch()
    for step in range(steps + 1):
        if step % record_every == 0 or step == steps:
            history["steps"].append(step)
            history["distance"].append(distance(heads, mu_star).tolist())
        if step == steps:
            break
        tokens, _ = sample_gaussian_mixture(batch_size, seq_len, mu_star, sigma, generator)
        heads_var = heads.clone().requires_grad_(True)
        if predictor == "linear":
            prediction = linear_attention_predictor(tokens, heads_var, lam)
        else:
            prediction = softmax_attention_predictor(tokens, heads_var, lam_t, psi_t)
        loss = reconstruction_risk(tokens, prediction)
        if bool((rho_t > 0).any()):
            loss = loss + rho_t * centroid_regulariser(tokens, heads_var, regulariser)
        params = [heads_var] + ([lam_t, psi_t] if predictor == "softmax" else [])
        grads = torch.autograd.grad(loss.sum(), params)  # runs are independent: the sum keeps their gradients apart
        with torch.no_grad():
            heads = projected_sgd_step(heads, grads[0], lr, riemannian)
            if predictor == "softmax":
                lam_t -= lr * grads[1]
                psi_t -= lr * grads[2]
    return {
        **history,
        "rho": rho_t.tolist(),
        "final": history["distance"][-1],
        "heads": heads,
        "centroids": mu_star,
        "lam": lam_t.detach().flatten().tolist(),
        "psi": psi_t.detach().flatten().tolist(),
        "seconds": clock.seconds(),
    }


def percentile_band(values: Sequence[float] | torch.Tensor) -> dict[str, float]:
    """Median and the 2.5 / 97.5 percentiles over runs (the paper's "95% percentile intervals", 10 runs)."""
    t = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    q = torch.quantile(t, torch.tensor([0.025, 0.5, 0.975], dtype=torch.float64))
    return {"low": float(q[0]), "median": float(q[1]), "high": float(q[2])}


# --------------------------------------------------------------------------------------------------------------------
# Monte Carlo estimates of the closed forms.
# --------------------------------------------------------------------------------------------------------------------


def monte_carlo_risk(
    predict, centroids: torch.Tensor, sigma: float, seq_len: int, num_sequences: int, seed: int = 0
) -> tuple[float, float]:
    """Monte Carlo risk (Eq. 5) of `predict(tokens)`: mean over sequences and its 4-standard-error tolerance."""
    check_int("num_sequences", num_sequences)
    tokens, _ = sample_gaussian_mixture(num_sequences, seq_len, centroids, sigma, make_generator(seed))
    per_sequence = (tokens - predict(tokens)).square().sum(-1).mean(-1)  # (B,): one i.i.d. value per sequence
    return theory.monte_carlo_tolerance(per_sequence)


def monte_carlo_conditional_moments(
    predict, centroids: torch.Tensor, sigma: float, seq_len: int, num_sequences: int, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """E[⟨T(X)₁, μ*_c⟩ | Z₁ = c] and E‖T(X)₁ − m μ*_c‖² of the first token, with 4-standard-error tolerances.

    The first token of each sequence gives i.i.d. samples; `m` is the closed-form factor the caller compares with.
    Returns the projection samples' mean and the raw outputs for the variance check.
    """
    tokens, labels = sample_gaussian_mixture(num_sequences, seq_len, centroids, sigma, make_generator(seed))
    first = predict(tokens)[:, 0]  # (B, d)
    own = centroids[labels[:, 0]]  # (B, d)
    projection = (first * own).sum(-1)
    return {"projection": theory.monte_carlo_tolerance(projection), "outputs": (first, own)}


# --------------------------------------------------------------------------------------------------------------------
# The study: one function per figure or claim.
# --------------------------------------------------------------------------------------------------------------------

PARTS = (
    "theory",
    "fig1",
    "fig2",
    "fig3_4",
    "appendix_a",
    "fig6a",
    "high_dim",
    "dimension",
    "euclidean",
    "k3",
    "softmax",
)

OPTIONS = (
    Option("parts", list(PARTS), "which figures and claims to run", many=True, choices=PARTS),
    Option("dim", 5, "d of Figs 1-2, 5-6, 13-15 (App. F.2: 5)", minimum=2),
    Option("seq_len", 30, "L of the training runs (App. F.2: 30)", minimum=2),
    Option("sigmas", [0.3, 1.0], "σ values (Figs 1, 2b, 13, 15)", many=True, minimum=0.0),
    Option("lams", [0.6, 0.2], "λ for each σ (App. F.2)", many=True, minimum=0.0, open_min=True),
    Option("lr", 0.01, "PSGD step size γ", minimum=0.0, open_min=True),
    Option("batch_size", 256, "sequences per step M", minimum=1),
    Option("steps", 10_000, "PSGD iterations of the convergence curves (Figs 1, 2b, 5, 6b, 13, 14, 15b)", minimum=1),
    Option("sweep_steps", 5000, "PSGD iterations per point of the ρ sweeps (Figs 2a, 6a, 15a)", minimum=1),
    Option("runs", 10, "independent runs per curve (the paper: 10)", minimum=1),
    Option("rho", 0.2, "ρ of Fig. 2b, 13b and the K = 3 runs", minimum=0.0),
    Option("num_rhos", 30, "ρ values of Fig. 2a, linearly spaced in [0, rho_max]", minimum=2),
    Option("rho_max", 3.0, "largest ρ of Fig. 2a (the paper: 3)", minimum=0.0, open_min=True),
    Option("softmax_rhos", [0.0, 0.1, 0.25, 0.5, 1.0, 2.0], "ρ₀ values of Fig. 15a", many=True, minimum=0.0),
    Option(
        "softmax_regulariser",
        "softmax",
        "r₀ of Fig. 15: softmax (as printed, + ⟨μ₀, μ₁⟩) or softmax_squared (+ ⟨μ₀, μ₁⟩², see centroid_regulariser)",
        choices=("softmax", "softmax_squared"),
    ),
    Option("degenerate_num_rhos", 15, "ρ values of Fig. 6a (σ = 0), linearly spaced in [0, 0.3]", minimum=2),
    Option("dims", [4, 10, 25, 50, 100], "d values of the dimension sweeps (Figs 9, 10, 12)", many=True, minimum=4),
    Option("appendix_g_sigmas", [0.0, 0.3, 1.0], "σ panels of App. G (Figs 7-12)", many=True, minimum=0.0),
    Option(
        "appendix_g_lams",
        [0.6, 0.6, 0.2],
        "λ for each App. G σ (G.1: 0.6, 0.6, 0.2)",
        many=True,
        minimum=0.0,
        open_min=True,
    ),
    Option("high_dim", 100, "d of Figs 7-8 (G.1: 100)", minimum=4),
    Option("random_dim", 50, "d of Fig. 11, random centroids (G.2: 50)", minimum=4),
    Option("mc_sequences", 4000, "Monte Carlo sequences per closed-form check", minimum=2),
    Option("seed", 0, "random seed", minimum=0),
)

TITLE = "Attention-based clustering (Maulen-Soto, Marion, Boyer)"


def _band_plot(ax, run: dict[str, Any], columns: Sequence[int], label: str) -> None:
    distances = torch.tensor(run["distance"], dtype=torch.float64)[:, list(columns)]
    q = torch.quantile(distances.clamp(min=1e-16), torch.tensor([0.025, 0.5, 0.975], dtype=torch.float64), dim=1)
    (line,) = ax.semilogy(run["steps"], q[1], label=label)
    ax.fill_between(run["steps"], q[0], q[2], color=line.get_color(), alpha=0.2)


def _curve_record(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "steps": run["steps"],
        "median_distance": [percentile_band(row)["median"] for row in run["distance"]],
        "final": percentile_band(run["final"]),
        "seconds": run["seconds"],
    }


def _train(o: dict[str, Any], sigma: float, lam: float, **kwargs: Any) -> dict[str, Any]:
    settings = dict(
        dim=o["dim"],
        sigma=sigma,
        lam=lam,
        seq_len=o["seq_len"],
        lr=o["lr"],
        batch_size=o["batch_size"],
        steps=o["steps"],
        runs=o["runs"],
        record_every=max(1, o["steps"] // 50),
        seed=o["seed"],
    )
    settings.update(kwargs)
    return train_heads(**settings)


def figure1(study: Study, o: dict[str, Any]) -> None:
    """Theorem 3.4 / Fig. 1: from a random point of M, PSGD on R alone (ρ = 0) converges to (±μ₀*, ±μ₁*)."""
    fig, axes = new_figure()
    record = {}
    for sigma, lam in zip(o["sigmas"], o["lams"], strict=True):
        lam_star = theory.critical_temperature(o["dim"], sigma, o["seq_len"])
        run = _train(o, sigma, lam, rho=0.0, init="manifold")
        record[f"sigma={sigma}"] = {**_curve_record(run), "lambda_star": lam_star}
        _band_plot(axes[0, 0], run, range(o["runs"]), f"σ = {sigma}, λ = {lam}")
        final = percentile_band(run["final"])
        study.claim(
            f"Thm 3.4 / Fig. 1: init on M, ρ = 0, σ = {sigma}, λ = {lam} (λ* = {lam_star:.3f}); final distance",
            f"median {final['median']:.1e} [{final['low']:.1e}, {final['high']:.1e}] after {o['steps']} steps",
            "converges to (±μ₀*, ±μ₁*): plateau ≈ 1e-2 (σ = 0.3), ≈ 1e-1 (σ = 1)",
            final["high"] < 0.1 * percentile_band(run["distance"][0])["median"] and lam <= lam_star,
        )
    study.results["figure1"] = record
    axes[0, 0].set(
        xlabel="PSGD iteration", ylabel="distance to the centroids (Eq. 11)", title="Fig. 1: init on M, ρ = 0"
    )
    axes[0, 0].legend()
    study.save(fig, "fig1_manifold_init.png")


def figure2(study: Study, o: dict[str, Any]) -> None:
    """Section 3.3 / Fig. 2: from the sphere, R + ρ r; (a) ρ sweep after `sweep_steps`, (b) ρ = `rho` over time."""
    rhos = torch.linspace(0, o["rho_max"], o["num_rhos"]).tolist()
    fig, axes = new_figure(ncols=2)
    record: dict[str, Any] = {"rhos": rhos}
    for sigma, lam in zip(o["sigmas"], o["lams"], strict=True):
        sweep = _train(o, sigma, lam, rho=rhos, init="sphere", steps=o["sweep_steps"], record_every=o["sweep_steps"])
        finals = torch.tensor(sweep["final"]).reshape(len(rhos), o["runs"])
        bands = [percentile_band(row) for row in finals]
        medians = [b["median"] for b in bands]
        axes[0, 0].semilogy(rhos, medians, marker=".", label=f"σ = {sigma}")
        axes[0, 0].fill_between(rhos, [b["low"] for b in bands], [b["high"] for b in bands], alpha=0.2)
        best = int(torch.tensor(medians).argmin())
        curve = _train(o, sigma, lam, rho=o["rho"], init="sphere")
        _band_plot(axes[0, 1], curve, range(o["runs"]), f"σ = {sigma}")
        record[f"sigma={sigma}"] = {"sweep": bands, "curve": _curve_record(curve)}
        final = percentile_band(curve["final"])
        study.claim(
            f"Fig. 2a: σ = {sigma}, median distance after {o['sweep_steps']} steps at ρ = 0 / "
            f"best ρ = {rhos[best]:.2f} / ρ = {rhos[-1]:.1f}",
            f"{medians[0]:.1e} / {medians[best]:.1e} / {medians[-1]:.1e}",
            "a moderate ρ recovers the centroids; too large a ρ overrides the risk (worse at σ = 1)",
            medians[best] < 0.1 * medians[0],
        )
        study.claim(
            f"Fig. 2b: init on the sphere, ρ = {o['rho']}, σ = {sigma}; final distance",
            f"median {final['median']:.1e} [{final['low']:.1e}, {final['high']:.1e}] after {o['steps']} steps",
            "linear convergence, plateau ≈ 1e-3 (σ = 0.3), ≈ 1e-1 (σ = 1)",
            final["high"] < 0.2,
        )
    study.results["figure2"] = record
    axes[0, 0].set(xlabel="ρ", ylabel="distance after the sweep", title="Fig. 2a: ρ sweep (init on the sphere)")
    axes[0, 1].set(xlabel="PSGD iteration", ylabel="distance (Eq. 11)", title=f"Fig. 2b: ρ = {o['rho']}")
    axes[0, 0].legend()
    axes[0, 1].legend()
    study.save(fig, "fig2_regularised.png")


def _pca_2d(points: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Project `points` on the two leading principal directions of `reference` (both (N, d))."""
    mean = reference.mean(0)
    _, _, vh = torch.linalg.svd(reference - mean, full_matrices=False)
    return (points - mean) @ vh[:2].T


def figures3_4(study: Study, o: dict[str, Any]) -> None:
    """Figs 3–4 in the paper's setting: d = 10, σ = 0.3, L = 500, λ = 1/(1 + 2σ²), μ₀* = e₁₀, μ₁* = −e₁ (oracle μ*).

    Inputs, T_lin(X) at μ = μ* (Fig. 3) and T_ctx(X) (Fig. 4), projected on the inputs' two principal directions;
    the measured conditional variances beside Props 4.2 / 5.2 (finite-L exact values and their limits).
    """
    dim, sigma, length = 10, 0.3, 500
    lam = 1 / (1 + 2 * sigma**2)
    centroids = canonical_centroids(dim)
    tokens, labels = sample_gaussian_mixture(4, length, centroids, sigma, make_generator(o["seed"] + 3))
    outputs = {
        "inputs X": tokens,
        "Fig. 3: T_lin(X) at μ = μ*": linear_attention_predictor(tokens, centroids, lam),
        "Fig. 4: T_ctx(X)": in_context_quantizer(tokens, lam),
    }
    fig, axes = new_figure(ncols=3, size=(4.0, 3.6))
    flat = tokens.reshape(-1, dim)
    spread = {}
    for ax, (title, values) in zip(axes[0], outputs.items(), strict=True):
        coords = _pca_2d(values.reshape(-1, dim), flat)
        ax.scatter(coords[:, 0], coords[:, 1], c=labels.reshape(-1), s=3, cmap="coolwarm")
        ax.set(title=title, xlabel="PC 1 of the inputs", ylabel="PC 2 of the inputs")
        spread[title] = float((values.reshape(-1, dim) - centroids[labels.reshape(-1)]).square().sum(-1).mean())
    study.save(fig, "fig3_fig4_pca.png")
    expected = {
        "inputs X": dim * sigma**2,
        "Fig. 3: T_lin(X) at μ = μ*": theory.oracle_conditional_variance(dim, sigma, length, lam),
        "Fig. 4: T_ctx(X)": theory.in_context_conditional_variance(dim, sigma, length, lam),
    }
    study.results["figures3_4"] = {"setting": dict(d=dim, sigma=sigma, L=length, lam=lam), "spread": spread}
    study.claim(
        "Figs 3–4 (d = 10, σ = 0.3, L = 500, λ = 1/(1+2σ²)): E‖output − μ*_Z‖², inputs / T_lin / T_ctx",
        " / ".join(f"{v:.3f}" for v in spread.values())
        + " (closed forms "
        + " / ".join(f"{v:.3f}" for v in expected.values())
        + ")",
        "the embeddings contract towards the centroids: variance 2σ²-ish ≪ dσ² (Props 4.2, 5.2)",
        spread["Fig. 3: T_lin(X) at μ = μ*"] < spread["inputs X"] and spread["Fig. 4: T_ctx(X)"] < spread["inputs X"],
    )


def theory_checks(study: Study, o: dict[str, Any]) -> None:
    """Closed forms against Monte Carlo (tolerance: 4 standard errors of the Monte Carlo mean).

    Lemma C.1 (risk on M at several κ), Prop. 3.3 / C.2 (λ* and its limits), Props 4.1/4.2 and 5.1/5.2 (means,
    variances, risks), Prop. A.1 (the degenerate risk off M).
    """
    dim, length, n = o["dim"], o["seq_len"], o["mc_sequences"]
    centroids = canonical_centroids(max(dim, 4))
    checks = []

    def check(name: str, paper: str, exact: float, mc: tuple[float, float]) -> None:
        holds = abs(mc[0] - exact) <= mc[1] + 1e-9
        checks.append({"quantity": name, "closed_form": exact, "monte_carlo": mc[0], "tolerance": mc[1]})
        study.claim(name, f"closed form {exact:.4f}, Monte Carlo {mc[0]:.4f} ± {mc[1]:.4f}", paper, holds)

    d4 = max(dim, 4)
    for sigma, lam in zip(o["sigmas"], o["lams"], strict=True):
        for kappas in ((1.0, 1.0), (0.6, -0.3)):
            heads = heads_on_manifold(centroids, kappas)
            check(
                f"Lemma C.1: risk on M at κ = {kappas}, σ = {sigma}, λ = {lam}, L = {length}, d = {d4}",
                "A(κ₀⁴+κ₁⁴) + B(κ₀²+κ₁²) + Cκ₀²κ₁² + D",
                theory.manifold_risk(*kappas, d4, sigma, length, lam),
                monte_carlo_risk(
                    lambda x, h=heads, la=lam: linear_attention_predictor(x, h, la),
                    centroids,
                    sigma,
                    length,
                    n,
                    o["seed"],
                ),
            )
        lam_u = theory.unbiased_temperature(sigma, length)
        moments = monte_carlo_conditional_moments(
            lambda x, la=lam_u: linear_attention_predictor(x, centroids, la), centroids, sigma, length, n, o["seed"]
        )
        check(
            f"Prop. 4.1: ⟨E[T_lin(X)₁ | Z₁ = c], μ*_c⟩ at the unbiased λ = {lam_u:.3f}, σ = {sigma}",
            "= 1",
            1.0,
            moments["projection"],
        )
        first, own = moments["outputs"]
        variance = (first - own).square().sum(-1)
        check(
            f"Prop. D.2 / 4.2: Var[T_lin(X)₁ | Z₁] at λ = {lam_u:.3f}, σ = {sigma}, L = {length}",
            f"limit 2λ²σ²(1+2σ²)² = {theory.oracle_conditional_variance_limit(sigma, lam_u):.4f}",
            theory.oracle_conditional_variance(d4, sigma, length, lam_u),
            theory.monte_carlo_tolerance(variance),
        )
        lam_c = theory.in_context_unbiased_temperature(d4, sigma, length)
        moments = monte_carlo_conditional_moments(
            lambda x, la=lam_c: in_context_quantizer(x, la), centroids, sigma, length, n, o["seed"] + 1
        )
        check(
            f"Prop. 5.1: ⟨E[T_ctx(X)₁ | Z₁ = c], μ*_c⟩ at the unbiased λ = {lam_c:.3f}, σ = {sigma}",
            "= 1",
            1.0,
            moments["projection"],
        )
        first, own = moments["outputs"]
        check(
            f"Prop. 5.2: Var[T_ctx(X)₁ | Z₁] at λ = {lam_c:.3f}, σ = {sigma}, L = {length} (exact finite L)",
            f"limit 2λ²σ²(1+4σ²+2dσ⁴) = {theory.in_context_conditional_variance_limit(d4, sigma, lam_c):.4f}",
            theory.in_context_conditional_variance(d4, sigma, length, lam_c),
            theory.monte_carlo_tolerance((first - own).square().sum(-1)),
        )
        lam_star = theory.critical_temperature(d4, sigma, length)
        limits = theory.critical_temperature_limits(sigma, length)
        study.claim(
            f"Prop. C.2: λ*(σ = {sigma}, L = {length}) = root of 2A + B + C; limits λ₀*, λ∞*",
            f"{lam_star:.4f} (root {theory.critical_temperature_root(d4, sigma, length):.4f}); "
            f"λ*(0, L) = {theory.critical_temperature(d4, 0.0, length):.4f}, "
            "λ*(σ, 10⁶) = "
            f"{theory.critical_temperature(d4, sigma, 10**6):.4f}",
            f"λ₀* = (L+1)/(L+3) = {limits['sigma_to_0']:.4f}, "
            f"λ∞* = (1+4σ²)/(1+5σ²+6σ⁴) = {limits['L_to_infinity']:.4f}",
            abs(theory.critical_temperature(d4, 0.0, length) - limits["sigma_to_0"]) < 1e-12
            and abs(theory.critical_temperature(d4, sigma, 10**6) - limits["L_to_infinity"]) < 1e-4,
        )
        ctx_limit = theory.in_context_optimal_risk_limit(d4, sigma)
        study.claim(
            f"Prop. 5.2: lim risk of T_ctx at the optimal λ, σ = {sigma}, d = {d4}, vs dσ² and σ²(d − 2)",
            f"{ctx_limit:.4f} vs {theory.oracle_quantizer_risk(d4, sigma):.4f} and "
            f"{theory.oracle_risk_limit(d4, sigma):.4f}",
            "σ²(d−2)(1+2σ²)/(1+6σ²+12σ⁴+4dσ⁶) ≤ σ²(d−2) < dσ²",
            ctx_limit <= theory.oracle_risk_limit(d4, sigma) < theory.oracle_quantizer_risk(d4, sigma) or sigma == 0,
        )
    # Prop. A.1 off the manifold (η ≠ 0) under (P₀).
    heads = torch.nn.functional.normalize(
        torch.tensor([[0.3, 0.2, 0.1, 0.0, 0.9], [-0.8, 0.1, 0.3, 0.2, 0.4]], dtype=torch.float64), dim=-1
    )
    c5 = canonical_centroids(5)
    inner = heads @ c5.T  # κ₀ = ⟨μ₀*, μ₀⟩, η₁ = ⟨μ₀, μ₁*⟩, η₀ = ⟨μ₁, μ₀*⟩, κ₁ = ⟨μ₁*, μ₁⟩
    lam0 = (length + 1) / (length + 3)
    tokens, _ = sample_gaussian_mixture(64, length, c5, 0.0, make_generator(o["seed"]))
    exact = theory.degenerate_risk(inner[0, 0], inner[1, 1], inner[1, 0], inner[0, 1], length, lam0)
    mc = theory.monte_carlo_tolerance(
        (tokens - linear_attention_predictor(tokens, heads, lam0)).square().sum(-1).mean(-1)
    )
    check("Prop. A.1: degenerate risk off M (σ = 0), λ = λ₀*", "Eq. (14)", float(exact), mc)
    study.results["theory"] = checks


def appendix_a(study: Study, o: dict[str, Any]) -> None:
    """App. A (σ = 0): Fig. 5a (init on M̃, ρ = 0: Theorem A.4), Fig. 5b (sphere, ρ = 0), Fig. 6b (sphere, ρ = 0.1)."""
    fig, axes = new_figure()
    record = {}
    for key, init, rho, label in (
        ("fig5a", "manifold_tilde", 0.0, "Fig. 5a: init on M̃, ρ = 0"),
        ("fig5b", "sphere", 0.0, "Fig. 5b: init on the sphere, ρ = 0"),
        ("fig6b", "sphere", 0.1, "Fig. 6b: init on the sphere, ρ = 0.1"),
    ):
        run = _train(o, 0.0, 0.6, rho=rho, init=init)
        _band_plot(axes[0, 0], run, range(o["runs"]), label)
        record[key] = _curve_record(run)
    study.results["appendix_a"] = record
    axes[0, 0].set(xlabel="PSGD iteration", ylabel="distance (Eq. 11)", title="App. A: Dirac mixture (σ = 0), λ = 0.6")
    axes[0, 0].legend(fontsize=7)
    study.save(fig, "fig5_fig6_degenerate.png")
    study.claim(
        "Thm A.4 / Fig. 5a: σ = 0, init on M̃, ρ = 0; final distance (median)",
        f"{record['fig5a']['final']['median']:.1e}",
        "converges to the centroids",
        record["fig5a"]["final"]["high"] < 1e-2,
    )
    study.claim(
        "Figs 5b / 6b: σ = 0 from the sphere, ρ = 0 vs ρ = 0.1 (median final distance)",
        f"{record['fig5b']['final']['median']:.1e} vs {record['fig6b']['final']['median']:.1e}",
        "without ρ only partial alignment; ρ = 0.1 reaches the centroids",
        record["fig6b"]["final"]["median"] < 0.1 * record["fig5b"]["final"]["median"],
    )


def figure6a(study: Study, o: dict[str, Any]) -> None:
    """App. A / Fig. 6a: σ = 0, init on the sphere, `degenerate_num_rhos` values of ρ in [0, 0.3] after `sweep_steps`.

    The paper: "a relatively small regularization parameter (of the order of 10⁻¹) is sufficient to achieve centroid
    alignment, with numerical error below 10⁻¹⁴" (App. A, 15 values, 5·10³ iterations, λ = 0.6).
    """
    rhos = torch.linspace(0, 0.3, o["degenerate_num_rhos"]).tolist()
    sweep = _train(o, 0.0, 0.6, rho=rhos, init="sphere", steps=o["sweep_steps"], record_every=o["sweep_steps"])
    bands = [percentile_band(row) for row in torch.tensor(sweep["final"]).reshape(len(rhos), o["runs"])]
    study.results["figure6a"] = {"rhos": rhos, "sweep": bands}
    fig, axes = new_figure()
    medians = [max(b["median"], 1e-16) for b in bands]
    axes[0, 0].semilogy(rhos, medians, marker=".")
    axes[0, 0].fill_between(rhos, [max(b["low"], 1e-16) for b in bands], [b["high"] for b in bands], alpha=0.2)
    axes[0, 0].set(xlabel="ρ", ylabel="distance (Eq. 11)", title=f"Fig. 6a: σ = 0, {o['sweep_steps']} iterations")
    study.save(fig, "fig6a_degenerate_rho.png")
    aligned = [r for r, b in zip(rhos, bands, strict=True) if b["high"] < 1e-6]
    study.claim(
        f"Fig. 6a: σ = 0, init on the sphere, median distance after {o['sweep_steps']} steps at ρ = 0 / 0.1 / 0.3; "
        "smallest ρ with every run below 1e-6",
        f"{bands[0]['median']:.1e} / {bands[len(rhos) // 3]['median']:.1e} / {bands[-1]['median']:.1e}; "
        + (f"ρ = {aligned[0]:.3f}" if aligned else "none"),
        "a ρ of order 10⁻¹ aligns the heads with the centroids to numerical precision (< 10⁻¹⁴)",
        bool(aligned) and aligned[0] <= 0.15,
    )


def _appendix_g_panels(o: dict[str, Any]) -> list[tuple[float, float, float]]:
    """(σ, λ, ρ on the sphere) per App. G panel: ρ = 0.1 for σ = 0 and 0.2 for σ > 0 (Figs 8, 10)."""
    if len(o["appendix_g_sigmas"]) != len(o["appendix_g_lams"]):
        raise ValueError(
            f"`appendix_g_sigmas` and `appendix_g_lams` must have equal lengths, got {o['appendix_g_sigmas']} and "
            f"{o['appendix_g_lams']}."
        )
    return [
        (s, lam, 0.1 if s == 0 else 0.2) for s, lam in zip(o["appendix_g_sigmas"], o["appendix_g_lams"], strict=True)
    ]


def _rmse_record(run: dict[str, Any], dim: int) -> dict[str, Any]:
    """A curve of the minimal RMSE of App. G.1 (the distance of Eq. 11 divided by √d)."""
    scale = math.sqrt(dim)
    rows = [[value / scale for value in row] for row in run["distance"]]
    return {
        "steps": run["steps"],
        "median_rmse": [percentile_band(row)["median"] for row in rows],
        "final": percentile_band([value / scale for value in run["final"]]),
        "seconds": run["seconds"],
        "rows": rows,
    }


def high_dimension_curves(study: Study, o: dict[str, Any]) -> None:
    """App. G.1–G.2 / Figs 7, 8, 11: the minimal RMSE over `steps` iterations, one panel per σ.

    Fig. 7: d = `high_dim` (100), init on M, ρ = 0. Fig. 8: the same d, init on the sphere, ρ = 0.1 (σ = 0) or 0.2.
    Fig. 11: d = `random_dim` (50), centroids and initial heads uniform on the sphere, ρ = 0.2 (0.1 at σ = 0, as G.2
    "replicates the parameter-selection procedure from Section G.1").
    """
    panels = _appendix_g_panels(o)
    figures = {
        "fig7_manifold": dict(dim=o["high_dim"], init="manifold", regularised=False),
        "fig8_sphere": dict(dim=o["high_dim"], init="sphere", regularised=True),
        "fig11_random_centroids": dict(dim=o["random_dim"], init="sphere", regularised=True, centroids="random"),
    }
    fig, axes = new_figure(nrows=len(figures), ncols=len(panels))
    record: dict[str, Any] = {}
    for row, (name, setting) in enumerate(figures.items()):
        setting = dict(setting)
        regularised = setting.pop("regularised")
        record[name] = {}
        for column, (sigma, lam, rho) in enumerate(panels):
            run = _train(o, sigma, lam, rho=rho if regularised else 0.0, **setting)
            curve = _rmse_record(run, setting["dim"])
            record[name][f"sigma={sigma}"] = {key: value for key, value in curve.items() if key != "rows"}
            band = torch.tensor(curve["rows"], dtype=torch.float64).clamp(min=1e-16)
            q = torch.quantile(band, torch.tensor([0.025, 0.5, 0.975], dtype=torch.float64), dim=1)
            ax = axes[row, column]
            ax.semilogy(curve["steps"], q[1])
            ax.fill_between(curve["steps"], q[0], q[2], alpha=0.2)
            ax.set(title=f"{name.split('_')[0]}: d = {setting['dim']}, σ = {sigma}", xlabel="iteration")
        axes[row, 0].set(ylabel="minimal RMSE")
        finals = [record[name][f"sigma={sigma}"]["final"] for sigma, _, _ in panels]
        study.claim(
            f"App. G ({name}, d = {setting['dim']}): median minimal RMSE after {o['steps']} steps at σ = "
            + " / ".join(f"{sigma:g}" for sigma, _, _ in panels),
            " / ".join(f"{band['median']:.1e}" for band in finals),
            "Figs 7–8: the RMSE is \"of the order 10⁻²\" in each experiment"
            if "random" not in name
            else "Fig. 11: convergence from random centroids (no level stated)",
            all(band["median"] < 0.05 for band in finals) if "random" not in name else None,
        )
    study.results["high_dim"] = record
    study.save(fig, "fig7_8_11_high_dim.png")


def dimension_sweep(study: Study, o: dict[str, Any]) -> None:
    """App. G.1–G.2 / Figs 9, 10, 12: the minimal RMSE (distance / √d) after `sweep_steps` against d, per σ.

    Fig. 9: init on M, ρ = 0; Fig. 10: init on the sphere, ρ = 0.1 (σ = 0) or 0.2; Fig. 12: random (non-orthogonal)
    centroids, init on the sphere, the same ρ. λ = 0.6, 0.6, 0.2 for σ = 0, 0.3, 1 (G.1).
    """
    panels = _appendix_g_panels(o)
    settings = {
        "fig9_manifold": dict(init="manifold", regularised=False),
        "fig10_sphere": dict(init="sphere", regularised=True),
        "fig12_random_centroids": dict(init="sphere", regularised=True, centroids="random"),
    }
    fig, axes = new_figure(ncols=len(panels))
    record: dict[str, Any] = {"dims": o["dims"]}
    for name, setting in settings.items():
        setting = dict(setting)
        regularised = setting.pop("regularised")
        record[name] = {}
        for column, (sigma, lam, rho) in enumerate(panels):
            bands = []
            for dim in o["dims"]:
                run = _train(
                    o,
                    sigma,
                    lam,
                    dim=dim,
                    rho=rho if regularised else 0.0,
                    steps=o["sweep_steps"],
                    record_every=o["sweep_steps"],
                    **setting,
                )
                bands.append(percentile_band(torch.tensor(run["final"]) / math.sqrt(dim)))
            record[name][f"sigma={sigma}"] = bands
            medians = [max(b["median"], 1e-16) for b in bands]
            axes[0, column].semilogy(o["dims"], medians, marker="o", label=name)
            axes[0, column].set(xlabel="d", title=f"σ = {sigma}, λ = {lam}")
            study.claim(
                f"App. G ({name}, σ = {sigma}): minimal RMSE after {o['sweep_steps']} steps at d = "
                + ", ".join(str(d) for d in o["dims"]),
                ", ".join(f"{b['median']:.1e}" for b in bands),
                _DIMENSION_CLAIMS[name](sigma),
                None,
            )
    study.results["dimension"] = record
    axes[0, 0].set(ylabel="minimal RMSE")
    axes[0, 0].legend(fontsize=7)
    study.save(fig, "fig9_10_12_dimension.png")


_DIMENSION_CLAIMS = {
    "fig9_manifold": lambda sigma: (
        "σ = 0: decreases with d" if sigma == 0 else "increases slowly with d; order 1e-3 (σ = 0.3), 1e-2 (σ = 1)"
    ),
    "fig10_sphere": lambda sigma: (
        "σ = 0: decreases with d" if sigma == 0 else "increases slowly with d; order 1e-3 (σ = 0.3), 1e-2 (σ = 1)"
    ),
    "fig12_random_centroids": lambda sigma: (
        "better at higher d (random centroids are closer to orthogonal), beyond 40"
    ),
}


def euclidean_vs_riemannian(study: Study, o: dict[str, Any]) -> None:
    """App. G.3 / Fig. 13: Euclidean projected SGD against the Riemannian PSGD (init on M, ρ = 0; sphere, ρ)."""
    fig, axes = new_figure()
    record = {}
    sigma, lam = o["sigmas"][0], o["lams"][0]
    for riemannian in (True, False):
        for init, rho in (("manifold", 0.0), ("sphere", o["rho"])):
            key = f"{'riemannian' if riemannian else 'euclidean'}/{init}/rho={rho}"
            run = _train(o, sigma, lam, rho=rho, init=init, riemannian=riemannian)
            record[key] = _curve_record(run)
            _band_plot(axes[0, 0], run, range(o["runs"]), key)
    study.results["euclidean"] = record
    axes[0, 0].set(xlabel="PSGD iteration", ylabel="distance (Eq. 11)", title=f"Fig. 13: σ = {sigma}")
    axes[0, 0].legend(fontsize=7)
    study.save(fig, "fig13_euclidean.png")
    for init, rho in (("manifold", 0.0), ("sphere", o["rho"])):
        r = record[f"riemannian/{init}/rho={rho}"]["final"]["median"]
        e = record[f"euclidean/{init}/rho={rho}"]["final"]["median"]
        study.claim(
            f"Fig. 13: Riemannian vs Euclidean projected SGD, init {init}, ρ = {rho} (median final distance)",
            f"{r:.1e} vs {e:.1e}",
            "empirically equivalent",
            max(r, e) < 0.1,
        )


def three_centroids(study: Study, o: dict[str, Any]) -> None:
    """App. G.4 / Fig. 14: K = 3 in R⁶ (centroids e₁, e₄, e₆), init on the sphere, ρ = 0.2; r⁽¹⁾ against r⁽²⁾."""
    fig, axes = new_figure()
    record = {}
    sigma, lam = o["sigmas"][0], o["lams"][0]
    for kind in ("pairwise", "product"):
        run = _train(o, sigma, lam, dim=6, num_clusters=3, rho=o["rho"], init="sphere", regulariser=kind)
        record[kind] = _curve_record(run)
        _band_plot(axes[0, 0], run, range(o["runs"]), {"pairwise": "r⁽¹⁾", "product": "r⁽²⁾"}[kind])
    study.results["k3"] = record
    axes[0, 0].set(xlabel="PSGD iteration", ylabel="distance (K = 3)", title=f"Fig. 14: K = 3, σ = {sigma}")
    axes[0, 0].legend()
    study.save(fig, "fig14_k3.png")
    study.claim(
        f"Fig. 14: K = 3, ρ = {o['rho']}, median final distance with r⁽¹⁾ / r⁽²⁾",
        f"{record['pairwise']['final']['median']:.1e} / {record['product']['final']['median']:.1e}",
        "r⁽¹⁾ recovers the 3 centroids and outperforms r⁽²⁾",
        record["pairwise"]["final"]["median"] < min(0.1, record["product"]["final"]["median"]),
    )


def figure15(study: Study, o: dict[str, Any]) -> None:
    """App. H / Fig. 15: softmax heads, risk (34) + ρ₀ r₀, PSGD_soft from λ = 3, ψ = 2; signed distance (36).

    (a) ρ₀ sweep after `sweep_steps` iterations; (b) ρ₀ = 0.5 over `steps` iterations, σ = 0.3 and σ = 1.
    """
    fig, axes = new_figure(ncols=2)
    record: dict[str, Any] = {"rhos": o["softmax_rhos"]}
    for sigma in o["sigmas"]:
        common = dict(predictor="softmax", regulariser=o["softmax_regulariser"], init="sphere", lam=3.0, psi=2.0)
        sweep = _train(
            o, sigma, rho=o["softmax_rhos"], steps=o["sweep_steps"], record_every=o["sweep_steps"], **common
        )
        finals = torch.tensor(sweep["final"]).reshape(len(o["softmax_rhos"]), o["runs"])
        bands = [percentile_band(row) for row in finals]
        axes[0, 0].plot(o["softmax_rhos"], [b["median"] for b in bands], marker="o", label=f"σ = {sigma}")
        curve = _train(o, sigma, rho=0.5, **common)
        _band_plot(axes[0, 1], curve, range(o["runs"]), f"σ = {sigma}")
        final = percentile_band(curve["final"])
        record[f"sigma={sigma}"] = {
            "sweep": bands,
            "curve": _curve_record(curve),
            "lam": percentile_band(curve["lam"]),
            "psi": percentile_band(curve["psi"]),
        }
        study.claim(
            f"Fig. 15a: softmax heads, σ = {sigma}, median signed distance at ρ₀ = "
            + ", ".join(str(r) for r in o["softmax_rhos"]),
            ", ".join(f"{b['median']:.2f}" for b in bands),
            "regularisation substantially improves recovery; too large a ρ₀ overrides the risk",
            None,
        )
        study.claim(
            f"Fig. 15b: softmax heads, ρ₀ = 0.5, σ = {sigma}, r₀ = {o['softmax_regulariser']}; final signed distance "
            "(Eq. 36), learned λ, ψ",
            f"median {final['median']:.2f} [{final['low']:.2f}, {final['high']:.2f}]; λ ≈ "
            f"{record[f'sigma={sigma}']['lam']['median']:.2f}, ψ ≈ {record[f'sigma={sigma}']['psi']['median']:.2f}",
            "accurate at σ = 0.3; alignment impaired at σ = 1",
            final["median"] < 0.2 if sigma <= 0.3 else None,
        )
    study.results["figure15"] = record
    axes[0, 0].set(xlabel="ρ₀", ylabel="signed distance (Eq. 36)", title="Fig. 15a")
    axes[0, 1].set(xlabel="PSGD_soft iteration", ylabel="signed distance (Eq. 36)", title="Fig. 15b: ρ₀ = 0.5")
    axes[0, 0].legend()
    axes[0, 1].legend()
    study.save(fig, "fig15_softmax.png")


PART_FUNCTIONS = {
    "theory": theory_checks,
    "fig1": figure1,
    "fig2": figure2,
    "fig3_4": figures3_4,
    "appendix_a": appendix_a,
    "fig6a": figure6a,
    "high_dim": high_dimension_curves,
    "dimension": dimension_sweep,
    "euclidean": euclidean_vs_riemannian,
    "k3": three_centroids,
    "softmax": figure15,
}


def run(out: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """The clustering paper's figures and closed forms (`OPTIONS` lists the options and the paper's defaults).

    The paper's full setting (10 runs of 10⁴ iterations, a 30-point ρ grid, d up to 200) takes hours on a laptop
    (App. F–H); README.md gives the scaled-down command whose results are committed.
    """
    o = resolve_options(OPTIONS, options)
    if len(o["sigmas"]) != len(o["lams"]):
        raise ValueError(f"`sigmas` and `lams` must have equal lengths, got {o['sigmas']} and {o['lams']}.")
    study = Study("clustering", TITLE, o, out, spec=OPTIONS)
    for part in o["parts"]:
        PART_FUNCTIONS[part](study, o)
    study.note("Distance: Eq. (11) (signs and order ignored); Eq. (36) for softmax heads (signs count).")
    study.note("Bands: 2.5–97.5 percentiles over the runs, as the paper's 95% percentile intervals.")
    return study.finish()
