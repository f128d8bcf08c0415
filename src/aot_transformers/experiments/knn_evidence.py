"""k-NN attention (KVT, Wang et al. 2022, https://arxiv.org/abs/2106.00515): the paper's evidence, measured here.

1. **Slow vs fast definition** (Sec. 3.1, Eqs. 3–5; App. A.2, Table 3): Euclidean k nearest keys against the k
   largest scores q·k (the same keys when the keys have equal norms), and Table 3's timing ratio on this CPU.
2. **Lemma 1** (Sec. 3.2, Eq. 6): the W_Q, W_K gradients are proportional to Var_a(x), so they shrink with k.
3. **Lemma 3** (Sec. 3.2, Eq. 8): with k of order n·d^(−c), the k best-scoring keys contain every relevant one
   (planted data; and under the paper's Assumption 3.1, Eq. 35). **Lemma 4**: its O(k^(−1/2)) term, a k sweep.
4. **Fig. 2**: per layer, dense vs k-NN: token cosine similarity (Eq. 9), spread of the attention weights and the
   residual-to-main-branch ratio (also `aot inspect MODEL --knn-k K`).
5. **Fig. 1**: accuracy against k (several seeds) of a small ViT-shaped classifier on MNIST digits.
6. **Figs 3–4**: the [CLS] attention maps of the dense and the k-NN model side by side.

What each part measures and what held: benchmarks/results/experiments/README.md, section knn-evidence.
"""

from __future__ import annotations

import math
import statistics
import timeit
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import torch.nn.functional as F

from ..modeling_aot import AoTForCausalLM, AoTForImageClassification
from . import _vision
from .attention_maps import cls_attention_maps, layer_attentions
from .knn import sample_noisy_tokens, vision_config
from .study import Count, Positive, Range, Seed, Study, StudyOptions, arg, close, make_generator, set_axes
from .subspace import subspace_attention

PARTS = ("slow_vs_fast", "lemma3", "lemma3_assumption", "lemma4", "trained")


@dataclass
class Options(StudyOptions):
    k_fractions: list[Annotated[float, Range(0.0, 1.0, open_low=True)]] = arg(
        [0.25, 0.5, 0.75], "k as fractions of the tokens, beside dense attention"
    )
    seeds: list[Seed] = arg([0, 1, 2], "training seeds of the k sweep (Fig. 1)")
    epochs: Count = arg(8, "training epochs of each model")
    lr: Positive = arg(3e-3, "peak learning rate (AdamW, cosine decay, batch 32)")
    train_images: Annotated[int, Range(50)] = arg(4000, "MNIST training images")
    hidden_size: Annotated[int, Range(8)] = arg(64, "width of the classifier")
    num_layers: Count = arg(3, "layers of the classifier")
    timing_tokens: Annotated[int, Range(4)] = arg(197, "tokens per image in the slow-vs-fast timing (DeiT-Tiny: 197)")
    timing_batch: Count = arg(8, "images in the slow-vs-fast timing")
    lemma3_dims: list[Annotated[int, Range(2)]] = arg([16, 64, 256, 1024], "dimensions d of the Lemma 3 sweep")
    lemma3_exponent: Annotated[float, Range(0.0, 1.0, open_low=True)] = arg(0.25, "c in k = ceil(n·d^(−c))")
    lemma4_ks: list[Annotated[int, Range(2)]] = arg([4, 8, 16, 32, 64, 128, 256, 512], "k of the Lemma 4 sweep")
    lemma4_fractions: list[Annotated[float, Range(0.0, 1.0, open_low=True)]] = arg([1.0, 0.75], "Lemma 4's k1/k")
    parts: list[str] = arg(list(PARTS), "which parts to run", PARTS)
    data_dir: str | None = arg(None, "folder of the shared data (default: ../shared/data)")


# --- 1. The two definitions (Sec. 3.1) and their cost (App. A.2).


