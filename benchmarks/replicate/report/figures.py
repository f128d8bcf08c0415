"""The report's figures: training curves per section, dense against k-NN, and compute relative to GPT-2 Base."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import mean

from .stats import by_row, curve_points, paired_curves, ratio_or_nan


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _mean_curve(runs: list[dict], curve: str) -> tuple[list[float], list[float], list[float], list[float]]:
    steps = [s for s, _ in curve_points(runs[0], curve)]
    columns = [[dict(curve_points(r, curve)).get(s, math.nan) for r in runs] for s in steps]
    return steps, [mean(c) for c in columns], [min(c) for c in columns], [max(c) for c in columns]


def plot_language(language: dict, path: Path) -> None:
    """Training and validation loss curves of the dense language rows (mean over seeds, min..max band)."""
    plt = _pyplot()
    grouped = by_row(language["runs"])
    tokens_per_step = language["tokens_per_step"]
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for _name, runs in grouped.items():
        if runs[0]["knn"]:
            continue
        steps, values, low, high = _mean_curve(runs, "eval")
        x = [s * tokens_per_step / 1e3 for s in steps]
        (line,) = axes[1].plot(x, values, "o-", label=f"{runs[0]['label']} (n={len(runs)})")
        axes[1].fill_between(x, low, high, color=line.get_color(), alpha=0.2)
        steps, values, _, _ = _mean_curve(runs, "train")
        axes[0].plot(
            [s * tokens_per_step / 1e3 for s in steps], values, color=line.get_color(), label=runs[0]["label"]
        )
    axes[0].set_title("training loss (mean over seeds)")
    axes[1].set_title("validation loss (mean; band = min..max over seeds)")
    for ax in axes:
        ax.set_xlabel("training tokens (thousands)")
        ax.set_ylabel("cross-entropy (nats)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_vision(vision: dict, path: Path) -> None:
    """Training loss and validation accuracy curves of the dense vision rows (mean over seeds, min..max band)."""
    plt = _pyplot()
    grouped = by_row(vision["runs"])
    images_per_step = vision["images_per_step"]
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for _name, runs in grouped.items():
        if runs[0]["knn"]:
            continue
        steps, values, low, high = _mean_curve(runs, "eval")
        x = [s * images_per_step / 1e3 for s in steps]
        (line,) = axes[1].plot(x, [100 * v for v in values], "o-", label=f"{runs[0]['label']} (n={len(runs)})")
        axes[1].fill_between(x, [100 * v for v in low], [100 * v for v in high], color=line.get_color(), alpha=0.2)
        steps, values, _, _ = _mean_curve(runs, "train")
        axes[0].plot([s * images_per_step / 1e3 for s in steps], values, color=line.get_color())
    axes[0].set_title("training loss (mean over seeds)")
    axes[0].set_ylabel("cross-entropy")
    axes[1].set_title("validation accuracy (mean; band = min..max over seeds)")
    axes[1].set_ylabel("accuracy (%)")
    for ax in axes:
        ax.set_xlabel("training images seen (thousands)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_knn(language: dict | None, vision: dict | None, path: Path) -> None:
    """Each dense row's validation curve beside its k-NN twin's (same seed)."""
    plt = _pyplot()
    panels = [(language, "eval", "validation loss (nats)", 1.0), (vision, "eval", "validation accuracy (%)", 100.0)]
    panels = [p for p in panels if p[0] is not None]
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (section, curve, ylabel, scale) in zip(axes[0], panels, strict=True):
        grouped = by_row(section["runs"])
        per_step = section.get("tokens_per_step") or section.get("images_per_step")
        for name, runs in grouped.items():
            if runs[0]["knn"] or f"{name}+knn" not in grouped:
                continue
            curves = paired_curves(grouped, name, f"{name}+knn", curve)
            if curves is None:
                continue
            dense, knn = curves
            (line,) = ax.plot([s * per_step / 1e3 for s, _ in dense], [v * scale for _, v in dense], "o-")
            ax.plot([s * per_step / 1e3 for s, _ in knn], [v * scale for _, v in knn], "x--", color=line.get_color())
            line.set_label(runs[0]["label"].split(" (")[0])
        ax.set_xlabel("training " + ("tokens" if "tokens_per_step" in section else "images") + " (thousands)")
        ax.set_ylabel(ylabel)
        ax.set_title("dense (solid) vs k-NN, k = n/2 (dashed); same seed")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_compute(compute: dict, path: Path) -> None:
    """GFLOPs, time and peak memory of every model relative to GPT-2 Base."""
    plt = _pyplot()
    names = list(compute["full_size"])
    base = "GPT-2 Base"
    metrics = [
        ("GFLOPs (full size)", [compute["full_size"][n]["gflops"] for n in names]),
        ("s / forward (scaled)", [compute["scaled"][n]["seconds_per_forward"] for n in names]),
        ("peak MB (scaled)", [compute["scaled"][n]["peak_extra_mb"] for n in names]),
    ]
    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (title, values) in zip(axes, metrics, strict=True):
        reference = values[names.index(base)]
        ax.barh(
            names,
            [ratio_or_nan(v, reference) for v in values],
            color=["tab:gray" if "GPT" in n else "tab:blue" for n in names],
        )
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_title(f"{title}, relative to {base}", fontsize=9)
        ax.invert_yaxis()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------------------------
# Sections
