"""The experiments' functional MSSA operator (`aot_transformers.experiments.subspace`)."""

from __future__ import annotations

import pytest
import torch

from aot_transformers.experiments.subspace import subspace_attention


def test_subspace_attention_matches_written_out_formula():
    """MSSA(Z) = Σ_k U_k U_kᵀ Z φ(Zᵀ U_k U_kᵀ Z), with Z holding tokens as columns."""
    torch.manual_seed(0)
    d, n, heads, rank = 6, 5, 2, 3
    x = torch.randn(1, n, d, dtype=torch.float64)
    subspaces = torch.randn(heads, d, rank, dtype=torch.float64)
    z = x[0].T  # (d, N)
    expected = torch.zeros(d, n, dtype=torch.float64)
    for u in subspaces:
        gram = z.T @ u @ u.T @ z  # (N, N), symmetric
        expected += u @ u.T @ z @ torch.softmax(0.7 * gram, dim=0)  # φ normalises over keys
    got = subspace_attention(x, subspaces, phi="softmax", scaling=0.7)
    torch.testing.assert_close(got[0], expected.T)
    linear = subspace_attention(x, subspaces, phi="linear", scaling=0.7)
    expected_linear = sum(u @ u.T @ z @ (0.7 * z.T @ u @ u.T @ z) for u in subspaces)
    torch.testing.assert_close(linear[0], expected_linear.T)


def test_subspace_attention_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="subspaces"):
        subspace_attention(torch.randn(1, 4, 6), torch.randn(2, 5, 3))
