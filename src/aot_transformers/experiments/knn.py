"""k-NN attention (KVT, Wang et al. 2022, https://arxiv.org/abs/2106.00515): noise distillation and training speed.

1. Noise distillation (the setting of KVT's Lemma 2). A query attends over n tokens: a fraction 1 − r of "relevant"
   tokens share the query's mean μ (x = μ + σε), the rest are noisy tokens drawn around other means. The attention
   output should estimate μ. Dense softmax attention gives every noisy token some weight, so its output drifts
   towards the noisy means as r grows; keeping only the k best-scoring keys drops most noisy tokens first. Queries,
   keys and values are the tokens themselves: `subspace_attention` with U = I, φ = softmax and `knn_k`.
2. Training speed on real images: AoT (MSSA, no MLP) and a ViT-shaped model (MHSA + MLP) on CIFAR-10 files, dense
   versus k ≈ n/2 (`knn_k=0.5`), validation accuracy per epoch with the same seeds, data and budget (Table 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch

from ..configuration_aot import AoTConfig
from ..modeling_aot import AoTForImageClassification
from . import _vision
from .study import Count, Range, Seed, Study, StudyOptions, arg, check_int, check_real, close, make_generator, set_axes
from .subspace import subspace_attention

ARCHITECTURES = ("aot", "vit")


def sample_noisy_tokens(
    num_tokens: int,
    dim: int,
    noise_ratio: float,
    num_noise_means: int = 8,
    mean_norm: float = 4.0,
    sigma: float = 1.0,
    num_trials: int = 1,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """B = `num_trials` sets of n tokens in R^d of the noise-distillation setting: relevant tokens around μ, a fraction
    r = `noise_ratio` in [0, 1) of noisy ones (rounded down; at least one token stays relevant) around
    `num_noise_means` other means. Every mean has norm `mean_norm` (independent random directions); each token lies
    `sigma` (standard deviation) around its mean. Returns `tokens` (B, n, d), `relevant` boolean (B, n), `mu` (B, d).
    """
    check_int("num_tokens", num_tokens, 2)
    check_int("dim", dim)
    check_real("noise_ratio", noise_ratio, 0.0, 1.0, open_max=True)
    check_int("num_noise_means", num_noise_means)
    check_real("mean_norm", mean_norm, 0.0)
    check_real("sigma", sigma, 0.0)
    means = torch.randn(num_trials, num_noise_means + 1, dim, generator=generator)
    means = mean_norm * means / means.norm(dim=-1, keepdim=True)  # (B, M+1, d); row 0 is μ
    num_noisy = min(int(noise_ratio * num_tokens), num_tokens - 1)
    which = torch.zeros(num_trials, num_tokens, dtype=torch.long)
    which[:, num_tokens - num_noisy :] = torch.randint(
        1, num_noise_means + 1, (num_trials, num_noisy), generator=generator
    )
    centres = means.gather(1, which.unsqueeze(-1).expand(-1, -1, dim))  # (B, n, d)
    tokens = centres + sigma * torch.randn(num_trials, num_tokens, dim, generator=generator)
    return tokens, which == 0, means[:, 0]


def attention_distance_to_mean(
    tokens: torch.Tensor, relevant: torch.Tensor, mu: torch.Tensor, knn_k: int | float | None, scaling: float
) -> float:
    """Mean ‖attention output − μ‖ over the relevant queries, with Q = K = V = the tokens and top-`knn_k` keys."""
    identity = torch.eye(tokens.shape[-1], dtype=tokens.dtype).unsqueeze(0)  # (1, d, d)
    output = subspace_attention(tokens, identity, phi="softmax", scaling=scaling, knn_k=knn_k)  # (B, n, d)
    distance = (output - mu[:, None]).norm(dim=-1)
    return float(distance[relevant].mean())


def noise_distillation_curve(
    noise_ratios: Sequence[float], ks: Sequence[int | float | None], seed: int = 0, **sampling: Any
) -> dict[str, list[float]]:
    """Distance of the attention output to the relevant mean, per k (None = dense), for each noise ratio.

    `sampling` goes to `sample_noisy_tokens`, with other defaults here: 128 tokens, d = 32, `mean_norm` 3, `sigma`
    0.3, 32 trials. Scores are scaled by 1/√d, as in a transformer head. The same tokens are used for every k.
    """
    sampling = {"num_tokens": 128, "dim": 32, "mean_norm": 3.0, "sigma": 0.3, "num_trials": 32, **sampling}
    generator = make_generator(seed)
    curves: dict[str, list[float]] = {_k_label(k): [] for k in ks}
    for ratio in noise_ratios:
        tokens, relevant, mu = sample_noisy_tokens(noise_ratio=ratio, generator=generator, **sampling)
        for k in ks:
            curves[_k_label(k)].append(attention_distance_to_mean(tokens, relevant, mu, k, sampling["dim"] ** -0.5))
    return curves


def _k_label(k: int | float | None) -> str:
    if k is None:
        return "dense"
    return f"k = {k:g}·n" if isinstance(k, float) else f"k = {k}"


def vision_config(
    architecture: str,
    knn_k: int | float | None,
    image_size: int = 32,
    patch_size: int = 4,
    hidden_size: int = 96,
    num_layers: int = 4,
    num_heads: int = 4,
    num_labels: int = 10,
    num_channels: int = 3,
) -> AoTConfig:
    """A small image classifier: `"aot"` (MSSA, no MLP) or `"vit"` (MHSA + an MLP in every layer)."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"`architecture` must be one of {list(ARCHITECTURES)}, got {architecture!r}.")
    return AoTConfig(
        image_size=image_size,
        patch_size=patch_size,
        num_channels=num_channels,
        num_labels=num_labels,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        attention_type="mssa" if architecture == "aot" else "mhsa",
        mlp_layers="none" if architecture == "aot" else "all",
        knn_k=knn_k,
        pooling="cls",
    )


