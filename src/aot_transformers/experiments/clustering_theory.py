"""Closed forms of attention-based clustering (Maulen-Soto, Marion, Boyer 2025, `../shared/papers/`).

Every function here is a formula from the paper (cited in its docstring) or, where the paper gives only a limit, the
exact finite-L value derived from Gaussian moments (the derivation is in the docstring and in the experiments
README). They are checked against Monte Carlo in `tests/test_experiments_clustering.py` with tolerances derived from
the sample size (`monte_carlo_tolerance`), and printed beside Monte Carlo by `aot experiment clustering --parts
theory`; the closed forms only the tests use (the exact and limit risks, the regulariser's value) are in that test
module.

Setting (Section 2, (P_σ)): tokens X = μ*_Z + σξ, Z uniform over K = 2 orthonormal centroids, ξ ~ N(0, I_d);
C = E[XXᵀ] = P/K + σ²I with P the projection onto the centroids' span. T_lin (Eq. 4) with heads μ₀, μ₁ and the
factor 2λ/L; T_ctx (Eq. 12) = (2λ/L) Σ_m ⟨X_ℓ, X_m⟩ X_m; the risk is Eq. (5), (1/L) Σ_ℓ E‖X_ℓ − T(X)_ℓ‖².
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .study import check_choice, check_int, check_real

VALUES = ("identity", "projected")


def _check_mixture(dim: int, num_clusters: int, sigma: float, seq_len: int | None = None) -> int | None:
    """Check the mixture's d, K and σ (and L if given); return L."""
    check_int("num_clusters", num_clusters)
    check_int("dim", dim)
    if dim < num_clusters:
        raise ValueError(
            f"`dim` (d = {dim}) must be >= `num_clusters` (K = {num_clusters}): K orthonormal centroids need d >= K."
        )
    check_real("sigma", sigma, 0.0)
    return None if seq_len is None else check_int("seq_len", seq_len)


def monte_carlo_tolerance(per_sample: torch.Tensor, z: float = 4.0) -> tuple[float, float]:
    """Mean of i.i.d. samples and the tolerance `z` standard errors (sd/√n) a Monte Carlo check may allow.

    Pass one value per independent sequence (tokens of one sequence are dependent through T). With z = 4 a correct
    closed form fails a check with probability about 6e-5.
    """
    values = per_sample.detach().to(torch.float64).reshape(-1)
    if values.numel() < 2:
        raise ValueError(f"`per_sample` needs at least 2 samples for a standard error, got {values.numel()}.")
    return float(values.mean()), z * float(values.std() / math.sqrt(values.numel()))


# --- Section 3: the risk on the manifold M, λ*(σ, L).


def _lemma_c1_factors(
    dim: int, sigma: float, seq_len: int
) -> tuple[float, Callable[[int], float], Callable[[int], float], int, int, int]:
    """σ², Lemma C.1's c₁(n) = 1 + nσ², c₂(n) = 1 + σ²(d + n) (K = 2 centroids in R^d, noise σ); L, L − 1, L − 2."""
    length = _check_mixture(dim, 2, sigma, seq_len)
    s2 = sigma**2
    return s2, lambda n: 1 + n * s2, lambda n: 1 + s2 * (dim + n), length, length - 1, length - 2


def manifold_risk_coefficients(dim: int, sigma: float, seq_len: int, lam: float) -> dict[str, float]:
    """A, B, C, D of Lemma C.1 (the explicit form of Lemma 3.2), with c₁(n) = 1 + nσ², c₂(n) = 1 + σ²(d + n).

    On M (Eq. 9: ⟨μ₁*, μ₀⟩ = ⟨μ₀*, μ₁⟩ = ⟨μ₀, μ₁⟩ = 0) the risk is A(κ₀⁴ + κ₁⁴) + B(κ₀² + κ₁²) + Cκ₀²κ₁² + D with
    κ_k = ⟨μ_k*, μ_k⟩ (Eq. 10).
    """
    s2, c1, c2, n, l1, l2 = _lemma_c1_factors(dim, sigma, seq_len)
    a = (
        2 * lam**2 / n**2 * c2(8)
        + 2 * lam**2 * l1 / n**2 * c1(5)
        + lam**2 * l1 / n**2 * c2(4)
        + lam**2 * l1 * l2 / (2 * n**2) * c1(4)
    )
    b = (
        -2 * lam / n * c2(4)
        + 16 * lam**2 * s2 / n**2 * c2(6)
        + 8 * lam**2 * s2 * l1 / n**2 * c1(6)
        - lam * l1 / n * c1(4)
        + 4 * lam**2 * s2 * l1 / n**2 * c2(3)
        + lam**2 * s2 * l1 * l2 / n**2 * c1(6)
    )
    c = 4 * lam**2 * s2 * l1 / n**2
    d = (
        c1(dim)
        - 8 * lam * s2 / n * c2(2)
        + 32 * lam**2 * s2**2 / n**2 * c2(4)
        + 64 * lam**2 * s2**3 * l1 / n**2
        - 8 * lam * s2**2 * l1 / n
        + 8 * lam**2 * s2**2 * l1 / n**2 * c2(2)
        + 8 * lam**2 * s2**3 * l1 * l2 / n**2
    )
    return {"A": a, "B": b, "C": c, "D": d}