def knn_slow(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k: int) -> torch.Tensor:
    """KVT's slow version (Eq. 3): for each query, its k nearest keys by Euclidean distance, then softmax over their
    scaled dot products. A loop over queries, as the paper's PyTorch reference. Shapes (n, d); returns (n, d_v)."""
    out = torch.empty(query.shape[0], value.shape[-1], dtype=query.dtype)
    for i in range(query.shape[0]):
        nearest = torch.cdist(query[i : i + 1], key).squeeze(0).topk(k, largest=False).indices
        weights = torch.softmax(query[i] @ key[nearest].T / math.sqrt(query.shape[-1]), dim=-1)
        out[i] = weights @ value[nearest]
    return out


def knn_fast(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k: int) -> torch.Tensor:
    """KVT's fast version (Eqs. 4–5): row-wise top-k of the scores, the rest set to −inf, softmax, times V."""
    scores = query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])
    kept = scores.topk(k, dim=-1).indices
    masked = torch.full_like(scores, float("-inf")).scatter(-1, kept, scores.gather(-1, kept))
    return torch.softmax(masked, dim=-1) @ value


def selections_agree(query: torch.Tensor, key: torch.Tensor, k: int) -> float:
    """Fraction of queries whose k nearest keys (Euclidean) are exactly their k best-scoring keys."""
    near = torch.cdist(query, key).topk(k, largest=False).indices.sort(-1).values
    best = (query @ key.T).topk(k).indices.sort(-1).values
    return float((near == best).all(-1).float().mean())


