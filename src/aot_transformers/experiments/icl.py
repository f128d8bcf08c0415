"""In-context regression (AoT Fig. 6, after Garg et al. 2022, https://arxiv.org/abs/2208.01066).

A prompt is (x₁, f(x₁), …, x_N, f(x_N)) with x_i ~ N(0, I_d) and f(x) = wᵀx, w ~ N(0, I_d) ("linear") or w with
`sparsity` non-zero N(0, 1) coordinates ("sparse_linear"). Tokens are Garg et al.'s: x_i itself, and f(x_i) in the
first coordinate of an otherwise zero d-vector. A model reads the 2N tokens through a linear read-in, runs a causal
backbone (`AoTModel` with MSSA or MHSA and no MLP, or with MLPs in every layer — a GPT-2-style transformer), and a
linear read-out predicts f(x_i) at the token of x_i, i.e. from the i − 1 examples before it. Training minimises the
squared error at every prefix; the evaluation curve is that error, divided by the error of predicting 0 (E f(x)² = d
for linear, = sparsity for sparse tasks, as Garg et al. normalise), against the number of in-context examples, with
least squares and Lasso as baselines.

The default layout, `tokens="pairs"`, lets the y token carry its x (`interleave`): the model then needs no
previous-token head, which MSSA's symmetric scores (query = key) make hard to learn. `base="llama"` swaps the backbone
for transformers' `LlamaModel` (the earlier version's Fig. 7, `llama_backbone`).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import GPT2Config, GPT2Model, LlamaConfig, LlamaModel

from ..configuration_aot import AoTConfig
from ..modeling_aot import AoTModel
from .study import (
    Count,
    Positive,
    Seed,
    Study,
    StudyOptions,
    arg,
    check_choice,
    check_int,
    check_real,
    close,
    make_generator,
    set_axes,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

TASKS = ("linear", "sparse_linear")
MODELS = ("aot-mssa", "aot-mhsa", "transformer", "aot-hybrid", "aot-full-mlp")
MSSA_MODELS = ("aot-mssa", "aot-hybrid", "aot-full-mlp")
TOKEN_LAYOUTS = ("pairs", "garg")
BASES = ("aot", "llama")
# AoT Table 5 (`aot-icml2025.txt` lines 578-582): layers and printed parameter count of the ICL models (width 128, 8
# heads, d = 20).
TABLE5 = {"aot-mssa": (32, "7.5"), "aot-mhsa": (32, "8.55"), "transformer": (16, "9.63")}


def sample_prompts(
    batch_size: int,
    num_points: int,
    dim: int,
    task: str = "linear",
    sparsity: int = 3,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """B regression prompts of N examples: inputs x ~ N(0, I_d), a task vector w per prompt, and targets wᵀx.

    `task` is `"linear"` or `"sparse_linear"` (w keeps `sparsity` <= d random coordinates). Returns `xs` (B, N, d),
    `ys` (B, N) and `weights` (B, d).
    """
    check_int("batch_size", batch_size)
    check_int("num_points", num_points)
    check_int("dim", dim)
    check_choice("task", task, TASKS)
    xs = torch.randn(batch_size, num_points, dim, generator=generator)
    weights = torch.randn(batch_size, dim, generator=generator)
    if task == "sparse_linear":
        check_int("sparsity", sparsity, 1, dim)
        keep = torch.rand(batch_size, dim, generator=generator).argsort(dim=-1)[:, :sparsity]
        weights = weights * torch.zeros_like(weights).scatter_(1, keep, 1.0)
    return xs, torch.einsum("bnd,bd->bn", xs, weights), weights


def zero_estimator_error(dim: int, task: str, sparsity: int = 3) -> float:
    """E[(wᵀx)²], the error of always predicting 0: d for linear tasks, `sparsity` for sparse ones."""
    check_choice("task", task, TASKS)
    return float(dim if task == "linear" else sparsity)


def interleave(xs: torch.Tensor, ys: torch.Tensor, tokens: str = "garg") -> torch.Tensor:
    """The prompt as a token sequence (B, 2N, width).

    `"garg"` (Garg et al.): x₁, (y₁, 0, …, 0), x₂, (y₂, 0, …), … with width d.
    `"pairs"`: (x₁, 0), (x₁, y₁), (x₂, 0), (x₂, y₂), … with width d + 1.
    """
    check_choice("tokens", tokens, TOKEN_LAYOUTS)
    if tokens == "garg":
        y_tokens = torch.zeros_like(xs)
        y_tokens[..., 0] = ys
        return torch.stack((xs, y_tokens), dim=2).flatten(1, 2)  # (B, N, 2, d) -> (B, 2N, d)
    x_tokens = torch.cat((xs, torch.zeros_like(ys)[..., None]), dim=-1)  # (B, N, d + 1)
    y_tokens = torch.cat((xs, ys[..., None]), dim=-1)
    return torch.stack((x_tokens, y_tokens), dim=2).flatten(1, 2)  # (B, 2N, d + 1)


def backbone_config(
    kind: str, hidden_size: int = 64, num_layers: int = 8, num_heads: int = 4, max_points: int = 41
) -> AoTConfig:
    """The backbone of one of the compared models, for prompts of up to `max_points` examples (2 tokens each).

    `kind`: `"aot-mssa"` (AoT: MSSA, no MLP, unit-norm queries as in the causal AoT), `"aot-mhsa"` (AoT with standard
    attention, no MLP), `"transformer"` (MHSA with an MLP in every layer, GPT-2-style), or the earlier version's Fig. 6
    variants of AoT-MSSA with MLPs: `"aot-hybrid"` (MLP blocks in the first half of the layers) and `"aot-full-mlp"`
    (an MLP in every layer). AoT-MSSA starts from weights of standard deviation 0.1 instead of 0.02: with unit-norm
    queries the scores are ⟨q/‖q‖, k⟩ ≈ ‖k‖, so small weights make every attention map uniform and, on this task,
    MSSA then never leaves the predict-zero plateau.
    """
    check_choice("kind", kind, MODELS)
    return AoTConfig(
        vocab_size=1,  # inputs arrive as embeddings; the token table is never used
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        max_position_embeddings=2 * max_points,
        attention_type="mssa" if kind in MSSA_MODELS else "mhsa",
        normalize_query=kind in MSSA_MODELS,
        mlp_layers={"transformer": "all", "aot-full-mlp": "all", "aot-hybrid": "first_half"}.get(kind, "none"),
        initializer_range=0.1 if kind in MSSA_MODELS else 0.02,
        tie_word_embeddings=False,
        use_cache=False,
    )


class _NoMLP(nn.Module):
    """An MLP block that adds nothing to the residual stream."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hidden_states)