def manifold_risk(kappa0: float, kappa1: float, dim: int, sigma: float, seq_len: int, lam: float) -> float:
    """Lemma 3.2 / Lemma C.1: R(κ₀, κ₁) = A(κ₀⁴ + κ₁⁴) + B(κ₀² + κ₁²) + Cκ₀²κ₁² + D on the manifold M."""
    q = manifold_risk_coefficients(dim, sigma, seq_len, lam)
    k0, k1 = kappa0**2, kappa1**2
    return q["A"] * (k0**2 + k1**2) + q["B"] * (k0 + k1) + q["C"] * k0 * k1 + q["D"]


def kappa_step(kappa: torch.Tensor, dim: int, sigma: float, seq_len: int, lam: float, lr: float) -> torch.Tensor:
    """Lemma C.6, Eq. (25): one PGD step on M in κ = (κ₀, κ₁) (..., 2), φ(κ)_k = (κ_k − γ∂_kR (1 − κ_k²)) /
    √(1 + γ²(∂_kR)²(1 − κ_k²)), ∂R by autograd on Lemma C.1; differentiable if `kappa` requires grad."""
    k = kappa if kappa.requires_grad else kappa.detach().requires_grad_(True)
    risk = manifold_risk(k[..., 0], k[..., 1], dim, sigma, seq_len, lam)
    (grad,) = torch.autograd.grad(risk.sum(), k, create_graph=kappa.requires_grad)
    room = 1 - k.square()
    step = (k - lr * grad * room) / (1 + (lr * grad).square() * room).sqrt()
    return step if kappa.requires_grad else step.detach()


def kappa_jacobian(kappa: torch.Tensor, *args: float) -> tuple[torch.Tensor, torch.Tensor]:
    """φ(κ) and its Jacobian ∂φ_i/∂κ_j (..., 2, 2) at each point of `kappa` (..., 2); `args` as `kappa_step`."""
    k = kappa.detach().requires_grad_(True)
    phi = kappa_step(k, *args)
    rows = [torch.autograd.grad(phi[..., i].sum(), k, retain_graph=True)[0] for i in range(2)]
    return phi.detach(), torch.stack(rows, -2)


