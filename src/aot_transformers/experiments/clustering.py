"""Attention-based clustering (Maulen-Soto, Marion, Boyer 2025; `../shared/papers/attention-based-clustering.txt`).

Data (P_σ), Section 2: tokens X_ℓ = μ*_{Z_ℓ} + σξ_ℓ with Z_ℓ uniform over K orthonormal centroids (the paper's
μ₀* = e_d, μ₁* = −e₁; App. G.4's e₁, e₄, e₆ for K = 3; App. G.2 draws them uniformly on the sphere).

Predictors, tokens as rows: `linear_attention_predictor` (T_lin, Eqs. 3–4; with `values="projected"` it is MSSA with
rank-1 subspaces and φ linear — the link to AoT), `softmax_attention_predictor` (App. H, Eq. 34, λ and ψ learned) and
`in_context_quantizer` (T_ctx, Eq. 12).

Training is projected SGD on the spheres (PSGD, App. F.1; the Euclidean variant of App. G.3 with
`riemannian=False`), vectorised over independent runs (seeds × regularisation strengths); see `train_heads`.
The closed forms are in `clustering_theory`, the figures and claims in `clustering_figures`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import clustering_theory as theory
from .clustering_theory import VALUES, _check_mixture
from .study import check_choice, check_int, check_real, make_generator
from .subspace import subspace_attention

INITS = ("manifold", "manifold_tilde", "sphere")
PREDICTORS = ("linear", "softmax")
REGULARISERS = ("pairwise", "product", "softmax", "softmax_squared")
CENTROIDS = ("canonical", "random")
SCORES = ("all_tokens", "first_token")
Predictor = Callable[[torch.Tensor], torch.Tensor]  # a predictor T: tokens X (B, L, d) -> T(X) (B, L, d)


# --- Data.


def canonical_centroids(dim: int, num_clusters: int = 2, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The paper's centroids as rows (K, d): μ₀* = e_d, μ₁* = −e₁ (App. F.2, G.1); e₁, e₄, e₆ for K = 3 (G.4); other
    K (or K = 3 below d = 6): `orthonormal_centroids` of seed 0."""
    _check_mixture(dim, num_clusters, 0.0)
    eye = torch.eye(dim, dtype=dtype)
    if num_clusters == 2:
        return torch.stack([eye[-1], -eye[0]])
    if num_clusters == 3 and dim >= 6:
        return torch.stack([eye[0], eye[3], eye[5]])
    return orthonormal_centroids(dim, num_clusters, make_generator(0), dtype)