def slow_vs_fast(study: Study, o: Options) -> None:
    generator = make_generator(0)
    n, d, k = o.timing_tokens, 64, max(1, o.timing_tokens // 2)
    q, key, v = (torch.randn(n, d, generator=generator, dtype=torch.float64) for _ in range(3))
    unit = key / key.norm(dim=-1, keepdim=True) * math.sqrt(d)  # equal norms
    agree_equal, agree_raw = selections_agree(q, unit, k), selections_agree(q, key, k)
    difference = float((knn_slow(q, unit, v, k) - knn_fast(q, unit, v, k)).abs().max())
    # Table 3: one forward over a batch of images with 3 heads (DeiT-Tiny's), slow loop vs fast top-k, float32.
    shapes = (o.timing_batch * 3, n, d)
    tq, tk, tv = (torch.randn(*shapes, generator=generator) for _ in range(3))
    knn_fast(tq, tk, tv, k)  # warm-up
    # Best of three: the machine is shared.
    slow = min(timeit.repeat(lambda: [knn_slow(tq[b], tk[b], tv[b], k) for b in range(shapes[0])], number=1, repeat=3))
    fast = min(timeit.repeat(lambda: knn_fast(tq, tk, tv, k), number=1, repeat=3))
    study.results["slow_vs_fast"] = {
        "tokens": n, "dim": d, "k": k, "agreement_equal_norm_keys": agree_equal, "agreement_gaussian_keys": agree_raw,
        "max_output_difference_equal_norms": difference, "slow_seconds": slow, "fast_seconds": fast,
        "timing_shapes": f"{o.timing_batch} images x 3 heads x {n} tokens x {d}, k = {k}, forward, fp32",
    }  # fmt: skip
    study.claim(
        "slow (Euclidean k-NN) = fast (top-k scores) when keys have equal norms",
        f"selections agree for {agree_equal:.0%} of queries, outputs differ by {difference:.1e}; Gaussian keys: "
        f"{agree_raw:.0%}",
        "the fast version computes k-NN attention (Sec. 3.1)",
        agree_equal == 1.0 and difference < 1e-10,
    )
    study.claim(
        "slow / fast time per forward (Table 3)",
        f"{slow / fast:,.0f}x ({slow:.2f} s vs {fast * 1e3:.2f} ms)",
        "8192 s vs 0.45 s per training iteration on 8 V100 (18,000x)",
        slow > 10 * fast,
    )


# --- 3. Lemma 3 on planted data.


def relevant_recall(n: int, d: int, num_relevant: int, k: int, trials: int, generator: torch.Generator) -> dict:
    """Tokens where the relevant ones are known: relevant keys x = μ + ε, irrelevant ones ε, the query μ + ε
    (ε standard normal in R^d, ‖μ‖² = d^(3/4): the signal grows with d, more slowly than the noise energy d — the
    "mild condition" under which Lemma 3's proof separates the two groups). Returns the mean recall of relevant keys
    among the k best-scoring and the largest rank of a relevant key (the k that keeps them all)."""
    mu = torch.randn(trials, 1, d, generator=generator)
    mu = mu / mu.norm(dim=-1, keepdim=True) * d ** (3 / 8)
    keys = torch.randn(trials, n, d, generator=generator)
    keys[:, :num_relevant] += mu
    return _recall(mu + torch.randn(trials, 1, d, generator=generator), keys, num_relevant, k)


def _recall(query: torch.Tensor, keys: torch.Tensor, num_relevant: int, k: int) -> dict:
    """Recall at k and the k keeping every relevant key (Eq. 8's left side) of the first `num_relevant` keys."""
    scores = (query @ keys.transpose(-1, -2)).squeeze(1)  # (T, n)
    ranks = scores.argsort(dim=-1, descending=True).argsort(dim=-1)  # rank of each key
    recall = (ranks[:, :num_relevant] < k).float().mean()
    return {"recall": float(recall), "needed_k": int(ranks[:, :num_relevant].max(dim=-1).values.float().mean() + 1)}


def lemma3(study: Study, o: Options) -> None:
    n, num_relevant, c = 1024, 64, o.lemma3_exponent
    generator = make_generator(3)
    rows = []
    for d in o.lemma3_dims:
        k = max(num_relevant, math.ceil(n * d ** (-c)))
        rows.append({"d": d, "k": k, **relevant_recall(n, d, num_relevant, k, 200, generator)})
    study.results["lemma3"] = {"tokens": n, "relevant": num_relevant, "c": c, "rows": rows}
    axes = study.figure("lemma3_recall.png", ncols=2)
    dims = [r["d"] for r in rows]
    axes[0, 0].semilogx(dims, [r["recall"] for r in rows], "o-")
    axes[0, 0].set(xlabel="d", ylabel="recall of relevant keys", title=f"k = ceil(n d^-{c:g}), n = {n}")
    axes[0, 1].loglog(dims, [r["needed_k"] / n for r in rows], "o-", label="k needed / n")
    axes[0, 1].loglog(dims, [r["k"] / n for r in rows], "--", label=f"d^-{c:g}")
    set_axes(axes[0, 1], xlabel="d", ylabel="fraction of keys", title="smallest k keeping every relevant key")
    last = rows[-1]
    study.claim(
        f"Lemma 3: relevant keys kept at k = ceil(n d^-{c:g}) (n = {n}, {num_relevant} relevant)",
        ", ".join(f"d={r['d']}: k={r['k']}, recall {r['recall']:.3f}" for r in rows),
        "with k = O(n d^(-c2)) every relevant key is kept w.h.p.",
        last["recall"] >= 0.99 and last["needed_k"] <= last["k"],
    )


def lemma3_assumption(study: Study, o: Options) -> None:
    """Lemma 3 (Lemma 5, Eq. 35) under Assumption 3.1: q = β*K + ε, β* = 1/s on s = 8 relevant keys, K's n = 1,024
    rows i.i.d. N(0, I_d) (τ = 0, κ = 0), ε ~ N(0, I_d). Eq. 35 then bounds the keys scoring at least the weakest
    relevant one by c·n/d: judged on the log-log slope of that count over the last step of the d sweep."""
    n, s, c, generator, rows = 1024, 8, o.lemma3_exponent, make_generator(5), []
    for d in o.lemma3_dims:
        keys = torch.randn(100, n, d, generator=generator)
        query = keys[:, :s].mean(1, keepdim=True) + torch.randn(100, 1, d, generator=generator)  # β* = 1/s on M*
        k = max(s, math.ceil(n * d ** (-c)))
        rows.append({"d": d, "k": k, **_recall(query, keys, s, k)})
    (d0, k0), (d1, k1) = ((r["d"], r["needed_k"]) for r in (rows * 2)[-2:])  # one d: no slope (nan)
    slope = math.log(k1 / k0) / math.log(d1 / d0) if d1 != d0 else math.nan
    study.results["lemma3_assumption"] = {"tokens": n, "relevant": s, "sigma": 1.0, "rows": rows, "slope": slope}
    study.claim(
        f"Lemma 3 under Assumption 3.1: keys scoring ≥ the weakest of {s} relevant (n = {n}), and c = count·d/n",
        ", ".join(f"d={r['d']}: {r['needed_k']} (c = {r['needed_k'] * r['d'] / n:.1f})" for r in rows)
        + f"; log-log slope from d={d0} to {d1}: {slope:.2f}",
        "≤ c·n·d^(2κ+τ−1) = c·n/d here (Eq. 35, Lemma 5): slope ≤ −1",
        slope <= -1,
    )


def lemma4(study: Study, o: Options) -> None:
    """Lemma 4's O(k^(−1/2)) term: softmax over k tokens (`knn.sample_noisy_tokens`, d = 64, ‖μ‖ = 2, noise 1/d per
    coordinate, W_Q W_Kᵀ = W_V = I), k1/k of them around the query's mean μ. Noise part: distance to the output on the
    noiseless tokens; error: distance to μ. Judged: the noise part's log-log slope, `close` to −1/2."""
    d, generator, table = 64, make_generator(4), {}
    identity = torch.eye(d).unsqueeze(0)
    for fraction in o.lemma4_fractions:
        noise, error = [], []
        for k in o.lemma4_ks:
            state, outputs = generator.get_state(), []
            for sigma in (d**-0.5, 0.0):  # the same means, with and without the noise
                generator.set_state(state)
                tokens, relevant, mu = sample_noisy_tokens(k, d, 1 - fraction, 8, 2.0, sigma, 64, generator)
                outputs.append(subspace_attention(tokens, identity, phi="softmax", scaling=d**-0.5))
            noise.append(float((outputs[0] - outputs[1]).norm(dim=-1)[relevant].mean()))
            error.append(float((outputs[0] - mu[:, None]).norm(dim=-1)[relevant].mean()))
        slopes = [float(np.polyfit(np.log(o.lemma4_ks), np.log(v), 1)[0]) for v in (noise, error)]
        table[f"{fraction:g}"] = {"noise": noise, "error": error, "noise_slope": slopes[0], "error_slope": slopes[1]}
        study.claim(
            f"Lemma 4: log-log slope in k of the noise part, k1/k = {fraction:g} (k = {o.lemma4_ks[0]}…"
            f"{o.lemma4_ks[-1]}, d = {d})",
            f"{slopes[0]:.3f} (noise {noise[0]:.3f} → {noise[-1]:.3f}); error to μ: slope {slopes[1]:.3f}, "
            f"{error[0]:.3f} → {error[-1]:.3f}",
            "O(k^(−1/2)): slope −1/2 (Lemma 4, first term)",
            close(-slopes[0], 0.5),
        )
    study.results["lemma4"] = {"ks": o.lemma4_ks, "dim": d, "fractions": table}
    ax = study.figure("lemma4_k_sweep.png")[0, 0]
    for fraction, row in table.items():
        ax.loglog(o.lemma4_ks, row["noise"], "o-", label=f"noise part, k1/k = {fraction}")
        ax.loglog(o.lemma4_ks, row["error"], "x--", label=f"error to μ, k1/k = {fraction}")
    set_axes(ax, xlabel="k", ylabel="‖output − ·‖", title=f"Lemma 4 at fixed k1/k, d = {d}")


# --- Trained models: Fig. 1 (k sweep), Lemma 1, Fig. 2 and Figs 3–4 all read the same classifiers.


def k_sweep(study: Study, o: Options, data: dict) -> dict:
    """Fig. 1: validation accuracy for dense attention and every k, each trained with every seed."""
    models, table = {}, {}
    for k in [None, *o.k_fractions]:
        accuracies = []
        for seed in o.seeds:
            torch.manual_seed(seed)
            config = vision_config("vit", k, image_size=28, patch_size=4, hidden_size=o.hidden_size,
                                   num_layers=o.num_layers, num_heads=4, num_channels=1)  # fmt: skip
            model = AoTForImageClassification(config)
            history = _vision.train_classifier(model, data, epochs=o.epochs, seed=seed, lr=o.lr, batch_size=32)
            accuracies.append(history["val_accuracy"][-1])
            models.setdefault(k, model)  # the first seed's model is inspected below
        table["dense" if k is None else f"{k:g}"] = accuracies
    study.results["k_sweep"] = {"val_accuracy": table, "tokens": 50}
    stats = {name: (statistics.mean(a), statistics.stdev(a) if len(a) > 1 else 0.0) for name, a in table.items()}
    ax, names = study.figure("fig1_k_sweep.png")[0, 0], list(stats)
    ax.errorbar(
        range(len(names)), [stats[n][0] for n in names], yerr=[stats[n][1] for n in names], fmt="o-", capsize=4
    )
    ax.set_xticks(range(len(names)), ["dense" if n == "dense" else f"k={n}·n" for n in names])
    ax.set(ylabel="validation accuracy", title=f"MNIST, {len(o.seeds)} seeds, {o.epochs} epochs")
    best = max((n for n in names if n != "dense"), key=lambda n: stats[n][0])
    dense_mean, dense_std = stats["dense"]
    study.claim(
        "Fig. 1: a k below n beats dense attention",
        "; ".join(f"{n}: {m:.3f} ± {s:.3f}" for n, (m, s) in stats.items()) + f" (best k: {best}·n)",
        "DeiT-Tiny on ImageNet peaks near k = n/2, +0.8% top-1 over dense",
        stats[best][0] - stats[best][1] > dense_mean + dense_std,  # separated by more than one std each
    )
    return models


def set_k(model: AoTForCausalLM | AoTForImageClassification, knn_k: float | None) -> None:
    """Switch a model between dense (eager, with attention maps) and k-NN attention with `knn_k`."""
    model.config.knn_k = None
    model.set_attn_implementation("eager")
    if knn_k is not None:
        model.config.knn_k = knn_k
        model.set_attn_implementation("knn")


def attention_variance_and_gradients(model: AoTForImageClassification, images: torch.Tensor) -> dict[str, float]:
    """Lemma 1's two sides at the model's current k, layer by layer: each attention layer is run on its own
    (detached) input tokens x, and the gradient of a fixed random read-out ⟨V̂, r⟩ of its output is taken w.r.t. its
    W_Q and W_K — the derivative of Eq. (6), isolated from the rest of the network. Beside it, the mean trace of
    Var_a(x) = Σ_j a_j x_j x_jᵀ − x̄ x̄ᵀ (x̄ = Σ_j a_j x_j) over heads and queries, with a a query's weights.

    Returns the norm of the gradients over all layers and the trace averaged over layers."""
    with torch.no_grad():  # each layer's input (the last hidden state is the output of the last layer), normalised
        hidden = model.model(images, output_hidden_states=True, return_dict=True).hidden_states
        tokens = [layer.attention_norm(x) for layer, x in zip(model.model.layers, hidden, strict=False)]
    generator = make_generator(11)
    squares, traces = 0.0, []
    for layer, x in zip(model.model.layers, tokens, strict=True):
        attention = layer.attention
        attention.zero_grad()
        output, weights = attention(x, None, None, output_attentions=True)
        readout = torch.randn(output.shape, generator=generator)
        (output * readout).sum().backward()
        squares += sum(float(p.grad.pow(2).sum()) for name, p in attention.named_parameters()
                       if p.grad is not None and name.split(".")[0] in ("q_proj", "k_proj"))  # fmt: skip
        weights = weights.detach()
        second = weights @ (x * x).sum(-1, keepdim=True).unsqueeze(1)  # (B, H, N, 1): Σ_j a_j ‖x_j‖²
        first = weights @ x.unsqueeze(1)  # (B, H, N, D): x̄
        traces.append((second.squeeze(-1) - (first * first).sum(-1)).mean())
    model.zero_grad()
    return {"grad_norm_wq_wk": math.sqrt(squares), "mean_trace_var": float(torch.stack(traces).mean())}


def lemma1(study: Study, o: Options, dense_model: AoTForImageClassification, data: dict) -> None:
    images = data["val_images"][:256]
    rows = []
    for k in [*sorted(o.k_fractions), None]:
        set_k(dense_model, k)
        rows.append({"k": "dense" if k is None else k, **attention_variance_and_gradients(dense_model, images)})
    study.results["lemma1"] = rows
    grads = [r["grad_norm_wq_wk"] for r in rows]
    variances = [r["mean_trace_var"] for r in rows]
    ratios = [g / v for g, v in zip(grads, variances, strict=True)]  # Eq. 6: constant if gradient ∝ Var_a(x)
    spread, grad_spread = max(ratios) / min(ratios), max(grads) / min(grads)
    axes = study.figure("lemma1_gradients.png")
    axes[0, 0].plot(variances, grads, "o-")
    for row in rows:
        axes[0, 0].annotate(str(row["k"]), (row["mean_trace_var"], row["grad_norm_wq_wk"]))
    axes[0, 0].set(xlabel="mean tr Var_a(x)", ylabel="‖∂L/∂(W_Q, W_K)‖", title="Lemma 1 on the trained dense model")
    study.claim(
        "Lemma 1: the W_Q, W_K gradients shrink as k shrinks (k = " + ", ".join(str(r["k"]) for r in rows) + ")",
        "gradient norms " + ", ".join(f"{g:.3g}" for g in grads),
        "fewer, more similar keys: smaller gradients than dense attention (Eq. 6)",
        grads == sorted(grads),
    )
    study.claim(
        "Lemma 1: ... because tr Var_a(x) shrinks with k",
        "tr Var_a(x) "
        + ", ".join(f"{v:.3g}" for v in variances)
        + f"; ‖grad‖ / tr Var varies by {spread - 1:.1%}, ‖grad‖ by {grad_spread - 1:.1%}",
        "∂V̂/∂W_Q ∝ Var_a(x) and ∂V̂/∂W_K ∝ Var_a(x)",
        variances == sorted(variances) and spread < grad_spread,
    )


@torch.no_grad()
def layer_diagnostics(
    model: AoTForCausalLM | AoTForImageClassification, pixel_values: torch.Tensor
) -> dict[str, list[float]]:
    """Fig. 2's three metrics per layer: the mean cosine similarity between distinct tokens of the layer's output
    (Eq. 9), the standard deviation of each query's attention weights (averaged over heads and queries), and
    ‖f_l(t)‖/‖t‖, the norm of what the layer adds to the residual stream over the norm of the stream it reads.
    `model` is any AoT model (image classifier: `pixel_values`; language model: token ids in their place)."""
    streams: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks = [layer.register_forward_hook(lambda m, i, out: streams.append((i[0], out[0])))
             for layer in model.model.layers]  # fmt: skip
    try:
        attentions = layer_attentions(model, pixel_values)
    finally:
        for hook in hooks:
            hook.remove()
    cosine, spread, ratio = [], [], []
    for (before, after), weights in zip(streams, attentions, strict=True):
        unit = F.normalize(after, dim=-1)
        gram = unit @ unit.transpose(-1, -2)
        n = gram.shape[-1]
        cosine.append(float((gram.sum((-1, -2)) - gram.diagonal(dim1=-2, dim2=-1).sum(-1)).mean() / (n * (n - 1))))
        spread.append(float(weights.std(dim=-1).mean()))
        ratio.append(float(((after - before).norm(dim=-1) / before.norm(dim=-1)).mean()))
    return {"cosine_similarity": cosine, "attention_std": spread, "residual_ratio": ratio}


def dense_vs_knn(study: Study, models: dict, k: float | int, name: str, inputs: torch.Tensor, filename: str) -> dict:
    """`layer_diagnostics` of `models[None]` with dense attention and of `models[k]` with k-NN attention (series
    `name`), drawn as Fig. 2's three panels (each metric per layer, one line per series) into `filename`."""
    series = {}
    for label, key in (("dense", None), (name, k)):
        set_k(models[key], key)
        series[label] = layer_diagnostics(models[key], inputs)
    axes = study.figure(filename, ncols=3)
    titles = {"cosine_similarity": "token cosine similarity", "attention_std": "std of attention weights",
              "residual_ratio": "‖f_l(t)‖ / ‖t‖"}  # fmt: skip
    for col, (metric, title) in enumerate(titles.items()):
        for label, values in series.items():
            axes[0, col].plot(range(len(values[metric])), values[metric], "o--", label=label)
        set_axes(axes[0, col], xlabel="layer", title=title)
    return series


def fig2(study: Study, models: dict, k: float, data: dict) -> None:
    name = f"k={k:g}·n"
    series = dense_vs_knn(study, models, k, name, data["val_images"][:128], "fig2_layer_diagnostics.png")
    study.results["fig2"] = series
    dense, sparse = series["dense"], series[name]
    higher = sum(s > d for s, d in zip(sparse["cosine_similarity"], dense["cosine_similarity"], strict=True))
    study.claim(
        "Fig. 2(a): k-NN tokens are more similar to each other than dense ones (per layer)",
        f"higher in {higher} of {len(dense['cosine_similarity'])} layers",
        "k-NN's cosine similarity is larger (faster convergence)",
        higher == len(dense["cosine_similarity"]),
    )
    gap = max(abs(s - d) / d for s, d in zip(sparse["residual_ratio"], dense["residual_ratio"], strict=True))
    study.claim(
        "Fig. 2(c–d): residual-to-main-branch ratio of k-NN matches dense",
        f"largest relative difference per layer {gap:.0%}",
        "consistent with each other: nothing lost by dropping keys",
        all(map(close, sparse["residual_ratio"], dense["residual_ratio"])),
    )


def figs3_4(study: Study, models: dict, k: float, data: dict) -> None:
    """Dense and k-NN [CLS] attention (last layer, averaged over heads) of the same images, side by side."""
    images = data["val_images"][:6]
    axes = study.figure("figs3_4_attention_maps.png", ncols=len(images), nrows=3, size=(1.8, 1.8))
    for col in range(len(images)):
        axes[0, col].imshow(images[col, 0], cmap="gray")
    for row, key in ((1, None), (2, k)):
        set_k(models[key], key)
        maps = cls_attention_maps(models[key], images).mean(1)
        for col in range(len(images)):
            axes[row, col].imshow(maps[col], cmap="viridis")
    for ax in axes.flat:
        ax.set(xticks=[], yticks=[])
    axes[1, 0].set_ylabel("dense")
    axes[2, 0].set_ylabel(f"k = {k:g}·n")


def run(out: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """Every claim of the module docstring (`Options`); the trained-model claims share one k sweep."""
    o = Options.parse(options)
    study = Study(
        "knn-evidence", "KVT's evidence for k-NN attention: definitions, Lemmas 1, 3 and 4, Figs 1–4", o, out
    )
    for part in (slow_vs_fast, lemma3, lemma3_assumption, lemma4):
        if part.__name__ in o.parts:
            part(study, o)
    if "trained" not in o.parts:
        return study.finish()
    images, labels = _vision.load_mnist5k(o.data_dir)
    count = o.train_images + 1000  # a fifth of them for validation
    data = _vision.standardised(_vision.split(images[:count], labels[:count], 0.2, seed=0))[0]
    models = k_sweep(study, o, data)
    lemma1(study, o, models[None], data)
    k = 0.5 if 0.5 in models else next(k for k in models if k is not None)  # the k-NN model compared with dense
    fig2(study, models, k, data)
    figs3_4(study, models, k, data)
    study.note("Models: ViT-shaped (MHSA + MLP), 28x28 MNIST in 4x4 patches (49 patches + [CLS]), trained here.")
    return study.finish()