def llama_backbone(config: AoTConfig) -> LlamaModel:
    """`config`'s backbone on transformers' Llama (RMSNorm, RoPE, SwiGLU MLPs of width `config.intermediate_size`).

    A layer without an MLP in `config` keeps only its attention sublayer: its MLP returns zeros and its second RMSNorm
    is dropped. MSSA is one projection shared by query, key and value (RoPE then rotates query and key) and keeps its
    own output projection; AoT's unit-norm queries and larger initial weights are not carried over (Llama's init).
    """
    llama = LlamaModel(
        LlamaConfig(
            vocab_size=1,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_hidden_layers=config.num_hidden_layers,
            num_attention_heads=config.num_attention_heads,
            max_position_embeddings=config.max_position_embeddings,
            bos_token_id=None,
            eos_token_id=None,  # no vocabulary: inputs arrive as embeddings
            use_cache=False,
        )
    )
    for index, layer in enumerate(llama.layers):
        if config.attention_type == "mssa":
            layer.self_attn.k_proj = layer.self_attn.v_proj = layer.self_attn.q_proj
        if not config.layer_has_mlp(index):
            layer.mlp, layer.post_attention_layernorm = _NoMLP(), nn.Identity()
    return llama


class InContextRegressor(nn.Module):
    """Linear read-in → causal backbone (`AoTModel`, or `llama_backbone` with `base="llama"`) → linear read-out,
    predicting f(x_i) at every x_i token."""

    def __init__(self, config: AoTConfig, dim: int, tokens: str = "pairs", base: str = "aot"):
        super().__init__()
        self.dim = check_int("dim", dim)
        self.tokens = check_choice("tokens", tokens, TOKEN_LAYOUTS)
        self.read_in = nn.Linear(dim if tokens == "garg" else dim + 1, config.hidden_size)  # a token's width
        self.backbone = AoTModel(config) if check_choice("base", base, BASES) == "aot" else llama_backbone(config)
        self.read_out = nn.Linear(config.hidden_size, 1)

    def forward(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Predictions (B, N): entry i sees x₁, y₁, …, x_{i−1}, y_{i−1}, x_i (causal attention)."""
        if xs.dim() != 3 or xs.shape[-1] != self.dim or ys.shape != xs.shape[:2]:
            raise ValueError(
                f"`xs` must be (batch, points, {self.dim}) and `ys` (batch, points); got {tuple(xs.shape)} and "
                f"{tuple(ys.shape)}."
            )
        embeddings = self.read_in(interleave(xs, ys, self.tokens))
        hidden = self.backbone(inputs_embeds=embeddings, use_cache=False).last_hidden_state
        return self.read_out(hidden[:, ::2]).squeeze(-1)  # outputs at the x tokens


def build_model(
    kind: str,
    dim: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    max_points: int,
    seed: int = 0,
    tokens: str = "pairs",
    base: str = "aot",
) -> InContextRegressor:
    """An `InContextRegressor` with freshly initialised weights (seeded)."""
    torch.manual_seed(seed)
    config = backbone_config(kind, hidden_size, num_layers, num_heads, max_points)
    return InContextRegressor(config, dim, tokens, base)


def train_regressor(
    model: InContextRegressor,
    task: str = "linear",
    num_points: int = 11,
    steps: int = 4000,
    batch_size: int = 64,
    lr: float = 1e-3,
    warmup_steps: int = 200,
    sparsity: int = 3,
    time_limit: float | None = None,
    log_every: int = 100,
    seed: int = 0,
) -> dict[str, Any]:
    """Train on fresh prompts with the squared error at every prefix (AdamW at peak `lr`, linear warm-up, cosine
    decay), `steps` steps of `batch_size` prompts of `num_points` examples, stopping early after `time_limit` seconds
    (the CPU-budget guard; None for no limit). The loss, normalised by the zero estimator's error, is recorded every
    `log_every` steps; returns that `steps`/`loss` history, `steps_done` and `seconds`.
    """
    check_int("steps", steps)
    check_real("lr", lr, 0.0, open_min=True)
    generator = make_generator(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return 0.5 * (1 + math.cos(math.pi * (step - warmup_steps) / max(1, steps - warmup_steps)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    normaliser = zero_estimator_error(model.dim, task, sparsity)
    history: dict[str, list[float]] = {"steps": [], "loss": []}
    start = time.perf_counter()
    model.train()
    running, count, step = 0.0, 0, 0
    for step in range(steps):
        xs, ys, _ = sample_prompts(batch_size, num_points, model.dim, task, sparsity, generator)
        loss = (model(xs, ys) - ys).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        running, count = running + float(loss.detach()), count + 1
        if (step + 1) % log_every == 0:
            history["steps"].append(step + 1)
            history["loss"].append(running / count / normaliser)
            running, count = 0.0, 0
        if time_limit is not None and time.perf_counter() - start > time_limit:
            break
    model.eval()
    return {**history, "steps_done": step + 1, "seconds": time.perf_counter() - start}


def least_squares_errors(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """Squared error (B, N) of minimum-norm least squares fitted on the examples before each point (0 with none)."""
    errors = torch.empty_like(ys)
    errors[:, 0] = ys[:, 0].square()
    for i in range(1, ys.shape[1]):
        solution = torch.linalg.pinv(xs[:, :i].double()) @ ys[:, :i, None].double()  # (B, d, 1)
        prediction = (xs[:, i : i + 1].double() @ solution)[:, 0, 0]
        errors[:, i] = (prediction - ys[:, i].double()).square().float()
    return errors


def lasso_errors(xs: torch.Tensor, ys: torch.Tensor, alpha: float = 0.01) -> torch.Tensor:
    """Squared error (B, N) of scikit-learn's Lasso (no intercept) fitted on the examples before each point."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import Lasso

    check_real("alpha", alpha, 0.0, open_min=True)
    x_np, y_np = xs.double().numpy(), ys.double().numpy()
    errors = torch.empty_like(ys)
    errors[:, 0] = ys[:, 0].square()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # tiny prefixes: an unconverged fit is still a baseline
        for b in range(ys.shape[0]):
            for i in range(1, ys.shape[1]):
                fit = Lasso(alpha=alpha, fit_intercept=False, max_iter=10_000).fit(x_np[b, :i], y_np[b, :i])
                errors[b, i] = float((fit.predict(x_np[b, i : i + 1])[0] - y_np[b, i]) ** 2)
    return errors


def error_curve(errors: torch.Tensor, normaliser: float) -> list[float]:
    """Mean normalised squared error per number of in-context examples (index i: i examples seen)."""
    return (errors.mean(0) / normaliser).tolist()


@dataclass
class Options(StudyOptions):
    dim: Count = arg(5, "d of the regression inputs (the paper: 20)")
    num_points: Count | None = arg(None, "examples per prompt (default 2d + 1; the paper: 41)")
    tasks: list[str] = arg(list(TASKS), "linear and/or sparse_linear", TASKS)
    models: list[str] = arg(
        list(MODELS[:3]),
        "models compared (AoT Fig. 6; aot-hybrid and aot-full-mlp: the earlier version's Fig. 6)",
        MODELS,
    )
    hidden_size: Count = arg(64, "width of every backbone (the paper: 128)")
    num_heads: Count = arg(4, "attention heads (the paper: 8)")
    aot_layers: Count = arg(4, "layers of the attention-only backbones (the earlier version: 16)")
    transformer_layers: Count = arg(2, "layers of the transformer and of AoT Full-MLP (the earlier version: 16)")
    hybrid_layers: Count | None = arg(
        None, "layers of AoT Hybrid (default 1.5x aot_layers, as the earlier version's 24 vs 16)"
    )
    steps: Count = arg(6000, "training steps per model and task (the paper: 50,000)")
    batch_size: Count = arg(64, "prompts per step (the paper: 64)")
    lr: Positive = arg(3e-3, "AdamW peak learning rate")
    sparsity: Count = arg(3, "non-zero coordinates of sparse tasks (the paper: 3)")
    lasso_alpha: Positive = arg(0.01, "Lasso penalty of the baseline (the paper: 0.01)")
    eval_prompts: Count = arg(512, "evaluation prompts (the paper: 1280)")
    time_budget: Positive = arg(1800.0, "seconds for the whole run")
    tokens: str = arg("pairs", "token layout: pairs (y tokens carry their x) or garg (Garg et al.)", TOKEN_LAYOUTS)
    base: str = arg("aot", "backbone: aot (AoTModel) or llama (LlamaModel, the earlier version's Fig. 7)", BASES)
    seed: Seed = arg(0, "random seed")
    parameter_check: bool = arg(False, "only count the parameters of AoT Table 5's models (no training)")


def table5_parameters(study: Study) -> None:
    """AoT Table 5's parameter counts, rebuilt: the backbones at the table's sizes with Garg et al.'s read-in (d = 20)
    and read-out and GPT-2's 50,257 x 128 token embedding, which Garg et al.'s model carries and never uses (inputs
    arrive through the read-in), for prompts of 41 points (the paper's) and 101 (Garg et al.'s position table)."""
    rows, vocab = study.results.setdefault("table5", {}), 50257  # GPT-2's vocabulary, embedded at width 128
    unused = vocab * 128
    for kind, (layers, printed) in TABLE5.items():
        counts = {}
        for points in (41, 101):
            config = backbone_config(kind, 128, layers, 8, max_points=points)
            config.vocab_size = vocab
            model = InContextRegressor(config, dim=20, tokens="garg")
            counts[points] = sum(p.numel() for p in model.parameters())
        rows[kind] = {"layers": layers, "paper_millions": float(printed), "parameters": counts, "unused": unused}
        decimals = len(printed.split(".")[1])
        matches = [points for points, count in counts.items() if f"{count / 1e6:.{decimals}f}" == printed]
        study.claim(
            f"{kind} ({layers} layers): parameters for 41 / 101 points; without the unused token embedding",
            f"{counts[41] / 1e6:.3f}M / {counts[101] / 1e6:.3f}M; {(counts[41] - unused) / 1e6:.3f}M",
            f"Table 5: {printed}M (equal at its precision for {matches or 'neither'})",
            bool(matches),
        )
    gpt2 = GPT2Model(GPT2Config(n_positions=202, n_embd=128, n_layer=16, n_head=8)).num_parameters()
    rows["gpt2"] = gpt2 + (20 * 128 + 128) + (128 + 1)  # with Garg et al.'s read-in and read-out
    study.note(
        f"Garg et al.'s own transformer (transformers' GPT2Model: attention biases, 2 x 101 positions) with the "
        f"read-in and read-out has {rows['gpt2'] / 1e6:.3f}M parameters; the unused token embedding is "
        f"{unused:,} of them."
    )


def _layers(kind: str, o: Options) -> int:
    """Layers per model: the earlier version matches sizes by depth (transformer, Full MLP 16; Hybrid 24; AoT 16)."""
    return {
        "transformer": o.transformer_layers,
        "aot-full-mlp": o.transformer_layers,
        "aot-hybrid": o.hybrid_layers or max(2, round(1.5 * o.aot_layers)),
    }.get(kind, o.aot_layers)


def task_curves(study: Study, o: Options, task: str, time_limit: float, ax: Axes) -> None:
    """AoT Fig. 6 for one task: normalised squared error against in-context examples of each model, trained on fresh
    prompts (Garg et al.'s protocol), and of least squares and Lasso, on the same `eval_prompts` prompts."""
    dim, num_points, sparsity = o.dim, o.num_points, o.sparsity
    normaliser = zero_estimator_error(dim, task, sparsity)
    xs, ys, _ = sample_prompts(o.eval_prompts, num_points, dim, task, sparsity, make_generator(o.seed + 10_000))
    curves = {"least squares": error_curve(least_squares_errors(xs, ys), normaliser)}
    # Lasso is fitted per prompt and prefix: the first 128 prompts (or all, if fewer) keep it quick.
    curves[f"Lasso (α={o.lasso_alpha})"] = error_curve(lasso_errors(xs[:128], ys[:128], o.lasso_alpha), normaliser)
    training = {}
    for kind in o.models:
        layers = _layers(kind, o)
        model = build_model(kind, dim, o.hidden_size, layers, o.num_heads, num_points, o.seed, o.tokens, o.base)
        history = train_regressor(
            model, task, num_points, o.steps, o.batch_size, o.lr, sparsity=sparsity, time_limit=time_limit, seed=o.seed
        )
        with torch.no_grad():  # `train_regressor` leaves the model in eval mode
            curves[kind] = error_curve((model(xs, ys) - ys).square(), normaliser)
        training[kind] = {**history, "layers": layers, "parameters": model.backbone.num_parameters()}
    study.results["tasks"][task] = {"curves": curves, "training": training, "normaliser": normaliser}
    for name, curve in curves.items():
        style = "--" if name == "least squares" or name.startswith("Lasso") else "-"
        ax.plot(range(num_points), curve, style, label=name)
    ax.axvline(dim, color="grey", lw=0.5)
    title, ylabel = f"{task.replace('_', ' ')} regression, d = {dim}", "squared error / zero-estimator error"
    set_axes(ax, fontsize=7, title=title, xlabel="in-context examples", ylabel=ylabel, ylim=(0, 1.25))
    at = 2 * dim if task == "linear" else min(num_points - 1, 2 * dim)
    baseline = curves["least squares"] if task == "linear" else curves[f"Lasso (α={o.lasso_alpha})"]
    for kind in o.models:
        value = curves[kind][at]
        compare = kind == "aot-mssa" and "transformer" in curves
        holds = close(value, curves["transformer"][at]) if compare else None
        study.claim(
            f"{task}: {kind} ({training[kind]['layers']} layers, {training[kind]['parameters']:,} parameters) "
            f"normalised error at {at} examples ({training[kind]['steps_done']} steps, "
            f"{training[kind]['seconds']:.0f} s)",
            f"{value:.3f} (zero estimator 1, {'least squares' if task == 'linear' else 'Lasso'} {baseline[at]:.3f})",
            f"AoT close to GPT-2 (Fig. 6): within a factor 2 of the transformer's {curves['transformer'][at]:.3f}"
            if holds is not None
            else "AoT close to the transformer; adding MLPs does not help AoT (earlier version, Fig. 6)",
            holds,
        )
    study.claim(
        f"{task}: least squares at {at} examples", f"{curves['least squares'][at]:.3f}", "≈ 0 once N ≥ d", None
    )


def run(out: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """AoT Fig. 6 (and the earlier version's Fig. 6 with Hybrid / Full-MLP): in-context linear and sparse regression.

    The paper trains 16-32-layer, width-128 models for 50,000 steps on d = 20 (GPU scale); `Options` defaults are a
    CPU-sized version and the experiments README gives the d = 20 command whose results are committed.
    """
    o = Options.parse(options)
    dim, tasks, models = o.dim, o.tasks, o.models
    o.num_points = 2 * dim + 1 if o.num_points is None else o.num_points
    check_int("num_points", o.num_points, 2 * dim + 1)
    if "sparse_linear" in tasks:
        check_int("sparsity", o.sparsity, 1, dim)
    title = "In-context regression (AoT Fig. 6, after Garg et al.)"
    study = Study("icl", "AoT Table 5: the ICL models' parameters" if o.parameter_check else title, o, out)
    if o.parameter_check:
        table5_parameters(study)
        return study.finish()
    study.results["tasks"] = {}
    seconds_per_model = o.time_budget * 0.9 / (len(tasks) * len(models))  # a tenth for evaluation, baselines
    axes = study.figure("icl_error_curves.png", ncols=len(tasks))
    for column, task in enumerate(tasks):
        task_curves(study, o, task, seconds_per_model, axes[0, column])
    study.note(
        "Error normalised by the zero estimator's (d for linear, the sparsity for sparse tasks), as Garg et al."
    )
    study.note(f"Time budget {o.time_budget:.0f} s, shared equally by the (task, model) trainings.")
    if o.base == "llama":
        study.note("Base Llama (earlier version, Fig. 7): transformers' LlamaModel; see `llama_backbone`.")
    return study.finish()