@dataclass
class Options(StudyOptions):
    noise_ratios: list[Annotated[float, Range(0.0, 1.0, open_high=True)]] = arg(
        [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], "noise ratios, in [0, 1)"
    )
    num_tokens: Count = arg(128, "tokens per trial")
    dim: Count = arg(32, "token dimension")
    num_trials: Count = arg(32, "trials per noise ratio")
    data_dir: str | None = arg(None, "folder with vision/cifar10/train_<class>.tar.gz")
    per_class: Count = arg(500, "CIFAR-10 training images per class")
    epochs: Count = arg(5, "training epochs")
    hidden_size: Count = arg(96, "width of the classifiers")
    num_layers: Count = arg(4, "layers of the classifiers")
    skip_training: bool = arg(False, "only the noise-distillation part")
    seed: Seed = arg(0, "random seed")
    num_seeds: Count = arg(1, "training runs of each model, seeds seed, seed + 1, ...")
    architectures: list[str] = arg(list(ARCHITECTURES), "classifiers to train", ARCHITECTURES)


def distillation(study: Study, o: Options) -> None:
    """KVT's noise-distillation lemma: ‖attention output − μ‖ of dense against top-k attention, per noise ratio."""
    ratios = o.noise_ratios
    ks: list[int | float | None] = [None, 0.5, 0.25]
    curves = noise_distillation_curve(ratios, ks, o.seed, num_tokens=o.num_tokens, dim=o.dim, num_trials=o.num_trials)
    ax = study.figure("noise_distillation.png")[0, 0]
    for label, curve in curves.items():
        ax.plot(ratios, curve, marker="o", label=label)
    title = f"Noise distillation, n = {o.num_tokens}, d = {o.dim}"
    set_axes(ax, xlabel="noise ratio r (fraction of noisy tokens)", ylabel="‖attention output − μ‖", title=title)
    dense, half = curves["dense"], curves[_k_label(0.5)]
    high = [i for i, r in enumerate(ratios) if r >= 0.5]
    beats = [r for r, h, d in zip(ratios, half, dense, strict=True) if h < d and not close(h, d)]  # a tie is no win
    study.claim(
        "Noise distillation: ‖output − μ‖, top-k (k = n/2) vs dense, for r ≥ 0.5",
        ", ".join(f"r={ratios[i]}: {half[i]:.2f} vs {dense[i]:.2f}" for i in high),
        "k-NN attention distils the noisy tokens: closer to the relevant mean (Lemma 2)",
        bool(high) and all(half[i] < dense[i] for i in high),
    )
    study.claim(
        "Noise ratios at which k = n/2 beats dense (more than a factor 2 closer to μ)",
        ", ".join(f"{r}" for r in beats) or "none",
        "dense averages more relevant tokens at low noise (lower variance); top-k wins as noise grows",
        None,
    )
    study.results["noise_distillation"] = {"noise_ratios": list(ratios), "curves": curves}