def orthonormal_centroids(
    dim: int, num_clusters: int = 2, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """K random orthonormal centroids in R^d, as rows (K, d)."""
    _check_mixture(dim, num_clusters, 0.0)
    basis, _ = torch.linalg.qr(torch.randn(dim, num_clusters, generator=generator, dtype=torch.float64))
    return basis.T.to(dtype).contiguous()


def sample_gaussian_mixture(
    num_sequences: int, seq_len: int, centroids: torch.Tensor, sigma: float, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(P_σ): B sequences of L i.i.d. tokens X_ℓ = μ*_{Z_ℓ} + σξ_ℓ with Z_ℓ uniform over the K centroids.

    `centroids` are rows, (K, d), or (R, K, d) for R independent runs with their own centroids. Returns `tokens`
    (B, L, d) — or (R, B, L, d) — in the centroids' dtype, and `labels` (B, L) — or (R, B, L).
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


# --- Predictors, risk, regularisers, distances.


def _coordinates(tokens: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """⟨μ_k, X_ℓ⟩ as (..., L, K) for heads (K, d) with tokens (B, L, d), or heads (R, K, d) with tokens (R, B, L, d):
    per-run heads multiply all of a run's B·L tokens in one matrix product (broadcasting would run B·R tiny ones)."""
    heads = heads.to(tokens.dtype)
    if heads.dim() == 2:
        return tokens @ heads.T
    runs, batch, length, dim = tokens.shape
    return (tokens.reshape(runs, batch * length, dim) @ heads.transpose(-1, -2)).reshape(runs, batch, length, -1)


def linear_attention_predictor(
    tokens: torch.Tensor, heads: torch.Tensor, lam: float | torch.Tensor, values: str = "identity"
) -> torch.Tensor:
    """T_lin of Eqs. (3)–(4): Σ_k (2λ/L) Σ_m ⟨μ_k, X_ℓ⟩⟨μ_k, X_m⟩ V_k(X_m), one head per row of `heads`.

    Tokens X (B, L, d) with heads μ (K, d), or (R, B, L, d) with (R, K, d); λ a float or a tensor broadcasting
    against (R, 1, 1, 1). `values`: `"identity"` (V = I, the paper's predictor) or `"projected"` (V_k = μ_k μ_kᵀ:
    MSSA with rank-1 subspaces and φ linear, through `subspace_attention`; heads (K, d) only).
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
    Shapes as `linear_attention_predictor`; λ (inverse temperature) and ψ floats or (R, 1, 1, 1) tensors.
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


def centroid_regulariser(tokens: torch.Tensor, heads: torch.Tensor, kind: str = "pairwise") -> torch.Tensor:
    """The regularisers, empirical over the tokens (per run for (R, B, L, d) inputs).

    - `"pairwise"`: r = E[⟨μ₀, X⟩²⟨μ₁, X⟩²] (Eq. 17, Section 3.3); for K heads r⁽¹⁾ = Σ_{i<j} (App. G.4).
    - `"product"`: r⁽²⁾ = E[Π_i ⟨μ_i, X⟩²] (App. G.4).
    - `"softmax"`: r₀ = E[(⟨μ₀, X⟩ − 1)²(⟨μ₁, X⟩ − 1)²] + ⟨μ₀, μ₁⟩ (App. H, problem (P_ρ₀)), as printed.
    - `"softmax_squared"`: the same with ⟨μ₀, μ₁⟩² — a deviation. With the printed, unsquared term the objective
      is lower with anti-parallel heads than at the centroids (experiments README, App. H), so Fig. 15 cannot come
      from it; squared, the term only asks for orthogonal heads, which the centroids are.
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


def centroid_distance(heads: torch.Tensor, centroids: torch.Tensor, signed: bool = False) -> torch.Tensor:
    """Eq. (11): min over permutations π and signs s of (Σ_k ‖μ_k − s_k μ*_π(k)‖²)^{1/2}; batched over leading dims
    (heads, centroids (..., K, d) → (...)); with `signed`, the signs are not minimised over (Eq. (36) of App. H).

    The linear risk cannot tell μ_k from −μ_k (μ_k enters every head twice) nor the heads apart (they are summed);
    the softmax heads are not sign-symmetric (the centering and r₀ break the symmetry), so Eq. (36) counts the signs.
    """
    if heads.shape[-2:] != centroids.shape[-2:]:
        raise ValueError(f"`heads` {tuple(heads.shape)} and `centroids` {tuple(centroids.shape)} must have one shape.")
    heads, centroids = heads.detach().to(torch.float64), centroids.to(torch.float64)
    # ‖a − s b‖² from the differences: the expansion ‖a‖² + ‖b‖² − 2s⟨a, b⟩ cancels below distances of ~1e-8.
    pairs = heads[..., :, None, :], centroids[..., None, :, :]
    cost = (pairs[0] - pairs[1]).square().sum(-1)
    cost = cost if signed else torch.minimum(cost, (pairs[0] + pairs[1]).square().sum(-1))
    num = heads.shape[-2]
    totals = [sum(cost[..., k, perm[k]] for k in range(num)) for perm in itertools.permutations(range(num))]
    return torch.stack(totals).min(0).values.clamp(min=0.0).sqrt()


# --- Initialisation and projected SGD.


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
    score: str = "all_tokens",
    psi: float = 2.0,
    record_every: int = 100,
    seed: int = 0,
) -> dict[str, Any]:
    """Learn the heads without labels by projected SGD on fresh batches of risk + ρ · regulariser (App. F.1).

    Independent runs are vectorised: one per (ρ, seed) pair, each with its own initialisation and data.

    Args:
        dim, num_clusters, sigma, seq_len: d, K (centroids and heads), the noise σ, L.
        lam: λ (fixed for T_lin; the initial value, learned, for softmax heads — App. H uses 3).
        lr, batch_size, steps: Step size γ, sequences per step M, PSGD iterations.
        rho: ρ >= 0, or a list of them (one group of `runs` independent runs per value).
        init: `"manifold"` (M, Eq. 9), `"manifold_tilde"` (M̃, Eq. 16) or `"sphere"`.
        predictor: `"linear"` (T_lin) or `"softmax"` (App. H; λ and ψ learned by plain SGD, PSGD_soft).
        regulariser: `"pairwise"` (r, r⁽¹⁾), `"product"` (r⁽²⁾) or `"softmax"` (r₀); see `centroid_regulariser`.
        riemannian: Tangent-projected gradient (PSGD) or the Euclidean one (App. G.3).
        centroids: `"canonical"` (the paper's e_d, −e₁, …) or `"random"` (uniform on the sphere, App. G.2).
        score: `"all_tokens"` (risk and regulariser averaged over the L exchangeable positions: the same expected
            gradient, a lower variance) or `"first_token"` (position 0 only, the paper's h of Eq. 28; the prediction
            still attends to the whole sequence).
        psi: Initial centering ψ of softmax heads (App. F.1: 2).
        record_every: Record the distance every this many steps; `seed` seeds initialisation and data.

    Returns `steps` (records), `distance` (records × runs, Eq. 11, or Eq. 36 for softmax heads), `path` (the heads
    per record), `rho` per run, `final` (per-run final distances), `heads`, `centroids`, `lam`, `psi` (per run),
    `seconds`.
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
    scored = slice(None) if check_choice("score", score, SCORES) == "all_tokens" else slice(0, 1)
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
    history: dict[str, list] = {"steps": [], "distance": [], "path": []}
    start = time.perf_counter()
    for step in range(steps + 1):
        if step % record_every == 0 or step == steps:
            history["steps"].append(step)
            history["distance"].append(centroid_distance(heads, mu_star, signed=predictor == "softmax").tolist())
            history["path"].append(heads.clone())
        if step == steps:
            break
        tokens, _ = sample_gaussian_mixture(batch_size, seq_len, mu_star, sigma, generator)
        heads_var = heads.clone().requires_grad_(True)
        if predictor == "linear":
            prediction = linear_attention_predictor(tokens, heads_var, lam)
        else:
            prediction = softmax_attention_predictor(tokens, heads_var, lam_t, psi_t)
        tokens, prediction = tokens[..., scored, :], prediction[..., scored, :]
        loss = (tokens - prediction).square().sum(-1).mean((-1, -2))  # Eq. (5), per run
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
        "seconds": time.perf_counter() - start,
    }


def percentile_band(values: Sequence[float] | torch.Tensor) -> dict[str, float]:
    """Median and the 2.5 / 97.5 percentiles over runs (the paper's "95% percentile intervals", 10 runs)."""
    t = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    q = torch.quantile(t, torch.tensor([0.025, 0.5, 0.975], dtype=torch.float64))
    return {"low": float(q[0]), "median": float(q[1]), "high": float(q[2])}


# --- Monte Carlo estimates of the closed forms.


def monte_carlo_risk(
    predict: Predictor, centroids: torch.Tensor, sigma: float, seq_len: int, num_sequences: int, seed: int = 0
) -> tuple[float, float]:
    """Monte Carlo risk (Eq. 5) of `predict(tokens)`: mean over sequences and its 4-standard-error tolerance."""
    tokens, _ = sample_gaussian_mixture(num_sequences, seq_len, centroids, sigma, make_generator(seed))
    per_sequence = (tokens - predict(tokens)).square().sum(-1).mean(-1)  # (B,): one i.i.d. value per sequence
    return theory.monte_carlo_tolerance(per_sequence)


def monte_carlo_conditional_moments(
    predict: Predictor, centroids: torch.Tensor, sigma: float, seq_len: int, num_sequences: int, seed: int = 0
) -> dict[str, tuple[float, float] | tuple[torch.Tensor, torch.Tensor]]:
    """E[⟨T(X)₁, μ*_c⟩ | Z₁ = c] (`projection`) and E‖T(X)₁ − μ*_c‖² (`variance`) of the first token, each with its
    4-standard-error tolerance, and the raw `outputs` (T(X)₁, μ*_c); the first tokens are i.i.d. samples."""
    tokens, labels = sample_gaussian_mixture(num_sequences, seq_len, centroids, sigma, make_generator(seed))
    first = predict(tokens)[:, 0]  # (B, d)
    own = centroids[labels[:, 0]]  # (B, d)
    samples = {"projection": (first * own).sum(-1), "variance": (first - own).square().sum(-1)}
    return {**{key: theory.monte_carlo_tolerance(value) for key, value in samples.items()}, "outputs": (first, own)}
