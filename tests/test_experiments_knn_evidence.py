"""KVT's evidence (`aot experiment knn-evidence`, `aot inspect --knn-k`): the definitions, Lemma 1 and Lemma 3 as
properties that must hold exactly or in the limit, and the study's artifacts at tiny sizes."""

from __future__ import annotations

import json
import math

import pytest
import torch

from aot_transformers import AoTConfig, AoTForImageClassification
from aot_transformers.cli import main
from aot_transformers.experiments import _vision
from aot_transformers.experiments.knn_evidence import (
    attention_variance_and_gradients,
    knn_fast,
    knn_slow,
    layer_diagnostics,
    relevant_recall,
    run,
    selections_agree,
    set_k,
)
from aot_transformers.experiments.study import make_generator


def test_slow_and_fast_definitions_agree_exactly_when_keys_have_equal_norms():
    generator = make_generator(0)
    q, k, v = (torch.randn(40, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    k = k / k.norm(dim=-1, keepdim=True)
    for top in (1, 5, 20, 40):
        assert selections_agree(q, k, top) == 1.0
        torch.testing.assert_close(knn_slow(q, k, v, top), knn_fast(q, k, v, top), rtol=0, atol=1e-12)


def test_slow_and_fast_definitions_differ_for_keys_of_different_norms():
    generator = make_generator(1)
    q, k = (torch.randn(64, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    k = k * torch.linspace(0.1, 5.0, 64, dtype=torch.float64)[:, None]  # norms from 0.1 to 5
    assert selections_agree(q, k, 8) < 0.5


def test_fast_definition_with_every_key_is_softmax_attention():
    generator = make_generator(2)
    q, k, v = (torch.randn(2, 10, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    dense = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ v
    torch.testing.assert_close(knn_fast(q, k, v, 10), dense)


def test_lemma3_recall_rises_to_one_with_the_dimension():
    """Relevant keys are planted, so recall at k is exact; at d = 1024 every relevant key is in the top n·d^(-1/4)."""
    generator = make_generator(3)
    low = relevant_recall(1024, 4, 64, 256, 50, generator)
    high = relevant_recall(1024, 1024, 64, math.ceil(1024 * 1024**-0.25), 50, generator)
    assert low["recall"] < 0.9 < high["recall"] == 1.0
    assert high["needed_k"] <= math.ceil(1024 * 1024**-0.25) < low["needed_k"]


def test_lemma3_under_assumption_3_1_the_count_falls_faster_than_n_over_d(tmp_path):
    """Eq. 35 with κ = τ = 0: the keys scoring at least the weakest relevant one number at most c·n/d."""
    results = run(out=tmp_path, parts=["lemma3_assumption"], lemma3_dims=[128, 1024])
    rows = results["lemma3_assumption"]["rows"]
    assert rows[0]["needed_k"] > rows[1]["needed_k"] >= 8 and results["lemma3_assumption"]["slope"] <= -1
    assert results["claims"][0]["holds"] is True and "lemma3" not in results and "k_sweep" not in results


def test_lemma4_noise_part_decays_like_k_to_the_minus_half(tmp_path):
    """Lemma 4's first term: at a fixed k1/k the noise part falls like k^(-1/2); with every key relevant it is the
    whole error, with noisy keys the error keeps a bias that does not fall with k."""
    results = run(out=tmp_path, parts=["lemma4"], lemma4_ks=[4, 16, 64, 256], lemma4_fractions=[1.0, 0.5])
    table = results["lemma4"]["fractions"]
    assert all(abs(row["noise_slope"] + 0.5) < 0.1 for row in table.values())
    assert table["1"]["error"] == pytest.approx(table["1"]["noise"]) and table["0.5"]["error_slope"] > -0.4
    assert [c["holds"] for c in results["claims"]] == [True, True] and (tmp_path / "lemma4_k_sweep.png").exists()


def tiny_classifier(knn_k=None) -> AoTForImageClassification:
    torch.manual_seed(0)
    config = AoTConfig(image_size=8, patch_size=2, num_channels=1, num_labels=3, hidden_size=16, num_hidden_layers=2,
                       num_attention_heads=2, attention_type="mhsa", mlp_layers="all", pooling="cls")  # fmt: skip
    return AoTForImageClassification(config).eval()


def test_lemma1_single_key_has_zero_variance_and_zero_query_key_gradient():
    """Lemma 1 at its extreme: with k = 1 each query's weights are one-hot, so Var_a(x) = 0 and the output does not
    depend on W_Q or W_K at all; dense attention has both non-zero."""
    model, images = tiny_classifier(), torch.randn(4, 1, 8, 8)
    set_k(model, 1)
    one = attention_variance_and_gradients(model, images)
    set_k(model, None)
    dense = attention_variance_and_gradients(model, images)
    assert one["grad_norm_wq_wk"] == 0.0 and abs(one["mean_trace_var"]) < 1e-5
    assert dense["grad_norm_wq_wk"] > 0 and dense["mean_trace_var"] > 0.1


def test_layer_diagnostics_are_fig2_metrics_per_layer():
    model, images = tiny_classifier(), torch.randn(3, 1, 8, 8)
    series = layer_diagnostics(model, images)
    assert set(series) == {"cosine_similarity", "attention_std", "residual_ratio"}
    assert all(len(values) == 2 for values in series.values())
    assert all(-1 <= c <= 1 for c in series["cosine_similarity"]) and all(r > 0 for r in series["residual_ratio"])
    set_k(model, 1)  # one key per query: one-hot weights have the largest spread, 1/sqrt(n) for n keys
    one_hot = layer_diagnostics(model, images)["attention_std"]
    assert all(s > d for s, d in zip(one_hot, series["attention_std"], strict=True))


def test_inspect_compares_dense_and_knn(tmp_path, capsys):
    assert main(["inspect", "aot-mssa-l-tiny", "--out", str(tmp_path), "--num-samples", "2", "--seq-len", "16",
                 "--knn-k", "4"]) == 0  # fmt: skip
    results = json.loads((tmp_path / "results.json").read_text())
    comparison = results["knn_comparison"]
    assert set(comparison) == {"dense", "knn_k=4"}
    layers = AoTConfig.from_preset("aot-mssa-l-tiny").num_hidden_layers
    assert all(len(series["residual_ratio"]) == layers for series in comparison.values())
    assert (tmp_path / "knn_comparison.png").stat().st_size > 0
    assert main(["inspect", "aot-mssa-l-tiny", "--out", str(tmp_path), "--knn-k", "0"]) == 2


@pytest.mark.skipif(not (_vision.default_data_dir() / "vision" / "mnist5k").exists(), reason="needs ../shared/data")
def test_study_writes_every_claim_and_figure(tmp_path, capsys):
    code = main(["experiment", "knn-evidence", "--out", str(tmp_path), "--k-fractions", "0.5", "--seeds", "0",
                 "--epochs", "1", "--train-images", "100", "--hidden-size", "16", "--num-layers", "1",
                 "--timing-tokens", "16", "--timing-batch", "1", "--lemma3-dims", "16"])  # fmt: skip
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    for key in ("slow_vs_fast", "lemma3", "k_sweep", "lemma1", "fig2"):
        assert key in results
    assert len(results["claims"]) == 11  # 8, and Lemma 3 under Assumption 3.1, Lemma 4 at two fractions
    for png in ("lemma3_recall.png", "fig1_k_sweep.png", "lemma1_gradients.png", "fig2_layer_diagnostics.png",
                "figs3_4_attention_maps.png"):  # fmt: skip
        assert (tmp_path / png).stat().st_size > 0
