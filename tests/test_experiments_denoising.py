"""Denoising study (AoT Theorem 1): sampler, SNR metric, the MSSA step, the thresholded φ and the theorem's rate."""

from __future__ import annotations

import json
import math

import pytest
import torch

from aot_transformers.experiments import denoising as D

pytestmark = pytest.mark.usefixtures("one_thread")


def _mixture(num_subspaces=2, subspace_dim=64, num_tokens=64, noise=0.2, seed=0):
    generator = D.make_generator(seed)
    subspaces = D.orthogonal_subspaces(num_subspaces * subspace_dim, num_subspaces, subspace_dim, generator)
    tokens, labels = D.sample_noisy_subspace_mixture(num_tokens, subspaces, noise, generator)
    return tokens, labels, subspaces


def test_subspaces_are_orthonormal_and_mutually_orthogonal():
    subspaces = D.orthogonal_subspaces(20, 3, 5, D.make_generator(1))
    assert subspaces.shape == (3, 20, 5)
    flat = subspaces.transpose(1, 2).reshape(15, 20)  # all basis vectors as rows
    torch.testing.assert_close(flat @ flat.T, torch.eye(15, dtype=flat.dtype), atol=1e-10, rtol=0)


def test_subspaces_reject_too_small_ambient_dim():
    with pytest.raises(ValueError, match="ambient_dim"):
        D.orthogonal_subspaces(8, 3, 3)


def test_sampler_shapes_balanced_clusters_and_structure():
    tokens, labels, subspaces = _mixture(num_subspaces=4, subspace_dim=8, num_tokens=40, noise=0.0)
    assert tokens.shape == (40, 32) and labels.shape == (40,)
    assert labels.bincount().tolist() == [10, 10, 10, 10]
    # Without noise every token lies in its own subspace.
    for k in range(4):
        cluster = tokens[labels == k]
        inside = cluster @ subspaces[k] @ subspaces[k].T
        torch.testing.assert_close(inside, cluster)


def test_sampler_rejects_negative_noise_and_uneven_clusters():
    subspaces = D.orthogonal_subspaces(8, 2, 4)
    with pytest.raises(ValueError, match="noise_level"):
        D.sample_noisy_subspace_mixture(8, subspaces, -0.1)
    with pytest.raises(ValueError, match="multiple"):
        D.sample_noisy_subspace_mixture(7, subspaces, 0.1)


