"""In-context regression study: prompts, encoding, models (causality), baselines, training loop and the run."""

from __future__ import annotations

import json

import pytest
import torch

from aot_transformers.experiments import icl as I

pytestmark = pytest.mark.usefixtures("one_thread")


def test_prompts_linear_and_sparse():
    xs, ys, w = I.sample_prompts(6, 9, 5, "linear", generator=I.make_generator(0))
    assert xs.shape == (6, 9, 5) and ys.shape == (6, 9) and w.shape == (6, 5)
    torch.testing.assert_close(ys, torch.einsum("bnd,bd->bn", xs, w))
    xs, ys, w = I.sample_prompts(6, 9, 5, "sparse_linear", sparsity=2, generator=I.make_generator(0))
    assert ((w != 0).sum(-1) == 2).all()
    torch.testing.assert_close(ys, torch.einsum("bnd,bd->bn", xs, w))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: I.sample_prompts(2, 3, 4, "quadratic"), "task"),
        (lambda: I.sample_prompts(2, 3, 4, "sparse_linear", sparsity=5), "sparsity"),
        (lambda: I.backbone_config("lstm"), "kind"),
        (lambda: I.run(dim=3, num_points=4), "num_points"),
        (lambda: I.run(dim=3, models=("gpt5",)), "models"),
        (lambda: I.run(dim=3, tokens="triples"), "tokens"),
        (lambda: I.run(dim=3, base="gpt2"), "base"),
        (lambda: I.interleave(torch.zeros(1, 2, 3), torch.zeros(1, 2), "triples"), "tokens"),
    ],
)
def test_bad_options(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_zero_estimator_error_is_the_target_second_moment():
    xs, ys, _ = I.sample_prompts(4000, 4, 6, "sparse_linear", sparsity=3, generator=I.make_generator(1))
    assert ys.square().mean().item() == pytest.approx(I.zero_estimator_error(6, "sparse_linear", 3), rel=0.1)
    assert I.zero_estimator_error(6, "linear") == 6.0


def test_interleave_layout():
    xs = torch.arange(12.0).reshape(1, 2, 6)[..., :3].reshape(1, 2, 3)
    ys = torch.tensor([[7.0, 8.0]])
    tokens = I.interleave(xs, ys, "garg")
    assert tokens.shape == (1, 4, 3)
    torch.testing.assert_close(tokens[0, 0], xs[0, 0])
    torch.testing.assert_close(tokens[0, 1], torch.tensor([7.0, 0.0, 0.0]))
    torch.testing.assert_close(tokens[0, 2], xs[0, 1])
    pairs = I.interleave(xs, ys, "pairs")  # (x_i, 0), (x_i, y_i): the y token carries its x
    assert pairs.shape == (1, 4, 4)
    torch.testing.assert_close(pairs[0, 0], torch.cat((xs[0, 0], torch.tensor([0.0]))))
    torch.testing.assert_close(pairs[0, 1], torch.cat((xs[0, 0], torch.tensor([7.0]))))
    torch.testing.assert_close(pairs[0, 3], torch.cat((xs[0, 1], torch.tensor([8.0]))))


def test_backbones():
    mssa, mhsa, gpt = (I.backbone_config(kind, 32, 2, 4, 5) for kind in ("aot-mssa", "aot-mhsa", "transformer"))
    assert mssa.attention_type == "mssa" and mssa.mlp_layers == "none"
    assert mhsa.attention_type == "mhsa" and mhsa.mlp_layers == "none"
    assert gpt.attention_type == "mhsa" and gpt.mlp_layers == "all"
    assert mssa.max_position_embeddings == 10
    # Larger initial weights for MSSA: with unit-norm queries small keys make every attention map uniform.
    assert mssa.initializer_range == 0.1 and mhsa.initializer_range == gpt.initializer_range == 0.02
    # The earlier version's Fig. 6 variants: AoT-MSSA with MLPs in the first half of the layers, or in all of them.
    hybrid, full = (I.backbone_config(kind, 32, 4, 4, 5) for kind in ("aot-hybrid", "aot-full-mlp"))
    assert hybrid.attention_type == full.attention_type == "mssa" and hybrid.normalize_query and full.normalize_query
    assert [hybrid.layer_has_mlp(i) for i in range(4)] == [True, True, False, False]
    assert all(full.layer_has_mlp(i) for i in range(4))
    assert I._layers("aot-hybrid", I.Options(aot_layers=16, transformer_layers=16)) == 24


@pytest.mark.parametrize("base", I.BASES)
@pytest.mark.parametrize("tokens", I.TOKEN_LAYOUTS)
@pytest.mark.parametrize("kind", I.MODELS)
def test_prediction_i_sees_only_earlier_examples_and_x_i(kind, tokens, base):
    model = I.build_model(kind, 3, 16, 2, 2, 6, tokens=tokens, base=base).eval()
    xs, ys, _ = I.sample_prompts(2, 6, 3, generator=I.make_generator(2))
    base = model(xs, ys)
    changed_xs, changed_ys = xs.clone(), ys.clone()
    changed_ys[:, 3] += 5.0  # y_3 itself must not leak into prediction 3
    changed_xs[:, 4:] += 1.0
    changed_ys[:, 4:] -= 2.0
    out = model(changed_xs, changed_ys)
    torch.testing.assert_close(out[:, :4], base[:, :4])
    assert not torch.allclose(out[:, 4:], base[:, 4:])


def test_llama_base():
    """`base="llama"`: transformers' LlamaModel; AoT's layers keep only attention, MSSA shares q = k = v."""
    from transformers import LlamaModel
    from transformers.models.llama.modeling_llama import LlamaMLP

    models = {kind: I.build_model(kind, 3, 16, 4, 2, 6, base="llama") for kind in I.MODELS}
    assert all(isinstance(model.backbone, LlamaModel) for model in models.values())
    has_mlp = {kind: [isinstance(layer.mlp, LlamaMLP) for layer in m.backbone.layers] for kind, m in models.items()}
    assert has_mlp["transformer"] == has_mlp["aot-full-mlp"] == [True] * 4
    assert has_mlp["aot-mssa"] == has_mlp["aot-mhsa"] == [False] * 4
    assert has_mlp["aot-hybrid"] == [True, True, False, False]
    mssa, mhsa = (models[kind].backbone.layers[0].self_attn for kind in ("aot-mssa", "aot-mhsa"))
    assert mssa.q_proj is mssa.k_proj is mssa.v_proj and mhsa.q_proj is not mhsa.k_proj
    # MSSA's shared projection counts once: 3 of MHSA's 4 square projections (no biases) are gone in every layer.
    assert models["aot-mhsa"].backbone.num_parameters() - models["aot-mssa"].backbone.num_parameters() == 4 * 2 * 16**2
    layer, hidden = models["aot-mhsa"].backbone.layers[0], torch.randn(1, 4, 16)
    assert not layer.mlp(hidden).any() and layer.post_attention_layernorm(hidden) is hidden


@pytest.mark.parametrize(
    "kind, total",
    [("aot-mssa", 7.027094), ("aot-mhsa", -4.919082), ("transformer", -0.834041), ("aot-hybrid", 3.414325)],
)
def test_base_aot_is_the_default_and_unchanged(kind, total):
    """`base="aot"` (the default) builds the models of before `base` existed: the totals are main's predictions."""
    assert I.Options().base == "aot"
    xs, ys, _ = I.sample_prompts(2, 6, 3, generator=I.make_generator(2))
    for model in (I.build_model(kind, 3, 16, 2, 2, 6), I.build_model(kind, 3, 16, 2, 2, 6, base="aot")):
        assert isinstance(model.backbone, I.AoTModel)
        with torch.no_grad():
            assert model.eval()(xs, ys).sum().item() == pytest.approx(total, abs=1e-5)


def test_model_rejects_wrong_shapes():
    model = I.build_model("aot-mssa", 3, 16, 1, 2, 4)
    with pytest.raises(ValueError, match="xs"):
        model(torch.zeros(1, 4, 2), torch.zeros(1, 4))


def test_least_squares_is_exact_once_there_are_d_examples():
    xs, ys, _ = I.sample_prompts(16, 8, 3, generator=I.make_generator(3))
    errors = I.least_squares_errors(xs, ys)
    assert errors[:, 3:].max().item() < 1e-8
    torch.testing.assert_close(errors[:, 0], ys[:, 0].square())


def test_lasso_recovers_sparse_targets():
    xs, ys, _ = I.sample_prompts(4, 12, 6, "sparse_linear", sparsity=1, generator=I.make_generator(4))
    errors = I.lasso_errors(xs, ys, alpha=0.001)
    assert errors.shape == (4, 12)
    assert errors[:, 8:].mean().item() < 0.05 * ys.square().mean().item()


def test_training_reduces_the_loss_and_respects_the_time_limit():
    model = I.build_model("aot-mhsa", 2, 16, 1, 2, 5)
    history = I.train_regressor(model, "linear", 5, steps=150, batch_size=32, lr=3e-3, warmup_steps=10, log_every=50)
    assert history["loss"][-1] < history["loss"][0]
    stopped = I.train_regressor(model, "linear", 5, steps=10_000, batch_size=8, time_limit=0.5, log_every=10)
    assert stopped["steps_done"] < 10_000


def test_run_smoke(tmp_path):
    results = I.run(
        out=tmp_path,
        dim=2,
        tasks=("linear", "sparse_linear"),
        sparsity=1,
        hidden_size=16,
        num_heads=2,
        aot_layers=1,
        transformer_layers=1,
        steps=3,
        batch_size=4,
        eval_prompts=8,
        time_budget=60,
    )
    assert {"results.json", "summary.md", "icl_error_curves.png"} <= {p.name for p in tmp_path.iterdir()}
    saved = json.loads((tmp_path / "results.json").read_text())
    curves = saved["tasks"]["linear"]["curves"]
    assert set(curves) >= {"least squares", "aot-mssa", "aot-mhsa", "transformer"}
    assert all(len(curve) == 5 for curve in curves.values())
    assert results["claims"]


def test_run_smoke_llama_base(tmp_path):
    """`--base llama` trains and writes every model's curve; its summary names the base."""
    options = dict(dim=2, tasks=("linear",), hidden_size=16, num_heads=2, aot_layers=1, transformer_layers=1)
    I.run(out=tmp_path, base="llama", steps=3, batch_size=4, eval_prompts=8, time_budget=60, **options)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["options"]["base"] == "llama" and (tmp_path / "icl_error_curves.png").exists()
    curves = saved["tasks"]["linear"]["curves"]
    assert set(curves) >= {"aot-mssa", "aot-mhsa", "transformer"} and all(len(c) == 5 for c in curves.values())
    assert all(row["steps_done"] == 3 for row in saved["tasks"]["linear"]["training"].values())
    assert "--base llama" in (tmp_path / "summary.md").read_text()


@pytest.mark.slow
def test_cpu_budget_claim_aot_mssa_learns_linear_regression(tmp_path):
    """The CPU-budget claim (minutes): `pytest -m slow tests/test_experiments_icl.py`."""
    results = I.run(out=tmp_path, tasks=("linear",), models=("aot-mssa",))
    assert results["tasks"]["linear"]["curves"]["aot-mssa"][2 * 5] <= 0.25


def test_table5_parameter_counts_include_gpt2s_unused_token_embedding(tmp_path):
    """AoT Table 5's 7.5M / 8.55M / 9.63M are reproduced only with GPT-2's 50,257 x 128 token embedding, which the ICL
    models never use; without it AoT-MSSA has a third of the transformer's parameters."""
    rows = I.run(out=tmp_path, parameter_check=True)["table5"]
    for kind, (_layers, printed) in I.TABLE5.items():
        decimals = len(printed.split(".")[1])
        assert printed in {f"{count / 1e6:.{decimals}f}" for count in rows[kind]["parameters"].values()}, kind
    without = {kind: row["parameters"][41] - row["unused"] for kind, row in rows.items() if kind in I.TABLE5}
    assert 0.3 < without["aot-mssa"] / without["transformer"] < 0.35
    assert rows["gpt2"] - rows["transformer"]["parameters"][101] == 16 * 4 * 128  # GPT-2's attention biases
