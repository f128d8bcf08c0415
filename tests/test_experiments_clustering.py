"""Attention-based clustering: generator, predictors, regulariser, distance, closed forms (Monte Carlo), training."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from aot_transformers.attention_aot import subspace_attention
from aot_transformers.experiments import clustering as C


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # The tensors here are tiny: one thread avoids oversubscription on a shared CPU (10x faster under load).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _data(dim=5, num_clusters=2, sigma=0.3, num_sequences=4, seq_len=7, seed=0):
    generator = C.make_generator(seed)
    centroids = C.orthonormal_centroids(dim, num_clusters, generator)
    tokens, labels = C.sample_gaussian_mixture(num_sequences, seq_len, centroids, sigma, generator)
    return tokens, labels, centroids


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
        (lambda: C.linear_attention_predictor(torch.zeros(1, 2, 3), torch.eye(3)[:2], 1.0, "other"), "values"),
        (lambda: C.in_context_quantization_risk(2, 0.3, 10, 0.5, 4, 0, num_clusters=3), "dim"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------------------------ predictors


def test_linear_predictor_matches_its_definition():
    tokens, _, centroids = _data()
    lam, (num, length) = 0.7, (centroids.shape[0], tokens.shape[1])
    identity = C.linear_attention_predictor(tokens, centroids, lam, "identity")
    projected = C.linear_attention_predictor(tokens, centroids, lam, "projected")
    expected_id, expected_proj = torch.zeros_like(tokens), torch.zeros_like(tokens)
    for b, ell, m, k in itertools.product(range(tokens.shape[0]), range(length), range(length), range(num)):
        weight = num * lam / length * (centroids[k] @ tokens[b, ell]) * (centroids[k] @ tokens[b, m])
        expected_id[b, ell] += weight * tokens[b, m]
        expected_proj[b, ell] += weight * (centroids[k] @ tokens[b, m]) * centroids[k]
    torch.testing.assert_close(identity, expected_id)
    torch.testing.assert_close(projected, expected_proj)


def test_projected_predictor_is_mssa_with_rank_one_subspaces():
    tokens, _, centroids = _data()
    expected = subspace_attention(tokens, centroids.unsqueeze(-1), phi="linear", scaling=2 * 0.4 / tokens.shape[1])
    torch.testing.assert_close(C.linear_attention_predictor(tokens, centroids, 0.4, "projected"), expected)


def test_in_context_quantizer_is_attention_with_identity_matrices():
    tokens, _, _ = _data()
    expected = 2 * 0.3 / tokens.shape[1] * (tokens @ tokens.transpose(1, 2)) @ tokens
    torch.testing.assert_close(C.in_context_quantizer(tokens, 0.3), expected)


def test_identity_value_predictor_is_flat_on_the_manifold_of_frames():
    # With identity values T_lin depends on the heads only through Σ_k μ_k μ_kᵀ: rotating the centroids inside
    # their span leaves the predictor, hence the risk, unchanged (why the paper needs its regulariser).
    tokens, _, centroids = _data()
    angle = torch.tensor(0.6, dtype=torch.float64)
    rotation = torch.stack([torch.stack([angle.cos(), -angle.sin()]), torch.stack([angle.sin(), angle.cos()])])
    rotated = rotation @ centroids
    torch.testing.assert_close(
        C.linear_attention_predictor(tokens, rotated, 0.6), C.linear_attention_predictor(tokens, centroids, 0.6)
    )
    assert not torch.allclose(
        C.linear_attention_predictor(tokens, rotated, 0.6, "projected"),
        C.linear_attention_predictor(tokens, centroids, 0.6, "projected"),
    )


def test_softmax_predictor_projected_values_use_subspace_attention_and_centering():
    tokens, _, centroids = _data()
    lam, psi = 2.0, 0.5
    out = C.softmax_attention_predictor(tokens, centroids, lam, psi, values="projected", exclude_self=False)
    expected = torch.zeros_like(tokens)
    for k in range(2):
        coordinate = tokens @ centroids[k]  # (B, L)
        weights = torch.softmax(lam * coordinate[:, :, None] * coordinate[:, None, :], -1) - psi / tokens.shape[1]
        expected += (weights @ coordinate[..., None]) * centroids[k]
    torch.testing.assert_close(out, expected)


def test_softmax_predictor_excludes_the_token_itself():
    # In a sequence of two tokens each token can only attend to the other: with ψ = 0 every head returns it.
    tokens, _, centroids = _data()
    pair = tokens[:, :2]
    torch.testing.assert_close(C.softmax_attention_predictor(pair, centroids, 1.0, 0.0), 2 * pair.flip(1))
    # Without the exclusion a large λ lets each head copy the token itself.
    copied = C.softmax_attention_predictor(pair, centroids, 1.0, 0.0, exclude_self=False)
    assert not torch.allclose(copied, 2 * pair.flip(1))


# ------------------------------------------------------------------------------------------- regulariser, distance


def test_regulariser_closed_form_matches_monte_carlo():
    generator = C.make_generator(5)
    tokens, _, centroids = _data(sigma=0.7, num_sequences=4000, seq_len=20, seed=2)
    heads = torch.randn(2, 5, generator=generator, dtype=torch.float64)
    heads = heads / heads.norm(dim=-1, keepdim=True)
    monte_carlo = C.centroid_regulariser(tokens, heads)
    closed = C.centroid_regulariser_closed_form(heads, centroids, 0.7)
    assert monte_carlo.item() == pytest.approx(closed.item(), rel=0.03)


def test_regulariser_hand_case_at_the_centroids():
    # At μ = μ*: cluster 0 gives E[(1+σξ)²(σξ')²] = (1+σ²)σ², same for cluster 1.
    centroids = torch.eye(2, 4, dtype=torch.float64)
    assert C.centroid_regulariser_closed_form(centroids, centroids, 0.5).item() == pytest.approx(1.25 * 0.25)


def test_distance_invariances_and_hand_values():
    _, _, centroids = _data()
    assert C.centroid_distance(centroids, centroids).item() == pytest.approx(0.0, abs=1e-7)
    flipped = torch.stack([-centroids[1], centroids[0]])  # permuted and sign-flipped
    assert C.centroid_distance(flipped, centroids).item() == pytest.approx(0.0, abs=1e-7)
    # Heads at the diagonal directions (μ0 ± μ1)/√2: each |⟨μ, μ*⟩| = 1/√2, cost 2 − √2 per head.
    diagonal = torch.stack([centroids[0] + centroids[1], centroids[0] - centroids[1]]) / 2**0.5
    assert C.centroid_distance(diagonal, centroids).item() == pytest.approx((2 * (2 - 2**0.5)) ** 0.5)


def test_distance_is_permutation_invariant_for_three_heads():
    _, _, centroids = _data(dim=6, num_clusters=3)
    heads = centroids + 0.05 * torch.randn(3, 6, generator=C.make_generator(3), dtype=torch.float64)
    reference = C.centroid_distance(heads, centroids)
    for perm in itertools.permutations(range(3)):
        signs = torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64)[:, None]
        assert C.centroid_distance(signs * heads[list(perm)], centroids).item() == pytest.approx(reference.item())


# ---------------------------------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("values", ["identity", "projected"])
def test_unbiased_temperature_by_monte_carlo(values):
    sigma, length = 1.0, 30
    tokens, labels, centroids = _data(sigma=sigma, num_sequences=3000, seq_len=length, seed=4)
    lam = C.unbiased_temperature(sigma, length, values=values)
    output = C.linear_attention_predictor(tokens, centroids, lam, values)
    for c in range(2):
        mean = output[labels == c].mean(0)
        torch.testing.assert_close(mean, centroids[c], atol=0.03, rtol=0)
    # The large-L temperature 1/(1 + 2σ²) is biased at L = 30: the mean overshoots the centroid.
    biased = C.linear_attention_predictor(tokens, centroids, 1 / (1 + 2 * sigma**2), values)
    assert (biased[labels == 0].mean(0) @ centroids[0]).item() > 1.04


def test_unbiased_temperature_tends_to_its_limit():
    assert C.unbiased_temperature(0.3, 10**7) == pytest.approx(1 / (1 + 2 * 0.09), rel=1e-5)


@pytest.mark.parametrize("sigma, length, lam", [(0.3, 30, 0.6), (1.0, 30, 0.2), (0.5, 12, 0.5)])
def test_exact_finite_length_risks_by_monte_carlo(sigma, length, lam):
    exact_ctx = C.in_context_quantization_risk_exact(5, sigma, length, lam)
    exact_oracle = C.oracle_linear_attention_risk_exact(5, sigma, length, lam)
    assert C.in_context_quantization_risk(5, sigma, length, lam, 8000, seed=1) == pytest.approx(exact_ctx, rel=0.02)
    assert C.oracle_linear_attention_risk(5, sigma, length, lam, 8000, seed=2) == pytest.approx(exact_oracle, rel=0.02)


def test_exact_risks_tend_to_the_limits():
    for sigma, lam in [(0.3, 0.7), (1.0, 0.25)]:
        assert C.in_context_quantization_risk_exact(5, sigma, 10**6, lam) == pytest.approx(
            C.in_context_quantization_risk_limit(5, sigma, lam), rel=1e-4
        )
        assert C.oracle_linear_attention_risk_exact(5, sigma, 10**6, lam) == pytest.approx(
            C.oracle_linear_attention_risk_limit(5, sigma, lam), rel=1e-4
        )


def test_oracle_risk_limit_is_sigma_squared_d_minus_two():
    for dim, sigma in [(5, 0.3), (8, 1.0)]:
        lam = 1 / (1 + 2 * sigma**2)  # the unbiased temperature's limit
        assert C.oracle_linear_attention_risk_limit(dim, sigma, lam) == pytest.approx(sigma**2 * (dim - 2))
        assert C.oracle_risk_limit(dim, sigma) == pytest.approx(sigma**2 * (dim - 2))


def test_monte_carlo_oracle_risk_approaches_the_limit_for_long_sequences():
    sigma, length = 0.5, 1000
    risk = C.oracle_linear_attention_risk(5, sigma, length, C.unbiased_temperature(sigma, length), 24, seed=0)
    assert risk == pytest.approx(C.oracle_risk_limit(5, sigma), rel=0.05)


def test_in_context_quantizer_beats_the_oracle_quantizer():
    for sigma in (0.3, 1.0):
        lam = C.in_context_quantization_optimal_temperature(5, sigma)
        limit = C.in_context_quantization_risk_limit(5, sigma, lam)
        assert limit < C.oracle_quantizer_risk(5, sigma)
        # λ* minimises the limit risk.
        for other in (0.9 * lam, 1.1 * lam):
            assert C.in_context_quantization_risk_limit(5, sigma, other) > limit


def test_in_context_quantization_hand_case_without_noise():
    # σ = 0, K = 2: C = P/2, limit risk = tr C − 4λ tr C² + 4λ² tr C³ = 1 − 2λ + λ².
    assert C.in_context_quantization_risk_limit(4, 0.0, 0.5) == pytest.approx(0.25)
    assert C.in_context_quantization_risk_limit(4, 0.0, 1.0) == pytest.approx(0.0)


# -------------------------------------------------------------------------------------------------------- training


def test_riemannian_step_stays_on_the_sphere_and_ignores_radial_gradients():
    heads = torch.nn.functional.normalize(torch.randn(2, 5), dim=-1)
    moved = C.riemannian_sgd_step(heads, torch.randn(2, 5), 0.1)
    torch.testing.assert_close(moved.norm(dim=-1), torch.ones(2))
    torch.testing.assert_close(C.riemannian_sgd_step(heads, 3.0 * heads, 0.1), heads)


def test_span_initialisation_is_an_orthonormal_frame_of_the_span():
    _, _, centroids = _data()
    heads = C.initial_heads(centroids, "span", C.make_generator(0))
    torch.testing.assert_close(heads @ heads.T, torch.eye(2, dtype=torch.float64))
    torch.testing.assert_close(heads @ centroids.T @ centroids, heads)  # inside the span


def test_regularised_sgd_moves_the_heads_to_the_centroids():
    run = C.train_heads(
        sigma=0.3, lam=0.6, rho=0.2, init="random", steps=500, batch_size=64, lr=0.02, record_every=50, seed=1
    )
    assert run["distance"][-1] < 0.2 * run["distance"][0]
    assert run["distance"][-1] < 0.1


def test_without_regulariser_the_frame_on_the_manifold_does_not_move():
    run = C.train_heads(sigma=0.3, lam=0.6, rho=0.0, init="span", steps=100, batch_size=32, record_every=50)
    assert run["distance"][-1] == pytest.approx(run["distance"][0], abs=1e-4)


def test_run_smoke(tmp_path):
    results = C.run(
        out=tmp_path, steps=20, rhos=(0.0, 0.2), softmax_steps=10, batch_size=16, mc_sequences=4, mc_seq_len=50
    )
    names = {p.name for p in tmp_path.iterdir()}
    assert {
        "results.json",
        "summary.md",
        "fig1_manifold_init.png",
        "fig2_random_init_rho.png",
        "fig3_fig4_pca.png",
        "k3_and_softmax.png",
    } <= names
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["closed_form_checks"][0]["oracle_risk_limit"] == pytest.approx(0.09 * 3)
    assert len(results["claims"]) >= 6