def test_snr_hand_case():
    # Token of cluster 0 = 3 e0 (its subspace) + e1 (cluster 1's subspace): SNR = 3. Cluster 1 noiseless: inf.
    # U_0 = e0, U_1 = e1.
    subspaces = torch.stack([torch.tensor([[1.0], [0.0]]), torch.tensor([[0.0], [1.0]])]).double()
    tokens = torch.tensor([[3.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    snr = D.per_cluster_snr(tokens, torch.tensor([0, 1]), subspaces)
    assert snr[0].item() == pytest.approx(3.0)
    assert math.isinf(snr[1].item())


def test_initial_snr_matches_the_model():
    # E‖signal‖² = p, E‖noise‖² = (K−1) δ² p, so the SNR concentrates at 1 / (δ √(K−1)).
    tokens, labels, subspaces = _mixture(num_subspaces=4, subspace_dim=32, num_tokens=400, noise=0.25)
    snr = D.per_cluster_snr(tokens, labels, subspaces)
    assert snr.mean().item() == pytest.approx(1 / (0.25 * math.sqrt(3)), rel=0.03)


def test_hard_threshold_outputs_only_zero_or_tau():
    # Theorem 1's range τ ∈ (1/2, 1/(1 + N e^(−9p/32))]: the weights sum to 1, so at most one can exceed τ > 1/2.
    for tau in (0.5, 0.75):
        weights = D.hard_threshold(tau)(torch.randn(2, 3, 5, 5) * 4)
        assert set(weights.unique().tolist()) <= {0.0, tau}
        assert (weights > 0).sum(-1).max() <= 1
        assert (weights > 0).any()
    # Below 1/2 two weights of one query can both pass (0.45 + 0.45 + 0.1): why the theorem needs τ > 1/2.
    scores = torch.tensor([0.45, 0.45, 0.1]).log()
    assert (D.hard_threshold(0.4)(scores) > 0).sum() == 2
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="tau"):
            D.hard_threshold(bad)


def test_theorem1_hypotheses_are_reported():
    # N = 512, K = 4, p = 128 (the study's default) against the paper's explicit constants.
    hypotheses = D.theorem1_hypotheses(512, 4, 128, 0.2, 0.75)
    assert hypotheses["p >= log N"]["holds"] and hypotheses["tau in (1/2, 1/(1 + N exp(-9p/32))]"]["holds"]
    proof = hypotheses["p >= 64 (sqrt(log N) + 1)^2 (proof)"]
    assert not proof["holds"] and proof["bound"] == pytest.approx(64 * (6.238**0.5 + 1) ** 2, rel=1e-3)
    assert not D.theorem1_hypotheses(512, 4, 128, 0.2, 0.5)["tau in (1/2, 1/(1 + N exp(-9p/32))]"]["holds"]
    # A small p makes the upper end of τ's range fall below 1/2: no τ satisfies the theorem.
    assert not D.theorem1_hypotheses(512, 4, 16, 0.1, 0.75)["tau in (1/2, 1/(1 + N exp(-9p/32))]"]["holds"]


def test_mssa_step_equals_the_papers_column_formula():
    tokens, _, subspaces = _mixture(num_subspaces=2, subspace_dim=3, num_tokens=6, noise=0.3)
    step, scaling = 0.5, 0.7
    columns = tokens.T  # the paper's Z: tokens as columns (d, N)
    expected = columns.clone()
    for U in subspaces:
        gram = scaling * columns.T @ U @ U.T @ columns  # (N, N), symmetric
        expected += step * U @ U.T @ columns @ torch.softmax(gram, dim=0)  # φ normalises each column
    torch.testing.assert_close(D.mssa_step(tokens, subspaces, step, "softmax", scaling), expected.T)


def test_theorem1_rate_in_regime():
    tokens, labels, subspaces = _mixture(num_subspaces=2, subspace_dim=64, num_tokens=64, noise=0.2)
    step, tau = 0.2, 0.5
    result = D.unroll(tokens, labels, subspaces, 4, step, "threshold", tau, scaling=64**-0.5)
    assert torch.all(result["pattern_fraction"] == 1.0)  # the proof's thresholding pattern held everywhere
    torch.testing.assert_close(result["ratio"], torch.full_like(result["ratio"], 1 + step * tau), rtol=0.02, atol=0)


def test_theorem1_rate_also_for_larger_noise():
    tokens, labels, subspaces = _mixture(num_subspaces=2, subspace_dim=64, num_tokens=64, noise=0.5, seed=3)
    result = D.unroll(tokens, labels, subspaces, 3, 0.4, "threshold", 0.5, scaling=64**-0.5)
    in_regime = result["pattern_fraction"] == 1.0
    assert in_regime.any()
    assert torch.allclose(result["ratio"][in_regime], torch.tensor(1.2, dtype=torch.float64), rtol=0.02)


def test_softmax_layers_also_denoise_early():
    tokens, labels, subspaces = _mixture(num_subspaces=2, subspace_dim=64, num_tokens=64, noise=0.2)
    result = D.unroll(tokens, labels, subspaces, 2, 0.2, "softmax", scaling=64**-0.5)
    assert torch.all(result["ratio"] > 1.0)


def test_unroll_rejects_bad_options():
    tokens, labels, subspaces = _mixture(num_subspaces=2, subspace_dim=4, num_tokens=8)
    with pytest.raises(ValueError, match="phi"):
        D.unroll(tokens, labels, subspaces, 1, 0.1, "relu")
    with pytest.raises(ValueError, match="step_size"):
        D.unroll(tokens, labels, subspaces, 1, -0.1)
    with pytest.raises(ValueError, match="num_layers"):
        D.unroll(tokens, labels, subspaces, 0, 0.1)


def test_run_writes_artifacts_and_the_claim_holds(tmp_path):
    results = D.run(out=tmp_path, noise_levels=(0.2,), num_subspaces=2, subspace_dim=64, num_tokens=64, num_layers=3)
    assert {p.name for p in tmp_path.iterdir()} >= {"results.json", "summary.md", "snr_per_layer.png"}
    saved = json.loads((tmp_path / "results.json").read_text())
    threshold_claim = next(c for c in saved["claims"] if "h∘softmax" in c["quantity"])
    assert threshold_claim["holds"] is True
    assert "1 + ητ" in (tmp_path / "summary.md").read_text()
    assert results["target_ratio"] == pytest.approx(1 + 0.2 * 0.6)  # η = 0.2, τ = 0.6 (in Theorem 1's range)
    hypotheses = results["runs"]["delta=0.2/phi=threshold"]["theorem1_hypotheses"]
    assert hypotheses["tau in (1/2, 1/(1 + N exp(-9p/32))]"]["holds"]
    assert any("hypotheses" in c["quantity"] for c in saved["claims"])


def test_run_rejects_negative_noise(tmp_path):
    with pytest.raises(ValueError, match="noise_levels"):
        D.run(out=tmp_path, noise_levels=(-0.2,))
