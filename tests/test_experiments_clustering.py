"""Attention-based clustering: data, predictors, regularisers, distances, closed forms (Monte Carlo), training.

Monte Carlo checks allow 4 standard errors of the Monte Carlo mean (`monte_carlo_tolerance`), computed from the
samples themselves: the tolerance follows from the sample size, and a correct formula fails with probability ~6e-5.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from matplotlib.figure import Figure

from aot_transformers.experiments import clustering as C
from aot_transformers.experiments import clustering_figures as CF
from aot_transformers.experiments import clustering_theory as T
from aot_transformers.experiments.subspace import subspace_attention

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(dim=5, num_clusters=2, sigma=0.3, num_sequences=4, seq_len=7, seed=0):
    generator = C.make_generator(seed)
    centroids = C.orthonormal_centroids(dim, num_clusters, generator)
    tokens, labels = C.sample_gaussian_mixture(num_sequences, seq_len, centroids, sigma, generator)
    return tokens, labels, centroids


def _within(mc, exact):
    mean, tolerance = mc
    assert abs(mean - exact) <= tolerance, f"Monte Carlo {mean:.5f} ± {tolerance:.5f} vs closed form {exact:.5f}"


# ---------------------------------------------------------------- test oracles: closed forms only these tests use


def oracle_linear_attention_risk_limit(dim: int, sigma: float, lam: float, num_clusters: int = 2) -> float:
    """Proof of Prop. 4.2 (D.2): L → ∞ risk for any λ, (1 + dσ²) − λ(2 + 8σ² + 8σ⁴) + λ²(1 + 2σ²)³ for K = 2.

    For K heads (factor 2λ/L each, Eq. 3): T → cPX with c = 2λ(1/K + σ²), risk (1 − c)²(1 + Kσ²) + σ²(d − K).
    """
    c = 2 * lam * (1 / num_clusters + sigma**2)
    return (1 - c) ** 2 * (1 + num_clusters * sigma**2) + sigma**2 * (dim - num_clusters)


def oracle_linear_attention_risk_exact(dim: int, sigma: float, length: int, lam: float, num_clusters: int = 2):
    """Exact finite-L risk of T_lin (identity values) at μ = μ*: T_ℓ = 2λ Ĉ P X_ℓ (Ĉ = (1/L) Σ_m X_m X_mᵀ).

    Eq. (27) of the paper for K = 2, written with moments: E[XᵀĈPX] and E[XᵀPĈ²PX] split the double sum over
    (m, m') by which indices coincide with ℓ, with CP = aP (a = 1/K + σ²) and PX ⟂ (I − P)X.
    """
    m = T._second_moments(dim, sigma, num_clusters)
    a = m["a"]
    x_px = m["p2"] + m["p1"] * m["q1"]  # E[‖X‖²‖PX‖²]
    first = (x_px + (length - 1) * num_clusters * a**2) / length  # E[XᵀĈPX]
    px4_x = m["p3"] + m["p2"] * m["q1"]  # E[‖PX‖⁴‖X‖²]
    second = (
        px4_x + (length - 1) * (a * x_px + 2 * a * m["p2"]) + (length - 1) * (length - 2) * num_clusters * a**3
    ) / length**2  # E[XᵀPĈ²PX]
    return m["x1"] - 4 * lam * first + 4 * lam**2 * second


def in_context_quantization_risk_limit(dim: int, sigma: float, lam: float, num_clusters: int = 2) -> float:
    """Prop. 5.2: lim_{L→∞} risk of T_ctx = tr(C) − 4λ tr(C²) + 4λ² tr(C³).

    For K = 2 this is the paper's (1 + σ²d) − 2λ(1 + 4σ² + 2dσ⁴) + 4λ²(2(σ² + ½)³ + (d − 2)σ⁶).
    """
    m = T._second_moments(dim, sigma, num_clusters)
    return m["x1"] - 4 * lam * m["trC2"] + 4 * lam**2 * m["trC3"]


def in_context_quantization_optimal_temperature(dim: int, sigma: float, num_clusters: int = 2) -> float:
    """Prop. 5.2: the λ minimising the limit risk, tr(C²)/(2 tr(C³)) = (1 + 4σ² + 2dσ⁴)/(4(2(σ² + ½)³ + (d−2)σ⁶))."""
    m = T._second_moments(dim, sigma, num_clusters)
    return m["trC2"] / (2 * m["trC3"])


def in_context_quantization_risk_exact(dim: int, sigma: float, length: int, lam: float) -> float:
    """Exact finite-L risk of T_ctx = 2λ Ĉ X_ℓ: E‖X‖² − 4λ E[XᵀĈX] + 4λ² E[XᵀĈ²X] (see `T._in_context_moments`)."""
    x1, first, second = T._in_context_moments(dim, sigma, length)
    return x1 - 4 * lam * first + 4 * lam**2 * second


def centroid_regulariser_closed_form(heads: torch.Tensor, centroids: torch.Tensor, sigma: float) -> torch.Tensor:
    """The population value of r = Σ_{k<k'} E[⟨μ_k, X⟩²⟨μ_k', X⟩²] (Section 3.3; r⁽¹⁾ of App. G.4 for K = 3).

    Given the cluster c, u = ⟨μ_k, X⟩ and v = ⟨μ_k', X⟩ are jointly Gaussian with means m_u = ⟨μ_k, μ*_c⟩,
    m_v = ⟨μ_k', μ*_c⟩, variances σ²‖μ‖² and covariance s = σ²⟨μ_k, μ_k'⟩; Isserlis' theorem gives
    E[u²v²] = (m_u² + σ²‖μ_k‖²)(m_v² + σ²‖μ_k'‖²) + 2s² + 4 m_u m_v s. Averaged over the K clusters.
    """
    means = heads @ centroids.T  # (K_heads, K_clusters)
    gram = heads @ heads.T
    total = heads.new_zeros(())
    for k, k2 in itertools.combinations(range(heads.shape[0]), 2):
        mu, mv, s = means[k], means[k2], sigma**2 * gram[k, k2]
        var_u, var_v = sigma**2 * gram[k, k], sigma**2 * gram[k2, k2]
        total = total + ((mu**2 + var_u) * (mv**2 + var_v) + 2 * s**2 + 4 * mu * mv * s).mean()
    return total


# ------------------------------------------------------------------------------------------------------------ data


def test_centroids_are_orthonormal():
    centroids = C.orthonormal_centroids(6, 3, C.make_generator(0))
    torch.testing.assert_close(centroids @ centroids.T, torch.eye(3, dtype=torch.float64))


def test_mixture_shapes_and_noiseless_tokens_are_centroids():
    tokens, labels, centroids = _data(sigma=0.0)
    assert tokens.shape == (4, 7, 5) and labels.shape == (4, 7)
    torch.testing.assert_close(tokens, centroids[labels])


def test_mixture_second_moment():
    # E[X Xᵀ] = P/K + σ² I, the matrix every closed form is built on.
    tokens, _, centroids = _data(sigma=0.5, num_sequences=4000, seq_len=10)
    flat = tokens.reshape(-1, 5)
    expected = centroids.T @ centroids / 2 + 0.25 * torch.eye(5, dtype=torch.float64)
    torch.testing.assert_close(flat.T @ flat / len(flat), expected, atol=0.02, rtol=0)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: C.orthonormal_centroids(2, 3), "dim"),
        (lambda: C.sample_gaussian_mixture(2, 3, torch.eye(2, dtype=torch.float64), -1.0), "sigma"),
        (lambda: C.train_heads(dim=2, num_clusters=3, steps=1), "dim"),
        (lambda: C.train_heads(rho=-0.1, steps=1), "rho"),
        (lambda: C.train_heads(sigma=-0.3, steps=1), "sigma"),
        (lambda: C.train_heads(init="anywhere", steps=1), "init"),
        (lambda: C.train_heads(score="last_token", steps=1), "score"),
        (lambda: C.linear_attention_predictor(torch.zeros(1, 2, 3), torch.eye(3)[:2], 1.0, "other"), "values"),
        (lambda: T.oracle_risk_limit(2, 0.3, num_clusters=3), "dim"),
        (lambda: C.train_heads(dim=2, init="manifold", steps=1), "2K"),
        (lambda: C.train_heads(num_clusters=3, dim=6, predictor="softmax", steps=1), "K = 2"),
        (lambda: CF.run(parts=["nope"]), "parts"),
        (lambda: CF.run(colour="red"), "Unknown option"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------------------------ predictors


def test_canonical_centroids_are_the_papers():
    c = C.canonical_centroids(5)
    torch.testing.assert_close(c, torch.tensor([[0, 0, 0, 0, 1.0], [-1.0, 0, 0, 0, 0]], dtype=torch.float64))
    assert C.canonical_centroids(6, 3)[:, [0, 3, 5]].equal(torch.eye(3, dtype=torch.float64))


def test_linear_predictor_matches_eqs_3_and_4():
    tokens, _, centroids = _data()
    lam, (num, length) = 0.7, (centroids.shape[0], tokens.shape[1])
    identity = C.linear_attention_predictor(tokens, centroids, lam, "identity")
    projected = C.linear_attention_predictor(tokens, centroids, lam, "projected")
    expected_id, expected_proj = torch.zeros_like(tokens), torch.zeros_like(tokens)
    for b, ell, m, k in itertools.product(range(tokens.shape[0]), range(length), range(length), range(num)):
        weight = 2 * lam / length * (centroids[k] @ tokens[b, ell]) * (centroids[k] @ tokens[b, m])
        expected_id[b, ell] += weight * tokens[b, m]
        expected_proj[b, ell] += weight * (centroids[k] @ tokens[b, m]) * centroids[k]
    torch.testing.assert_close(identity, expected_id)
    torch.testing.assert_close(projected, expected_proj)


def test_batched_runs_equal_single_runs():
    tokens, _, centroids = _data()
    heads = C.initial_heads(centroids.expand(3, -1, -1), "sphere", C.make_generator(1))
    batched = C.linear_attention_predictor(tokens.expand(3, -1, -1, -1), heads, 0.5)
    for r in range(3):
        torch.testing.assert_close(batched[r], C.linear_attention_predictor(tokens, heads[r], 0.5))
    soft = C.softmax_attention_predictor(tokens.expand(3, -1, -1, -1), heads, torch.full((3, 1, 1, 1), 2.0), 1.0)
    torch.testing.assert_close(soft[1], C.softmax_attention_predictor(tokens, heads[1], 2.0, 1.0))


def test_projected_predictor_is_mssa_with_rank_one_subspaces():
    tokens, _, centroids = _data()
    expected = subspace_attention(tokens, centroids.unsqueeze(-1), phi="linear", scaling=2 * 0.4 / tokens.shape[1])
    torch.testing.assert_close(C.linear_attention_predictor(tokens, centroids, 0.4, "projected"), expected)


def test_in_context_quantizer_is_attention_with_identity_matrices():
    tokens, _, _ = _data()
    expected = 2 * 0.3 / tokens.shape[1] * (tokens @ tokens.transpose(1, 2)) @ tokens
    torch.testing.assert_close(C.in_context_quantizer(tokens, 0.3), expected)


def test_softmax_predictor_is_eq_34_with_identity_values_and_no_self_exclusion():
    tokens, _, centroids = _data()
    lam, psi = 2.0, 0.7
    expected = torch.zeros_like(tokens)
    for k in range(2):
        coordinate = tokens @ centroids[k]  # (B, L)
        expected += torch.softmax(lam * coordinate[:, :, None] * coordinate[:, None, :], -1) @ tokens
    expected -= psi * tokens.mean(1, keepdim=True)
    torch.testing.assert_close(C.softmax_attention_predictor(tokens, centroids, lam, psi), expected)


def test_softmax_misaligned_head_returns_the_mean_remark_h1():
    # Remark H.1 (σ = 0): with μ = μ₀* and X₁ = μ₁*, every score is 0 and the head returns the sequence mean.
    centroids = C.canonical_centroids(5)
    tokens = centroids[torch.tensor([[1, 0, 0, 1, 0]])]
    head = C.softmax_attention_predictor(tokens, centroids[:1], 3.0, 0.0)
    torch.testing.assert_close(head[0, 0], tokens[0].mean(0))


# ------------------------------------------------------------------------------------------- regulariser, distance


def test_regularisers_match_their_definitions():
    tokens, _, _ = _data(dim=6, num_clusters=3)
    heads = C.initial_heads(C.orthonormal_centroids(6, 3, C.make_generator(1)), "sphere", C.make_generator(2))
    a = (tokens @ heads.T).square()  # (B, L, 3)
    pairwise = (a[..., 0] * a[..., 1] + a[..., 0] * a[..., 2] + a[..., 1] * a[..., 2]).mean()
    torch.testing.assert_close(C.centroid_regulariser(tokens, heads, "pairwise"), pairwise)
    torch.testing.assert_close(C.centroid_regulariser(tokens, heads, "product"), a.prod(-1).mean())
    two = heads[:2]
    c = tokens @ two.T
    r0 = ((c[..., 0] - 1) ** 2 * (c[..., 1] - 1) ** 2).mean() + two[0] @ two[1]
    torch.testing.assert_close(C.centroid_regulariser(tokens, two, "softmax"), r0)
    squared = r0 - two[0] @ two[1] + (two[0] @ two[1]) ** 2
    torch.testing.assert_close(C.centroid_regulariser(tokens, two, "softmax_squared"), squared)


def test_printed_r0_prefers_anti_parallel_heads_to_the_centroids():
    # App. H's r₀ as printed ends in + ⟨μ₀, μ₁⟩ (not squared): μ₁ = −μ₀ earns −1, which no centroid pair can.
    # Why Fig. 15 uses `softmax_squared` as a documented deviation (see `centroid_regulariser`).
    mu = C.canonical_centroids(5)
    tokens, _ = C.sample_gaussian_mixture(64, 10, mu, 0.0, C.make_generator(0))
    anti = torch.stack([mu[0], -mu[0]])
    assert C.centroid_regulariser(tokens, anti, "softmax") < C.centroid_regulariser(tokens, mu, "softmax")
    assert C.centroid_regulariser(tokens, anti, "softmax_squared") > C.centroid_regulariser(
        tokens, mu, "softmax_squared"
    )


def test_regulariser_closed_form_matches_monte_carlo():
    generator = C.make_generator(5)
    tokens, _, centroids = _data(sigma=0.7, num_sequences=2000, seq_len=20, seed=2)
    heads = torch.randn(2, 5, generator=generator, dtype=torch.float64)
    heads = heads / heads.norm(dim=-1, keepdim=True)
    a = (tokens @ heads.T).square()
    per_sequence = (a[..., 0] * a[..., 1]).mean(-1)
    _within(T.monte_carlo_tolerance(per_sequence), centroid_regulariser_closed_form(heads, centroids, 0.7).item())


def test_regulariser_hand_case_at_the_centroids():
    # At μ = μ*: cluster 0 gives E[(1+σξ)²(σξ')²] = (1+σ²)σ², same for cluster 1.
    centroids = torch.eye(2, 4, dtype=torch.float64)
    assert centroid_regulariser_closed_form(centroids, centroids, 0.5).item() == pytest.approx(1.25 * 0.25)


def test_distance_invariances_and_hand_values():
    _, _, centroids = _data()
    assert C.centroid_distance(centroids, centroids).item() == pytest.approx(0.0, abs=1e-7)
    flipped = torch.stack([-centroids[1], centroids[0]])  # permuted and sign-flipped
    assert C.centroid_distance(flipped, centroids).item() == pytest.approx(0.0, abs=1e-7)
    # Eq. (36) counts the sign: a flipped head is at distance 2 from its centroid.
    assert C.centroid_distance(flipped, centroids, signed=True).item() == pytest.approx(2.0)
    assert C.centroid_distance(centroids.flip(0), centroids, signed=True).item() == pytest.approx(0.0, abs=1e-7)
    # Heads at the diagonal directions (μ0 ± μ1)/√2: each |⟨μ, μ*⟩| = 1/√2, cost 2 − √2 per head.
    diagonal = torch.stack([centroids[0] + centroids[1], centroids[0] - centroids[1]]) / 2**0.5
    assert C.centroid_distance(diagonal, centroids).item() == pytest.approx((2 * (2 - 2**0.5)) ** 0.5)


def test_distance_resolves_errors_far_below_float_rounding():
    # Fig. 6a's "numerical error below 10⁻¹⁴": ‖a‖² + ‖b‖² − 2⟨a, b⟩ would round a 1e-12 error to 0.
    centroids = C.canonical_centroids(5)
    heads = centroids.clone()
    heads[0, 1] = 1e-12
    assert C.centroid_distance(heads, centroids).item() == pytest.approx(1e-12, rel=1e-9)


def test_distance_is_permutation_invariant_for_three_heads():
    _, _, centroids = _data(dim=6, num_clusters=3)
    heads = centroids + 0.05 * torch.randn(3, 6, generator=C.make_generator(3), dtype=torch.float64)
    reference = C.centroid_distance(heads, centroids)
    for perm in itertools.permutations(range(3)):
        signs = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)[:, None]
        assert C.centroid_distance(signs * heads[list(perm)], centroids).item() == pytest.approx(reference.item())


# ---------------------------------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize(
    "sigma, lam, kappas", [(0.3, 0.6, (1.0, 1.0)), (0.3, 0.6, (0.6, -0.3)), (1.0, 0.2, (0.2, 0.9))]
)
def test_lemma_c1_risk_on_the_manifold_by_monte_carlo(sigma, lam, kappas):
    centroids = C.canonical_centroids(5)
    heads = C.heads_on_manifold(centroids, kappas)
    assert (
        abs(heads[0] @ centroids[1]) < 1e-12
        and abs(heads[1] @ centroids[0]) < 1e-12
        and abs(heads[0] @ heads[1]) < 1e-12
    )
    mc = C.monte_carlo_risk(lambda x: C.linear_attention_predictor(x, heads, lam), centroids, sigma, 30, 1500, seed=1)
    _within(mc, T.manifold_risk(*kappas, 5, sigma, 30, lam))


def test_lemma_c1_at_the_centroids_equals_the_exact_oracle_risk():
    for sigma, length, lam in [(0.3, 30, 0.6), (1.0, 30, 0.2), (0.5, 7, 0.5)]:
        assert T.manifold_risk(1, 1, 5, sigma, length, lam) == pytest.approx(
            oracle_linear_attention_risk_exact(5, sigma, length, lam), rel=1e-12
        )


def test_critical_temperature_prop_c2_and_its_limits():
    for sigma, length in [(0.3, 30), (1.0, 30), (0.5, 7)]:
        lam_star = T.critical_temperature(5, sigma, length)
        assert lam_star == pytest.approx(T.critical_temperature_root(5, sigma, length), rel=1e-12)
        q = T.manifold_risk_coefficients(5, sigma, length, lam_star)
        assert 2 * q["A"] + q["B"] + q["C"] == pytest.approx(0.0, abs=1e-12)
        # Below λ*, (±1, ±1) is the minimum of R on [−1, 1]²; above it, it is not (Prop. C.2).
        grid = torch.linspace(-1, 1, 41).tolist()
        for lam, is_min in ((0.9 * lam_star, True), (1.3 * lam_star, False)):
            best = min(T.manifold_risk(a, b, 5, sigma, length, lam) for a in grid for b in grid)
            assert (T.manifold_risk(1, 1, 5, sigma, length, lam) <= best + 1e-12) is is_min
    limits = T.critical_temperature_limits(0.3, 30)
    assert T.critical_temperature(5, 0.0, 30) == pytest.approx(limits["sigma_to_0"]) == pytest.approx(31 / 33)
    assert T.critical_temperature(5, 0.3, 10**7) == pytest.approx(limits["L_to_infinity"], rel=1e-5)
    assert limits["L_to_infinity"] == pytest.approx((1 + 4 * 0.09) / (1 + 5 * 0.09 + 6 * 0.0081))


@pytest.mark.parametrize("values", ["identity", "projected"])
def test_unbiased_temperature_prop_4_1_by_monte_carlo(values):
    sigma, length = 1.0, 30
    centroids = C.canonical_centroids(5)
    lam = T.unbiased_temperature(sigma, length, values=values)
    if values == "identity":
        assert lam == pytest.approx(length / ((length + 1) + 2 * (length + 3) * sigma**2))
    moments = C.monte_carlo_conditional_moments(
        lambda x: C.linear_attention_predictor(x, centroids, lam, values), centroids, sigma, length, 3000, seed=4
    )
    _within(moments["projection"], 1.0)


def test_conditional_variances_props_4_2_and_5_2_by_monte_carlo():
    sigma, length, dim = 0.5, 20, 5
    centroids = C.canonical_centroids(dim)
    lam = T.unbiased_temperature(sigma, length)
    first, own = C.monte_carlo_conditional_moments(
        lambda x: C.linear_attention_predictor(x, centroids, lam), centroids, sigma, length, 3000, seed=5
    )["outputs"]
    _within(
        T.monte_carlo_tolerance((first - own).square().sum(-1)), T.oracle_conditional_variance(dim, sigma, length, lam)
    )
    lam_c = T.in_context_unbiased_temperature(dim, sigma, length)
    moments = C.monte_carlo_conditional_moments(
        lambda x: C.in_context_quantizer(x, lam_c), centroids, sigma, length, 3000, seed=6
    )
    _within(moments["projection"], 1.0)  # Prop. 5.1: unbiased
    first, own = moments["outputs"]
    _within(
        T.monte_carlo_tolerance((first - own).square().sum(-1)),
        T.in_context_conditional_variance(dim, sigma, length, lam_c),
    )


def test_conditional_variances_tend_to_the_papers_limits():
    for sigma, lam in [(0.3, 0.7), (1.0, 0.25)]:
        assert T.oracle_conditional_variance(5, sigma, 10**7, lam) == pytest.approx(
            2 * lam**2 * sigma**2 * (1 + 2 * sigma**2) ** 2, rel=1e-5
        )
        assert T.in_context_conditional_variance(7, sigma, 10**7, lam) == pytest.approx(
            2 * lam**2 * sigma**2 * (1 + 4 * sigma**2 + 2 * 7 * sigma**4), rel=1e-5
        )
    # Prop. 5.1's unbiased λ.
    assert T.in_context_unbiased_temperature(5, 0.3, 30) == pytest.approx(15 / (1 + 7 * 0.09 + 29 * 0.59))


@pytest.mark.parametrize("sigma, length, lam", [(0.3, 30, 0.6), (1.0, 30, 0.2), (0.5, 12, 0.5)])
def test_exact_finite_length_risks_by_monte_carlo(sigma, length, lam):
    centroids = C.canonical_centroids(5)
    ctx = C.monte_carlo_risk(lambda x: C.in_context_quantizer(x, lam), centroids, sigma, length, 1500, seed=1)
    _within(ctx, in_context_quantization_risk_exact(5, sigma, length, lam))
    lin = C.monte_carlo_risk(
        lambda x: C.linear_attention_predictor(x, centroids, lam), centroids, sigma, length, 1500, 2
    )
    _within(lin, oracle_linear_attention_risk_exact(5, sigma, length, lam))


def test_exact_risks_tend_to_the_limits():
    for sigma, lam in [(0.3, 0.7), (1.0, 0.25)]:
        assert in_context_quantization_risk_exact(5, sigma, 10**6, lam) == pytest.approx(
            in_context_quantization_risk_limit(5, sigma, lam), rel=1e-4
        )
        assert oracle_linear_attention_risk_exact(5, sigma, 10**6, lam) == pytest.approx(
            oracle_linear_attention_risk_limit(5, sigma, lam), rel=1e-4
        )


def test_oracle_risk_limit_is_sigma_squared_d_minus_two():
    for dim, sigma in [(5, 0.3), (8, 1.0)]:
        lam = 1 / (1 + 2 * sigma**2)  # Prop. 4.2's temperature
        assert oracle_linear_attention_risk_limit(dim, sigma, lam) == pytest.approx(sigma**2 * (dim - 2))
        assert T.oracle_risk_limit(dim, sigma) == pytest.approx(sigma**2 * (dim - 2))


def test_in_context_quantizer_prop_5_2_optimum():
    for dim, sigma in [(5, 0.3), (10, 1.0)]:
        lam = in_context_quantization_optimal_temperature(dim, sigma)
        s2 = sigma**2
        assert lam == pytest.approx((1 + 4 * s2 + 2 * dim * s2**2) / (4 * (2 * (s2 + 0.5) ** 3 + (dim - 2) * s2**3)))
        limit = in_context_quantization_risk_limit(dim, sigma, lam)
        assert limit == pytest.approx(T.in_context_optimal_risk_limit(dim, sigma))
        assert limit <= T.oracle_risk_limit(dim, sigma) < T.oracle_quantizer_risk(dim, sigma)
        for other in (0.9 * lam, 1.1 * lam):
            assert in_context_quantization_risk_limit(dim, sigma, other) > limit


def test_degenerate_case_prop_a1_and_a3():
    length = 30
    lam0 = (length + 1) / (length + 3)
    centroids = C.canonical_centroids(5)
    heads = torch.nn.functional.normalize(
        torch.tensor([[0.3, 0.2, 0.1, 0.0, 0.9], [-0.8, 0.1, 0.3, 0.2, 0.4]]), dim=-1
    )
    heads = heads.double()
    inner = heads @ centroids.T
    tokens, _ = C.sample_gaussian_mixture(1, length, centroids, 0.0, C.make_generator(0))
    # σ = 0: the risk of one sequence is random only through the labels; average many for the expectation.
    mc = C.monte_carlo_risk(lambda x: C.linear_attention_predictor(x, heads, lam0), centroids, 0.0, length, 2000)
    _within(
        mc,
        T.degenerate_risk(
            inner[0, 0].item(), inner[1, 1].item(), inner[1, 0].item(), inner[0, 1].item(), length, lam0
        ),
    )
    # Prop. A.3: the minimisers at λ₀*, including rotated ones off the centroids (κ₀ = cos θ, η₀ = sin θ, ...).
    theta = 0.4
    point = (
        torch.cos(torch.tensor(theta)).item(),
        torch.cos(torch.tensor(theta)).item(),
        torch.sin(torch.tensor(theta)).item(),
        -torch.sin(torch.tensor(theta)).item(),
    )
    assert T.degenerate_is_minimiser(*point, atol=1e-6)
    assert T.degenerate_risk(*point, length, lam0) == pytest.approx(T.degenerate_minimum(length))
    assert T.degenerate_risk(0.9, 0.9, 0.1, 0.1, length, lam0) > T.degenerate_minimum(length)
    assert T.degenerate_minimum(length) == pytest.approx(oracle_linear_attention_risk_exact(5, 0.0, length, lam0))


# -------------------------------------------------------------------------------------------------------- training


def test_projected_steps_stay_on_the_sphere():
    heads = torch.nn.functional.normalize(torch.randn(2, 5), dim=-1)
    moved = C.projected_sgd_step(heads, torch.randn(2, 5), 0.1)
    torch.testing.assert_close(moved.norm(dim=-1), torch.ones(2))
    torch.testing.assert_close(C.projected_sgd_step(heads, 3.0 * heads, 0.1), heads)  # radial gradient ignored
    euclidean = C.projected_sgd_step(heads, 3.0 * heads, 0.1, riemannian=False)
    torch.testing.assert_close(euclidean, heads)  # a radial step is undone by the normalisation
    assert not torch.allclose(C.projected_sgd_step(heads, torch.randn(2, 5), 0.1, riemannian=False), heads)


@pytest.mark.parametrize("init", ["manifold", "manifold_tilde"])
def test_initialisations_lie_on_the_papers_manifolds(init):
    centroids = C.canonical_centroids(6, 3).expand(4, -1, -1)
    heads = C.initial_heads(centroids, init, C.make_generator(0))
    torch.testing.assert_close(heads.norm(dim=-1), torch.ones(4, 3, dtype=torch.float64))
    inner = heads @ centroids.transpose(-1, -2)
    off_diagonal = ~torch.eye(3, dtype=torch.bool)
    assert inner[:, off_diagonal].abs().max() < 1e-12  # ⟨μ_k, μ_j*⟩ = 0 for j ≠ k
    gram = (heads @ heads.transpose(-1, -2))[:, off_diagonal].abs().max()
    assert (gram < 1e-12) if init == "manifold" else (gram > 1e-3)  # M also asks ⟨μ_i, μ_j⟩ = 0
    assert inner.diagonal(dim1=-2, dim2=-1).abs().min() > 1e-3  # generic: κ ≠ 0


def test_theorem_3_4_psgd_from_the_manifold_converges_to_the_centroids_without_regulariser():
    # Theorem 3.4 / Fig. 1: init on M, ρ = 0, λ = 0.6 ≤ λ*(0.3, 30) ≈ 0.83: the heads reach (±μ₀*, ±μ₁*).
    assert 0.6 <= T.critical_temperature(5, 0.3, 30)
    run = C.train_heads(
        sigma=0.3, lam=0.6, rho=0.0, init="manifold", steps=400, batch_size=32, lr=0.05, runs=2, record_every=100
    )
    start, final = torch.tensor(run["distance"][0]), torch.tensor(run["final"])
    assert (start > 0.3).all() and (final < 0.05).all()


def test_regularised_psgd_from_the_sphere_reaches_the_centroids():
    run = C.train_heads(
        sigma=0.3, lam=0.6, rho=[0.0, 0.2], init="sphere", steps=300, batch_size=16, lr=0.05, record_every=100, seed=1
    )
    assert run["rho"] == pytest.approx([0.0, 0.2])
    assert run["final"][1] < 0.1 < run["distance"][0][1]


def test_first_token_scoring_is_one_psgd_step_on_the_papers_h_of_eq_28():
    # Eq. (28): h = ‖X₁ − (2λ/L) Σ_k [X₁ᵀ(μ₀μ₀ᵀ + μ₁μ₁ᵀ)X_k] X_k‖² + ρ⟨μ₀, X₁⟩²⟨μ₁, X₁⟩², averaged over the batch.
    lam, rho, lr, batch, length = 0.6, 0.5, 0.1, 8, 30
    options = dict(sigma=0.3, lam=lam, rho=rho, init="sphere", steps=1, batch_size=batch, lr=lr, seed=3)
    first, every = (C.train_heads(score=s, **options)["heads"][0] for s in ("first_token", "all_tokens"))
    generator = C.make_generator(3)  # train_heads draws the initial heads, then the batch
    centroids = C.canonical_centroids(5, 2, torch.float32)[None]
    mu = C.initial_heads(centroids, "sphere", generator)[0].requires_grad_(True)
    x = C.sample_gaussian_mixture(batch, length, centroids, 0.3, generator)[0][0]  # (B, L, d)
    x1 = x[:, 0]
    scores = torch.einsum("bd,kd,ke,ble->bl", x1, mu, mu, x)
    h = (x1 - 2 * lam / length * torch.einsum("bl,bld->bd", scores, x)).square().sum(-1)
    (grad,) = torch.autograd.grad((h + rho * (x1 @ mu[0]) ** 2 * (x1 @ mu[1]) ** 2).mean(), mu)
    mu = mu.detach()
    moved = mu - lr * (grad - (grad * mu).sum(-1, keepdim=True) * mu)  # the (PSGD) update of App. F.1
    torch.testing.assert_close(first, moved / moved.norm(dim=-1, keepdim=True))
    assert (first - every).abs().max() > 1e-3  # scoring every position is another step


def test_run_smoke(tmp_path):
    results = CF.run(out=tmp_path, parts=["theory", "fig3_4"], mc_sequences=50)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"results.json", "summary.md", "fig3_fig4_pca.png"} <= names
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["options"]["runs"] == 10 and "theory" in saved  # the paper's defaults when not given
    assert saved["figures3_4"]["setting"] == {"d": 10, "sigma": 0.3, "L": 500, "lam": pytest.approx(1 / 1.18)}
    assert (
        len(results["claims"]) >= 10
        and "aot experiment clustering --parts theory fig3_4" in (tmp_path / "summary.md").read_text()
    )


def test_fig6a_sigma_zero_a_small_regulariser_aligns_the_heads_to_precision():
    # App. A / Fig. 6a: under (P₀) from the sphere, ρ = 0 stalls at partial alignment, ρ = 0.1 reaches the centroids.
    run = C.train_heads(
        sigma=0.0, lam=0.6, rho=[0.0, 0.1], init="sphere", steps=1500, batch_size=16, lr=0.1, runs=3, record_every=500
    )
    final = torch.tensor(run["final"]).reshape(2, 3)
    assert final[0].min() > 0.1 and final[1].max() < 1e-4


def test_appendix_g_parts_run_and_record_the_papers_panels(tmp_path):
    options = dict(
        parts=["fig6a", "fig6a_rate", "high_dim", "dimension"],
        runs=2,
        steps=6,
        sweep_steps=4,
        batch_size=4,
        degenerate_num_rhos=3,
        dims=[4, 6],
        high_dim=8,
        random_dim=6,
    )
    results = CF.run(out=tmp_path, **options)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"fig6a_degenerate_rho.png", "fig7_8_11_high_dim.png", "fig9_10_12_dimension.png"} <= names
    assert results["figure6a"]["rhos"] == pytest.approx([0.0, 0.15, 0.3])
    rate = results["figure6a_rate"]  # one factor changed at a time; e^{1000γρ} beside each measured contraction
    assert list(rate) == ["as given", "lr=0.1", "batch_size=1", "euclidean", "score=first_token"]
    assert [row["theory"] for row in rate["lr=0.1"]] == pytest.approx([math.exp(100 * r) for r in (0.1, 0.2, 0.3)])
    for figure in ("fig7_manifold", "fig8_sphere", "fig11_random_centroids"):
        assert set(results["high_dim"][figure]) == {"sigma=0.0", "sigma=0.3", "sigma=1.0"}  # the paper's three panels
        curve = results["high_dim"][figure]["sigma=0.3"]
        assert curve["steps"][-1] == 6 and len(curve["median_rmse"]) == len(curve["steps"])
    for figure in ("fig9_manifold", "fig10_sphere", "fig12_random_centroids"):
        assert [len(results["dimension"][figure][f"sigma={s}"]) for s in (0.0, 0.3, 1.0)] == [2, 2, 2]
    claims = [c["quantity"] for c in results["claims"]]
    assert any(c.startswith("Fig. 6a") for c in claims) and sum("App. G (fig7" in c for c in claims) == 1


def test_appendix_g_minimal_rmse_is_the_distance_over_root_d():
    run = C.train_heads(dim=16, sigma=0.3, lam=0.6, init="sphere", steps=2, batch_size=4, runs=2, record_every=1)
    record = CF._band_plot(Figure().add_subplot(), run, None, 4.0, "median_rmse")
    assert record["median_rmse"][-1] == C.percentile_band([value / 4 for value in run["distance"][-1]])["median"]
    assert record["final"] == C.percentile_band([value / 4 for value in run["final"]])


def test_appendix_g_sigmas_and_lambdas_must_pair_up():
    with pytest.raises(ValueError, match="appendix_g_sigmas"):
        CF.run(parts=["high_dim"], appendix_g_sigmas=[0.0, 0.3], appendix_g_lams=[0.6], steps=1, runs=1)


# ------------------------------------------------------------------------- App. C.4: the κ recursion (Lemma C.6)

_SETTING = (5, 0.3, 30, 0.6, 0.01)  # d, σ, L, λ ≤ λ*(0.3, 30) ≈ 0.83, γ


def test_kappa_recursion_is_eq_25_with_the_papers_derivative_and_its_fixed_points_are_the_set_c():
    dim, sigma, length, lam, lr = _SETTING
    q = T.manifold_risk_coefficients(dim, sigma, length, lam)
    kappa = torch.rand(50, 2, dtype=torch.float64) * 2 - 1
    grad = 4 * q["A"] * kappa**3 + 2 * q["B"] * kappa + 2 * q["C"] * kappa * kappa.flip(-1) ** 2  # Prop. C.8's proof
    room = 1 - kappa**2
    expected = (kappa - lr * grad * room) / (1 + lr**2 * grad**2 * room).sqrt()  # Eq. (25) as printed in Lemma C.6
    torch.testing.assert_close(T.kappa_step(kappa, *_SETTING), expected, rtol=0, atol=1e-15)
    points = T.kappa_fixed_points(*_SETTING, starts=200)
    assert {tuple(p) for p in points.tolist()} == set(itertools.product((-1.0, 0.0, 1.0), repeat=2))  # Prop. C.8
    # φ's Jacobian is diagonal on 𝒞: 1 − γ ∂²_kR at κ_k = 0, (1 + γ ∂_kR)² at κ_k = ±1 (differentiating Eq. 25).
    _, jac = T.kappa_jacobian(points, *_SETTING)
    for p, j in zip(points.tolist(), jac, strict=True):
        other = [p[1] ** 2, p[0] ** 2]
        diag = [
            1 - lr * (2 * q["B"] + 2 * q["C"] * other[k])
            if p[k] == 0
            else (1 + lr * (4 * q["A"] + 2 * q["B"] + 2 * q["C"] * other[k])) ** 2
            for k in range(2)
        ]
        torch.testing.assert_close(j, torch.diag(torch.tensor(diag, dtype=torch.float64)), rtol=0, atol=1e-12)
        unstable = int((torch.tensor(diag) > 1).sum())  # Props C.9–C.11: minima 0, saddles 1, the maximum 2
        assert unstable == sum(x == 0 for x in p) and min(diag) >= 0
    # At λ = λ*, ∂R(±1, ±1) = 2(2A + B + C) = 0: the minima are fixed points with eigenvalue exactly 1.
    lam_star = T.critical_temperature(dim, sigma, length)
    _, jac = T.kappa_jacobian(torch.ones(1, 2, dtype=torch.float64), dim, sigma, length, lam_star, lr)
    torch.testing.assert_close(jac[0], torch.eye(2, dtype=torch.float64))


def test_kappa_recursion_decreases_the_risk_and_converges_to_the_centroids_prop_c7_c10():
    kappa = torch.rand(200, 2, generator=C.make_generator(1), dtype=torch.float64) * 2 - 1
    path, rise = T.kappa_orbit(kappa, 1500, *_SETTING, every=500)
    assert path.shape == (4, 200, 2) and rise <= 0  # Prop. C.7: R(κ^{k+1}) ≤ R(κ^k) at every step
    assert (path[-1].abs() - 1).abs().max() < 1e-3  # Props C.10–C.11: generic starts end at (±1, ±1)
    assert (path[-1].sign() == kappa.sign()).all()  # the sign of κ_k never changes (φ keeps 0 fixed)


def test_lemma_c1_at_sigma_zero_is_the_degenerate_risk_on_m():
    for k0, k1 in ((0.3, -0.8), (1.0, 0.0), (0.5, 0.5)):
        assert T.manifold_risk(k0, k1, 5, 0.0, 30, 0.6) == pytest.approx(T.degenerate_risk(k0, k1, 0.0, 0.0, 30, 0.6))


def test_kappa_dynamics_part_pgd_stays_on_m_and_prop_b1_holds(tmp_path):
    results = CF.run(out=tmp_path, parts=["kappa_dynamics"], steps=40, runs=2, batch_size=2, sigmas=[0.3], lams=[0.6])
    claims = {c["quantity"].split(":")[0].split(",")[0]: c["holds"] for c in results["claims"]}
    assert claims["Lemmas C.4–C.6"] and claims["Props C.8–C.11"]  # exact PGD stays on M; 𝒞 and its Jacobians
    assert claims["Prop. B.1 (σ = 0"] and claims["Remark B.2 (σ = 0"]
    record = results["kappa_dynamics"]
    assert record["pgd_sigma0"]["max_distance_to_M"] < 1e-14 and record["pgd_sigma0"]["max_kappa_gap"] < 1e-13
    batch, gap, off = record["sigma=0.3"]["psgd"][0]
    assert batch == 2 and 0 < off < 0.5 and 0 < gap < 0.5  # PSGD leaves M by sampling noise only
    assert (tmp_path / "kappa_dynamics.png").exists()


def test_prop_b1_the_anti_diagonal_saddles_have_the_statements_radius_not_the_proofs():
    # Prop. B.1, item 3: (κ₀, κ₁, −κ₁, −κ₀) is critical at κ₀² + κ₁² = (L+3)/(2(L+1)), as stated; the proof's
    # r₁² = A/(A − C) = (L+3)/4 is not a critical point ((21) with ζ₁ = −ζ₀ gives A/(A + C) again).
    length = 30
    for radius2, critical in (((length + 3) / (2 * length + 2), True), ((length + 3) / 4, False)):
        r = math.sqrt(radius2)
        x = torch.tensor([0.6 * r, 0.8 * r, -0.8 * r, -0.6 * r], dtype=torch.float64, requires_grad=True)
        (grad,) = torch.autograd.grad(T.degenerate_risk(*x, length, (length + 1) / (length + 3)), x)
        assert (grad.abs().max() < 1e-12) == critical