def speed(study: Study, o: Options) -> None:
    """KVT's faster convergence (Table 2): CIFAR-10 validation accuracy per epoch, dense against k = n/2, mean and
    standard deviation over `num_seeds` seeds (each: a split, initialisation and batch order shared by both)."""
    runs, (images, labels) = {}, _vision.load_cifar10(o.data_dir, o.per_class)
    for seed in range(o.seed, o.seed + o.num_seeds):
        data = _vision.standardised(_vision.split(images, labels, 0.2, seed))[0]
        for architecture in o.architectures:
            for k in (None, 0.5):
                torch.manual_seed(seed)
                config = vision_config(architecture, k, hidden_size=o.hidden_size, num_layers=o.num_layers)
                model = AoTForImageClassification(config)
                history = _vision.train_classifier(model, data, o.epochs, 64, 1e-3, seed=seed)
                entry = runs.setdefault(f"{architecture}/{_k_label(k)}", dict(
                    architecture=architecture, knn_k=k, parameters=model.num_parameters(), per_seed=[]))  # fmt: skip
                entry["per_seed"].append(history)
    for entry in runs.values():
        curves = torch.tensor([h["val_accuracy"] for h in entry["per_seed"]])
        entry["val_accuracy"] = curves.mean(0).tolist()
        entry["val_accuracy_std"] = (curves.std(0) if len(curves) > 1 else torch.zeros(o.epochs)).tolist()
        entry["seconds"] = sum(h["seconds"] for h in entry["per_seed"]) / len(entry["per_seed"])
    num_train, tokens = len(data["train_labels"]), (32 // 4) ** 2 + 1
    record = {"runs": runs, "num_train": num_train, "num_val": len(data["val_labels"]), "tokens_per_image": tokens}
    study.results["training_speed"] = record
    axes = study.figure("training_speed.png")
    for name, entry in runs.items():
        style, accuracy = "-" if entry["knn_k"] is None else "--", entry["val_accuracy"]
        axes[0, 0].errorbar(range(1, len(accuracy) + 1), accuracy, entry["val_accuracy_std"], marker="o",
                            linestyle=style, capsize=3, label=name)  # fmt: skip
    title = f"CIFAR-10 ({num_train} train images), {tokens} tokens, {o.num_seeds} seed(s)"
    set_axes(axes[0, 0], xlabel="epoch", ylabel="validation accuracy", title=title)
    for architecture in o.architectures:
        dense, knn = runs[f"{architecture}/dense"], runs[f"{architecture}/k = 0.5·n"]
        # Epochs to reach 90% of the lower final (seed-mean) accuracy, per seed; o.epochs + 1 if never reached.
        target = 0.9 * min(dense["val_accuracy"][-1], knn["val_accuracy"][-1])
        reach = {name: torch.tensor([next((e + 1 for e, a in enumerate(h["val_accuracy"]) if a >= target),
                                          o.epochs + 1) for h in entry["per_seed"]], dtype=torch.float)
                 for name, entry in (("knn", knn), ("dense", dense))}  # fmt: skip
        (mk, sk), (md, sd) = ((float(r.mean()), float(r.std()) if len(r) > 1 else 0.0) for r in reach.values())
        entry_pairs = zip(knn["val_accuracy"], knn["val_accuracy_std"], dense["val_accuracy"],
                          dense["val_accuracy_std"], strict=True)  # fmt: skip
        study.claim(
            f"{architecture}: epochs to reach {target:.3f} (90% of the lower final accuracy), k = n/2 vs dense",
            f"{mk:.2f} ± {sk:.2f} vs {md:.2f} ± {sd:.2f} epochs ({o.num_seeds} seeds); accuracy per epoch "
            + "; ".join(f"{a:.3f}±{sa:.3f} vs {b:.3f}±{sb:.3f}" for a, sa, b, sb in entry_pairs)
            + f" (time {knn['seconds']:.0f} s vs {dense['seconds']:.0f} s per run)",
            "k-NN attention trains faster than dense, especially early (KVT Table 2)",
            mk + sk < md - sd,  # a win: separated by more than one standard deviation each
        )


def run(out: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """Both k-NN studies (`Options`); `skip_training` runs the distillation part alone (seconds)."""
    o = Options.parse(options)
    study = Study("knn", "k-NN attention (KVT): noise distillation and training speed", o, out)
    distillation(study, o)
    if not o.skip_training:
        speed(study, o)
        study.note("Accuracy pairs are k-NN vs dense per epoch, mean ± standard deviation over the seeds.")
    return study.finish()
