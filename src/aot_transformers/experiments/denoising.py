"""Denoising by unrolled subspace attention (AoT, Wang et al. 2025, Definition 1, Eq. (6), Theorem 1 and Fig. 4).

Tokens are rows here (the paper's columns): `Z` is (N, d). A token of cluster k is

    z_i = U_k a_i + Σ_{j≠k} U_j e_ij,   a_i ~ N(0, I_p),   e_ij ~ N(0, δ² I_p),

with K orthonormal, mutually orthogonal bases `U_k` (d × p). One layer is the residual MSSA step

    Z ← Z + η · Σ_k U_k U_kᵀ Z φ(Zᵀ U_k U_kᵀ Z)        (columns as tokens)

computed by `aot_transformers.experiments.subspace.subspace_attention` with the known `U_k`. The per-cluster
signal-to-noise ratio (Eq. 6) is ‖U_k U_kᵀ Z_k‖_F / ‖(I − U_k U_kᵀ) Z_k‖_F over the tokens Z_k of cluster k.

Theorem 1 uses φ = h∘softmax, h(x) = τ·1{x > τ} on each weight, τ ∈ (1/2, 1/(1 + N·e^(−9p/32))]: a query's weights
sum to 1, so at most one passes. When a token keeps only its own weight in its own head and nothing in the other
heads (`thresholding_pattern_holds`; a layer is "in the theorem's regime" when every token does), the layer
multiplies its signal part by (1 + ητ) and leaves its noise, so every cluster's SNR grows by exactly (1 + ητ).
`theorem1_hypotheses` reports which of the theorem's assumptions on (N, K, p, δ, τ) a run meets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import torch

from .study import (
    Count,
    NonNegative,
    Positive,
    Range,
    Seed,
    Study,
    StudyOptions,
    arg,
    check_choice,
    check_int,
    check_real,
    make_generator,
    set_axes,
)
from .subspace import subspace_attention

if TYPE_CHECKING:
    from matplotlib.axes import Axes

PHIS = ("softmax", "threshold")


def orthogonal_subspaces(
    ambient_dim: int, num_subspaces: int, subspace_dim: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """K random, mutually orthogonal orthonormal bases (K, d, p) in R^d (d >= K·p): U_kᵀ U_j = 0, U_kᵀ U_k = I_p."""
    check_int("num_subspaces", num_subspaces)
    check_int("subspace_dim", subspace_dim)
    check_int("ambient_dim", ambient_dim)
    if ambient_dim < num_subspaces * subspace_dim:
        raise ValueError(
            f"`ambient_dim` ({ambient_dim}) must be >= num_subspaces * subspace_dim "
            f"({num_subspaces} * {subspace_dim} = {num_subspaces * subspace_dim}) for orthogonal subspaces."
        )
    gaussian = torch.randn(ambient_dim, num_subspaces * subspace_dim, generator=generator, dtype=torch.float64)
    basis, _ = torch.linalg.qr(gaussian)  # (d, K·p), orthonormal columns
    return basis.T.reshape(num_subspaces, subspace_dim, ambient_dim).transpose(1, 2).contiguous()  # (K, d, p)


def sample_noisy_subspace_mixture(
    num_tokens: int, subspaces: torch.Tensor, noise_level: float, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """N tokens from the mixture of noisy low-rank Gaussians of Definition 1, in K equal clusters (N a multiple of K).

    `subspaces` (K, d, p) from `orthogonal_subspaces`; `noise_level` δ >= 0 is the standard deviation of the
    components in the other subspaces. Returns `tokens` (N, d) (float64) and their cluster `labels` (N,).
    """
    num_subspaces, _, subspace_dim = subspaces.shape
    check_int("num_tokens", num_tokens)
    check_real("noise_level", noise_level, 0.0)
    if num_tokens % num_subspaces != 0:
        raise ValueError(
            f"`num_tokens` ({num_tokens}) must be a multiple of the number of subspaces ({num_subspaces})."
        )
    labels = torch.arange(num_subspaces).repeat_interleave(num_tokens // num_subspaces)  # (N,)
    coefficients = noise_level * torch.randn(
        num_tokens, num_subspaces, subspace_dim, generator=generator, dtype=torch.float64
    )  # (N, K, p): noise in every subspace...
    signal = torch.randn(num_tokens, subspace_dim, generator=generator, dtype=torch.float64)
    coefficients[torch.arange(num_tokens), labels] = signal  # ...except the token's own, which carries a_i
    tokens = torch.einsum("nkp,kdp->nd", coefficients, subspaces.to(torch.float64))
    return tokens, labels


def per_cluster_snr(tokens: torch.Tensor, labels: torch.Tensor, subspaces: torch.Tensor) -> torch.Tensor:
    """Eq. (6): for each cluster k, ‖U_k U_kᵀ Z_k‖_F / ‖(I − U_k U_kᵀ) Z_k‖_F over its tokens Z_k; (K,), +inf without
    noise."""
    snr = []
    for k in range(subspaces.shape[0]):
        cluster = tokens[labels == k]  # (N_k, d)
        signal = cluster @ subspaces[k].to(tokens.dtype)  # coordinates in U_k; ‖U_k c‖ = ‖c‖
        signal_energy = signal.square().sum()
        noise_energy = (cluster.square().sum() - signal_energy).clamp(min=0.0)
        snr.append((signal_energy / noise_energy).sqrt())
    return torch.stack(snr)


def hard_threshold(tau: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """The φ of Theorem 1 for `subspace_attention(phi=...)`: softmax over the keys, then h(x) = τ·1{x > τ}.

    Any τ in (0, 1) is accepted (below 1/2 it may keep several keys); `theorem1_hypotheses` reports whether a run's τ
    lies in the theorem's range.
    """
    tau = check_real("tau", tau, 0.0, 1.0, open_min=True, open_max=True)

    def phi(scores: torch.Tensor) -> torch.Tensor:
        weights = torch.softmax(scores, dim=-1)
        return tau * (weights > tau).to(weights.dtype)

    return phi


def mssa_step(
    tokens: torch.Tensor,
    subspaces: torch.Tensor,
    step_size: float,
    phi: str | Callable[[torch.Tensor], torch.Tensor],
    scaling: float = 1.0,
) -> torch.Tensor:
    """One unrolled denoising layer, `Z + η · MSSA(Z)` with the known subspaces (tokens as rows, (N, d))."""
    update = subspace_attention(tokens[None], subspaces.to(tokens.dtype), phi=phi, scaling=scaling)[0]
    return tokens + step_size * update


def thresholding_pattern_holds(
    tokens: torch.Tensor, labels: torch.Tensor, subspaces: torch.Tensor, tau: float, scaling: float = 1.0
) -> torch.Tensor:
    """Per token (N,), whether the thresholded attention has the pattern the proof of Theorem 1 needs: in the token's
    own head its softmax weight on itself exceeds τ and no other weight does; in every other head no weight exceeds τ.
    """
    projected = torch.einsum("nd,kdp->knp", tokens, subspaces.to(tokens.dtype))  # (K, N, p)
    weights = torch.softmax(scaling * projected @ projected.transpose(-1, -2), dim=-1)  # (K, N, N)
    kept = weights > tau
    index = torch.arange(tokens.shape[0])
    own_kept = kept[labels, index]  # (N, N): the token's own head
    self_kept = own_kept[index, index]
    only_self = own_kept.sum(-1) == 1
    others_silent = kept.any(-1).sum(0) - own_kept.any(-1).to(torch.long) == 0  # no other head keeps a key
    return self_kept & only_self & others_silent


def theorem1_hypotheses(
    num_tokens: int, num_subspaces: int, subspace_dim: int, noise_level: float, tau: float
) -> dict[str, dict[str, Any]]:
    """Theorem 1's assumptions for (N, K, p, δ, τ), each with its value and whether it holds.

    - Theorem 1: p ≳ log N (checked as p ≥ log N), δ ≲ √(log N / p) (checked as δ ≤ √(log N / p)),
      τ ∈ (1/2, 1/(1 + N·e^(−9p/32))].
    - Lemma 2 (Eq. 11): N ≥ 8πK² log³ N and δ ≤ (1/8)√(log N / p).
    - The proof (Appendix A, after Eq. 22): p ≥ 64(√log N + 1)².

    The "≳"/"≲" hide unspecified constants; the explicit constants of Lemma 2 and the proof are the sufficient
    conditions the paper states. A run outside them can still show the (1 + ητ) rate (the theorem is sufficient).
    """
    n, k, p = num_tokens, num_subspaces, subspace_dim
    log_n = math.log(n)
    tau_max = 1.0 / (1.0 + n * math.exp(-9 * p / 32))
    delta_max, p_min, n_min = math.sqrt(log_n / p), 64 * (math.sqrt(log_n) + 1) ** 2, 8 * math.pi * k**2 * log_n**3
    checks = {
        "p >= log N": (p, log_n, p >= log_n),
        "delta <= sqrt(log N / p)": (noise_level, delta_max, noise_level <= delta_max),
        "delta <= sqrt(log N / p) / 8 (Lemma 2)": (noise_level, delta_max / 8, noise_level <= delta_max / 8),
        "p >= 64 (sqrt(log N) + 1)^2 (proof)": (p, p_min, p >= p_min),
        "N >= 8 pi K^2 log^3 N (Lemma 2)": (n, n_min, n >= n_min),
        "tau in (1/2, 1/(1 + N exp(-9p/32))]": (tau, tau_max, 0.5 < tau <= tau_max),
    }
    return {name: {"value": value, "bound": bound, "holds": bool(ok)} for name, (value, bound, ok) in checks.items()}


def unroll(
    tokens: torch.Tensor,
    labels: torch.Tensor,
    subspaces: torch.Tensor,
    num_layers: int,
    step_size: float,
    phi: str = "threshold",
    tau: float = 0.5,
    scaling: float = 1.0,
) -> dict[str, torch.Tensor]:
    """Run `num_layers` denoising layers of step size η from Z⁽⁰⁾ = `tokens` (N, d) and record the per-cluster SNR.

    `phi` is `"threshold"` (Theorem 1's h∘softmax with τ = `tau`) or `"softmax"` (τ then only serves the thresholding
    pattern's report); `scaling` multiplies the scores Zᵀ U_k U_kᵀ Z (the theorem uses 1). Returns `snr`
    (num_layers + 1, K), `ratio` (num_layers, K) = SNR after / before each layer, `pattern_fraction` (num_layers,),
    the fraction of tokens for which the thresholding pattern held at each layer's input, and the last `tokens`.
    """
    check_int("num_layers", num_layers)
    check_real("step_size", step_size, 0.0, open_min=True)
    check_real("scaling", scaling, 0.0, open_min=True)
    phi_fn = "softmax" if check_choice("phi", phi, PHIS) == "softmax" else hard_threshold(tau)
    snr = [per_cluster_snr(tokens, labels, subspaces)]
    pattern = []
    for _ in range(num_layers):
        pattern.append(thresholding_pattern_holds(tokens, labels, subspaces, tau, scaling).double().mean())
        tokens = mssa_step(tokens, subspaces, step_size, phi_fn, scaling)
        snr.append(per_cluster_snr(tokens, labels, subspaces))
    snr = torch.stack(snr)
    return {"snr": snr, "ratio": snr[1:] / snr[:-1], "pattern_fraction": torch.stack(pattern), "tokens": tokens}


@dataclass
class Options(StudyOptions):
    noise_levels: list[NonNegative] = arg([0.2, 0.5], "δ values (Fig. 4 uses 0.2 and 0.5)")
    num_subspaces: Count = arg(4, "K")
    subspace_dim: Count = arg(128, "p")
    ambient_dim: Count | None = arg(None, "d (default K·p)")
    num_tokens: Annotated[int, Range(2)] = arg(512, "N")
    num_layers: Count = arg(8, "layers unrolled")
    step_size: Positive = arg(0.2, "η")
    tau: Annotated[float, Range(0.0, 1.0, open_low=True, open_high=True)] = arg(
        0.6, "τ of the hard threshold, in (0, 1); Theorem 1 takes (1/2, 1/(1 + N e^(-9p/32))]"
    )
    scaling: Positive | None = arg(
        None,
        "factor on the scores Zᵀ U_k U_kᵀ Z (default 1/√p, a model's MSSA; Theorem 1 writes 1, which needs "
        "δ ≤ √(log N / p): at δ = 0.5 the other heads' noise scores then pass the threshold)",
    )
    seed: Seed = arg(0, "random seed")


def snr_curves(
    study: Study, o: Options, delta: float, subspaces: torch.Tensor, generator: torch.Generator, ax: Axes
) -> None:
    """AoT Theorem 1 / Fig. 4 at one noise level δ: per-layer SNR with φ = h∘softmax and with softmax, beside which
    of Theorem 1's hypotheses hold and whether the proof's thresholding pattern did."""
    num_layers, tau, target = o.num_layers, o.tau, 1.0 + o.step_size * o.tau
    tokens, labels = sample_noisy_subspace_mixture(o.num_tokens, subspaces, delta, generator)
    for phi in PHIS:
        result = unroll(tokens, labels, subspaces, num_layers, o.step_size, phi, tau, o.scaling)
        mean_snr = result["snr"].mean(dim=1)
        ratios = result["ratio"]  # (num_layers, K)
        record = {
            "noise_level": delta,
            "phi": phi,
            "snr_per_layer": result["snr"],
            "mean_snr_per_layer": mean_snr,
            "ratio_per_layer": ratios,
            "mean_ratio_per_layer": ratios.mean(dim=1),
            "pattern_fraction_per_layer": result["pattern_fraction"],
            "layers_in_regime": int((result["pattern_fraction"] == 1.0).sum()),
        }
        if phi == "threshold":
            hypotheses = theorem1_hypotheses(o.num_tokens, o.num_subspaces, o.subspace_dim, delta, tau)
            record["theorem1_hypotheses"] = hypotheses
            failed = [name for name, h in hypotheses.items() if not h["holds"]]
            study.claim(
                f"Theorem 1 / Lemma 2 hypotheses, N={o.num_tokens}, K={o.num_subspaces}, "
                f"p={o.subspace_dim}, δ={delta}, τ={tau}",
                "all hold"
                if not failed
                else "not met: "
                + "; ".join(f"{n} ({hypotheses[n]['value']:.3g} vs {hypotheses[n]['bound']:.3g})" for n in failed),
                "sufficient conditions for the (1 + ητ) rate",
                None,
            )
            deviation = (ratios / target - 1.0).abs()  # every layer, every cluster
            record["max_relative_deviation"] = float(deviation.max())
            study.claim(
                f"SNR ratio per layer, h∘softmax, δ={delta}",
                f"{ratios.mean():.4f} (max dev {deviation.max():.2%} over {num_layers} layers; the proof's "
                f"thresholding pattern held for {result['pattern_fraction'].min():.1%}–"
                f"{result['pattern_fraction'].max():.1%} of tokens)",
                f"1 + ητ = {target:.4f} (±2%)",
                float(deviation.max()) <= 0.02,
            )
        else:
            per_layer = ratios.mean(1)
            study.claim(
                f"SNR ratio per layer, softmax, δ={delta}",
                f"{ratios.mean():.4f} (layers: {per_layer.min():.3f}–{per_layer.max():.3f})",
                "grows linearly with depth (no exact rate)",
                None,
            )
        study.results["runs"][f"delta={delta}/phi={phi}"] = record
        label = "h∘softmax (Thm 1)" if phi == "threshold" else "softmax"
        ax.semilogy(range(num_layers + 1), mean_snr, marker="o", label=label)
    first = study.results["runs"][f"delta={delta}/phi=threshold"]["mean_snr_per_layer"][0]
    ax.semilogy(range(num_layers + 1), first * target ** torch.arange(num_layers + 1), "k--", label="(1+ητ)^ℓ · SNR₀")
    set_axes(ax, title=f"δ = {delta}", xlabel="layer ℓ", ylabel="mean per-cluster SNR (Eq. 6)")


def run(out: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """The denoising study: SNR per layer for each noise level, with Theorem 1's φ and with softmax (`Options`)."""
    o = Options.parse(options)
    o.ambient_dim = o.num_subspaces * o.subspace_dim if o.ambient_dim is None else o.ambient_dim
    o.scaling = o.subspace_dim**-0.5 if o.scaling is None else o.scaling
    study = Study("denoising", "Denoising by unrolled MSSA (AoT Theorem 1, Fig. 4)", o, out)
    generator = make_generator(o.seed)
    subspaces = orthogonal_subspaces(o.ambient_dim, o.num_subspaces, o.subspace_dim, generator)
    study.results.update(target_ratio=1.0 + o.step_size * o.tau, runs={})
    axes = study.figure("snr_per_layer.png", ncols=len(o.noise_levels))
    for column, delta in enumerate(o.noise_levels):
        snr_curves(study, o, delta, subspaces, generator, axes[0, column])
    study.note(
        "Theorem 1: with φ = h∘softmax, h(x) = τ·1{x > τ}, each layer multiplies every cluster's SNR by (1 + ητ)."
    )
    study.note(
        "A layer is 'in regime' when the thresholding pattern of the proof held for every token "
        "(own weight > τ in the own head, no weight > τ in the other heads)."
    )
    return study.finish()