def kappa_fixed_points(*args: float, starts: int = 400, seed: int = 0) -> torch.Tensor:
    """The fixed points of Eq. (25) in [−1, 1]² (Prop. C.8): 60 Newton steps on φ(κ) − κ from `starts` uniform random
    points, each limit with residual < 1e−12 kept once (to 1e−6); `args` as `kappa_step`."""
    k = torch.rand(starts, 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2 - 1
    for _ in range(60):
        phi, jac = kappa_jacobian(k, *args)
        k = k - torch.linalg.lstsq(jac - torch.eye(2, dtype=k.dtype), (phi - k)[..., None]).solution[..., 0]
        k = k.nan_to_num(2.0).clamp(-1.2, 1.2)  # φ stays real near the square; starts that leave it are dropped
    found = ((kappa_step(k, *args) - k).abs().amax(-1) < 1e-12) & (k.abs().amax(-1) <= 1 + 1e-9)
    return torch.unique((k[found] * 1e6).round() / 1e6 + 0.0, dim=0)  # + 0.0: −0 and 0 are one point


def kappa_orbit(kappa: torch.Tensor, steps: int, *args: float, every: int = 1) -> tuple[torch.Tensor, float]:
    """`steps` iterations of Eq. (25) from `kappa` (..., 2), `args` as `kappa_step`: the iterates every `every` steps,
    (steps // every + 1, ..., 2), and the largest one-step rise of R(κ) along the way (Prop. C.7: none for small γ)."""
    path, rise, risk = [kappa], -math.inf, manifold_risk(kappa[..., 0], kappa[..., 1], *args[:4])
    for step in range(1, steps + 1):
        kappa = kappa_step(kappa, *args)
        new = manifold_risk(kappa[..., 0], kappa[..., 1], *args[:4])
        rise, risk = max(rise, float((new - risk).max())), new
        if step % every == 0:
            path.append(kappa)
    return torch.stack(path), rise


def critical_temperature(dim: int, sigma: float, seq_len: int) -> float:
    """λ*(σ, L) of Proposition C.2 (Prop. 3.3): for λ ∈ ]0, λ*], (±1, ±1) minimise R on M (Theorem 3.4's range).

    λ* = (2L c₂(4) + L(L − 1) c₁(4)) / c₃(σ, L), the root of 2A + B + C (Lemma C.1's coefficients over λ), with
    c₂(n) = 1 + σ²(d + n): λ* depends on d through c₂, which the paper's notation λ*(σ, L) leaves implicit.
    """
    s2, c1, c2, length, l1, l2 = _lemma_c1_factors(dim, sigma, seq_len)
    c3 = (
        16 * s2 * c2(6)
        + 8 * s2 * l1 * c1(6)
        + 4 * s2 * l1 * c2(3)
        + s2 * l1 * l2 * c1(6)
        + 4 * c2(8)
        + 4 * l1 * c1(5)
        + 2 * l1 * c2(4)
        + l1 * l2 * c1(4)
        + 4 * s2 * l1
    )
    return (2 * length * c2(4) + length * l1 * c1(4)) / c3


def critical_temperature_root(dim: int, sigma: float, seq_len: int) -> float:
    """The λ > 0 where 2A + B + C of Lemma C.1 vanishes (the proof of Prop. C.2), solved from the coefficients.

    A, C are λ²·a, λ²·c and B = λ·b₁ + λ²·b₂, so 2A + B + C = 0 at λ = −b₁ / (2a + b₂ + c).
    """
    one = manifold_risk_coefficients(dim, sigma, seq_len, 1.0)
    two = manifold_risk_coefficients(dim, sigma, seq_len, 2.0)
    # B(λ) = b₁λ + b₂λ²: from B(1) = b₁ + b₂ and B(2) = 2b₁ + 4b₂.
    b2 = (two["B"] - 2 * one["B"]) / 2
    b1 = one["B"] - b2
    return -b1 / (2 * one["A"] + b2 + one["C"])


def critical_temperature_limits(sigma: float, seq_len: int) -> dict[str, float]:
    """Prop. 3.3's limits: λ₀* = (L + 1)/(L + 3) as σ → 0 (Remark C.3), λ∞* = (1 + 4σ²)/(1 + 5σ² + 6σ⁴) as L → ∞."""
    sigma = check_real("sigma", sigma, 0.0)
    length = check_int("seq_len", seq_len)
    return {
        "sigma_to_0": (length + 1) / (length + 3),
        "L_to_infinity": (1 + 4 * sigma**2) / (1 + 5 * sigma**2 + 6 * sigma**4),
    }


# --- Section 4: the oracle predictor T_lin at μ = μ*.


def unbiased_temperature(sigma: float, seq_len: int, num_clusters: int = 2, values: str = "identity") -> float:
    """Prop. 4.1: λ = L / ((L + 1) + 2(L + 3)σ²) makes T_lin at μ = μ* unbiased, E[T_lin(X)₁ | Z₁ = c] = μ*_c.

    General K (derived in the experiments README): with each head's factor 2λ/L (Eq. 3), the m = ℓ term gives
    (1 + (K + 2)σ²) μ*_c for identity values ((1 + 3σ²) μ*_c for projected values V = μ_k μ_kᵀ) and each of the
    L − 1 other tokens (1/K + σ²) μ*_c; for K = 2 and identity values this is the paper's formula.
    """
    sigma = check_real("sigma", sigma, 0.0)
    check_int("seq_len", seq_len)
    check_int("num_clusters", num_clusters)
    check_choice("values", values, VALUES)
    own = 1 + (num_clusters + 2) * sigma**2 if values == "identity" else 1 + 3 * sigma**2
    return seq_len / (2 * (own + (seq_len - 1) * (1 / num_clusters + sigma**2)))


def oracle_conditional_mean_factor(sigma: float, seq_len: int, lam: float) -> float:
    """Prop. 4.1: E[T_lin(X)₁ | Z₁ = c] = (λ/L)[(L + 1) + 2(L + 3)σ²] μ*_c (the factor in front of μ*_c)."""
    sigma = check_real("sigma", sigma, 0.0)
    length = check_int("seq_len", seq_len)
    return lam / length * ((length + 1) + 2 * (length + 3) * sigma**2)


def oracle_conditional_variance(dim: int, sigma: float, seq_len: int, lam: float) -> float:
    """Prop. D.2 (behind Prop. 4.2): Var[T_lin(X)₁ | Z₁ = c] = E‖T_lin(X)₁‖² − ‖E[T_lin(X)₁ | Z₁ = c]‖² at μ = μ*."""
    n = _check_mixture(dim, 2, sigma, seq_len)
    s2 = sigma**2
    second = (
        4 * lam**2 / n**2 * (1 + s2 * (dim + 16) + 8 * s2**2 * (dim + 7) + 8 * s2**3 * (dim + 4))
        + 2 * lam**2 * (n - 1) / n**2 * (3 + s2 * (dim + 28) + 4 * s2**2 * (dim + 16) + 4 * s2**3 * (dim + 10))
        + lam**2 * (n - 1) * (n - 2) / n**2 * (1 + 6 * s2 + 12 * s2**2 + 8 * s2**3)
    )
    return second - oracle_conditional_mean_factor(sigma, n, lam) ** 2


def oracle_conditional_variance_limit(sigma: float, lam: float) -> float:
    """Prop. 4.2: lim_{L→∞} Var[T_lin(X)₁ | Z₁ = c] = 2λ²σ²(1 + 2σ²)² (independent of d)."""
    sigma = check_real("sigma", sigma, 0.0)
    return 2 * lam**2 * sigma**2 * (1 + 2 * sigma**2) ** 2


def oracle_quantizer_risk(dim: int, sigma: float) -> float:
    """Section 4: the optimal quantizer T*(X)_ℓ = μ*_{Z_ℓ} has risk dσ²."""
    check_int("dim", dim)
    return dim * check_real("sigma", sigma, 0.0) ** 2


def oracle_risk_limit(dim: int, sigma: float, num_clusters: int = 2) -> float:
    """Prop. 4.2: lim_{L→∞} risk of T_lin at μ = μ* with λ = 1/(1 + 2σ²) is σ²(d − 2) (σ²(d − K) for K heads)."""
    _check_mixture(dim, num_clusters, sigma)
    return sigma**2 * (dim - num_clusters)


def _second_moments(dim: int, sigma: float, num_clusters: int) -> dict[str, float]:
    """Moments of one token X = μ* + σξ (‖μ*‖ = 1) used by the exact risks.

    ‖X‖²/σ² and ‖PX‖²/σ² are noncentral χ² with d and K degrees of freedom and noncentrality 1/σ²; their raw
    moments follow from the cumulants κ_n = 2^{n−1}(n−1)!(k + nλ). Written in σ so that σ = 0 is allowed.
    """
    _check_mixture(dim, num_clusters, sigma)
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
    traces = {f"trC{n}": num_clusters * a**n + (dim - num_clusters) * s2**n for n in (2, 3)}  # tr C², tr C³
    return dict(x1=x1, x2=x2, x3=x3, p1=p1, p2=p2, p3=p3, q1=q1, a=a, **traces)


# --- Section 5: the in-context quantizer T_ctx.


def in_context_conditional_mean_factor(dim: int, sigma: float, seq_len: int, lam: float) -> float:
    """Prop. 5.1: E[T_ctx(X)₁ | μ*, Z₁ = c] = (2λ/L)[(1 + (d + 2)σ²) + (L − 1)(½ + σ²)] μ*_c."""
    length = _check_mixture(dim, 2, sigma, seq_len)
    s2 = sigma**2
    return 2 * lam / length * ((1 + (dim + 2) * s2) + (length - 1) * (0.5 + s2))


def in_context_unbiased_temperature(dim: int, sigma: float, seq_len: int) -> float:
    """Prop. 5.1: λ = (L/2) / (1 + (d + 2)σ² + (L − 1)(½ + σ²)) makes T_ctx unbiased."""
    return 1.0 / in_context_conditional_mean_factor(dim, sigma, seq_len, 1.0)


def _in_context_moments(dim: int, sigma: float, seq_len: int, num_clusters: int = 2) -> tuple[float, float, float]:
    """E‖X‖², E[XᵀĈX] and E[XᵀĈ²X] for Ĉ = (1/L) Σ_m X_m X_mᵀ (the token itself included), X a token of the sequence.

    E[XᵀĈX] = (m4 + (L−1) tr C²)/L and E[XᵀĈ²X] = (m6 + 3(L−1) E[‖X‖² XᵀCX] + (L−1)(L−2) tr C³)/L², splitting the
    double sum over (m, m') by which indices coincide with ℓ.
    """
    m, length = _second_moments(dim, sigma, num_clusters), seq_len
    # E[‖X‖² XᵀCX] with XᵀCX = ‖PX‖²/K + σ²‖X‖² and E[‖X‖²‖PX‖²] = E‖PX‖⁴ + E‖PX‖² E‖QX‖².
    cross = (m["p2"] + m["p1"] * m["q1"]) / num_clusters + sigma**2 * m["x2"]
    first = (m["x2"] + (length - 1) * m["trC2"]) / length
    second = (m["x3"] + 3 * (length - 1) * cross + (length - 1) * (length - 2) * m["trC3"]) / length**2
    return m["x1"], first, second


def in_context_conditional_variance(dim: int, sigma: float, seq_len: int, lam: float) -> float:
    """Exact finite-L Var[T_ctx(X)₁ | μ*, Z₁ = c] = (2λ)² E[XᵀĈ²X] − (Prop. 5.1's factor)².

    E‖T_ctx(X)₁‖² does not depend on c (the swap of the two centroids is an isometry), so it is the unconditional
    (2λ)² E[XᵀĈ²X]; its limit is Prop. 5.2's 2λ²σ²(1 + 4σ² + 2dσ⁴).
    """
    _check_mixture(dim, 2, sigma, seq_len)
    second = _in_context_moments(dim, sigma, seq_len)[2]
    return (2 * lam) ** 2 * second - in_context_conditional_mean_factor(dim, sigma, seq_len, lam) ** 2


def in_context_conditional_variance_limit(dim: int, sigma: float, lam: float) -> float:
    """Prop. 5.2: lim_{L→∞} Var[T_ctx(X)₁ | μ*, Z₁ = c] = 2λ²σ²(1 + 4σ² + 2dσ⁴)."""
    _check_mixture(dim, 2, sigma)
    return 2 * lam**2 * sigma**2 * (1 + 4 * sigma**2 + 2 * dim * sigma**4)


def in_context_optimal_risk_limit(dim: int, sigma: float) -> float:
    """Prop. 5.2: at the optimal λ, lim risk = σ²(d − 2)(1 + 2σ²) / (1 + 6σ² + 12σ⁴ + 4dσ⁶) ≤ σ²(d − 2)."""
    _check_mixture(dim, 2, sigma)
    s2 = sigma**2
    return s2 * (dim - 2) * (1 + 2 * s2) / (1 + 6 * s2 + 12 * s2**2 + 4 * dim * s2**3)


# --- Appendix A: the degenerate mixture (P₀), σ = 0.


def degenerate_risk(kappa0: float, kappa1: float, eta0: float, eta1: float, seq_len: int, lam: float) -> float:
    """Prop. A.1 (Eq. 14): the risk under (P₀) in κ₀ = ⟨μ₀*, μ₀⟩, κ₁ = ⟨μ₁*, μ₁⟩, η₀ = ⟨μ₁, μ₀*⟩, η₁ = ⟨μ₀, μ₁*⟩.

    R = 1 − λ(L+1)/L (κ₀² + κ₁² + η₀² + η₁²) + λ²(L+3)/(2L) ([κ₀² + η₀²]² + [κ₁² + η₁²]²)
    + λ²(L−1)/L (κ₀η₁ + κ₁η₀)².
    """
    n = check_int("seq_len", seq_len)
    return (
        1
        - lam * (n + 1) / n * (kappa0**2 + kappa1**2 + eta0**2 + eta1**2)
        + lam**2 * (n + 3) / (2 * n) * ((kappa0**2 + eta0**2) ** 2 + (kappa1**2 + eta1**2) ** 2)
        + lam**2 * (n - 1) / n * (kappa0 * eta1 + kappa1 * eta0) ** 2
    )


def degenerate_minimum(seq_len: int) -> float:
    """Prop. A.3 with λ₀* = (L+1)/(L+3): the minimum of Eq. (14), 1 − (L+1)²/(L(L+3)) (Remark D.4's oracle risk)."""
    n = check_int("seq_len", seq_len)
    return 1 - (n + 1) ** 2 / (n * (n + 3))


def degenerate_is_minimiser(kappa0: float, kappa1: float, eta0: float, eta1: float, atol: float = 1e-9) -> bool:
    """Prop. A.3: a point minimises Eq. (14) at λ₀* iff κ₀² + η₀² = 1, κ₁² + η₁² = 1 and κ₀η₁ + κ₁η₀ = 0."""
    return (
        abs(kappa0**2 + eta0**2 - 1) <= atol
        and abs(kappa1**2 + eta1**2 - 1) <= atol
        and abs(kappa0 * eta1 + kappa1 * eta0) <= atol
    )
