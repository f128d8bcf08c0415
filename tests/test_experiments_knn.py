"""k-NN attention study (KVT): the noise-distillation setting and the image-model configurations."""

from __future__ import annotations

import json

import pytest
import torch

from aot_transformers.experiments import knn as K

pytestmark = pytest.mark.usefixtures("one_thread")


def test_noisy_tokens_shapes_and_fractions():
    tokens, relevant, mu = K.sample_noisy_tokens(100, 8, 0.3, num_trials=3, generator=K.make_generator(0))
    assert tokens.shape == (3, 100, 8) and relevant.shape == (3, 100) and mu.shape == (3, 8)
    assert relevant.sum(1).tolist() == [70, 70, 70]
    torch.testing.assert_close(mu.norm(dim=-1), torch.full((3,), 4.0))


def test_noiseless_relevant_tokens_sit_on_the_mean():
    tokens, relevant, mu = K.sample_noisy_tokens(10, 4, 0.5, sigma=0.0, generator=K.make_generator(1))
    torch.testing.assert_close(tokens[relevant], mu.expand(int(relevant.sum()), -1))


def test_bad_noise_ratio_is_rejected():
    with pytest.raises(ValueError, match="noise_ratio"):
        K.sample_noisy_tokens(10, 4, 1.0)


def test_top_k_with_all_keys_equals_dense():
    tokens, relevant, mu = K.sample_noisy_tokens(32, 8, 0.5, num_trials=4, generator=K.make_generator(2))
    dense = K.attention_distance_to_mean(tokens, relevant, mu, None, 8**-0.5)
    assert K.attention_distance_to_mean(tokens, relevant, mu, 32, 8**-0.5) == pytest.approx(dense)
    assert K.attention_distance_to_mean(tokens, relevant, mu, 1.0, 8**-0.5) == pytest.approx(dense)


def test_top_one_returns_the_query_itself():
    # The best-scoring key of a token is (almost surely) itself when its norm dominates: output = the token.
    tokens, relevant, mu = K.sample_noisy_tokens(16, 64, 0.5, sigma=1.0, num_trials=2, generator=K.make_generator(3))
    expected = float((tokens - mu[:, None]).norm(dim=-1)[relevant].mean())
    assert K.attention_distance_to_mean(tokens, relevant, mu, 1, 0.125) == pytest.approx(expected)


def test_top_k_distils_noise_at_high_noise_ratio():
    curves = K.noise_distillation_curve([0.0, 0.7], [None, 0.5], num_tokens=64, num_trials=8, seed=0)
    dense, top_half = curves["dense"], curves["k = 0.5·n"]
    assert top_half[1] < 0.8 * dense[1]  # many noisy tokens: top-k much closer to μ
    assert dense[1] > dense[0]  # noise pulls dense attention away from μ


def test_vision_configs():
    aot = K.vision_config("aot", 0.5)
    vit = K.vision_config("vit", None)
    assert aot.attention_type == "mssa" and aot.mlp_layers == "none" and aot.knn_k == 0.5
    assert vit.attention_type == "mhsa" and vit.mlp_layers == "all" and vit.knn_k is None
    with pytest.raises(ValueError, match="architecture"):
        K.vision_config("resnet", None)


def test_run_distillation_only(tmp_path):
    results = K.run(out=tmp_path, noise_ratios=(0.0, 0.6), num_tokens=32, num_trials=4, skip_training=True)
    assert {"results.json", "summary.md", "noise_distillation.png"} <= {p.name for p in tmp_path.iterdir()}
    assert json.loads((tmp_path / "results.json").read_text())["noise_distillation"]["noise_ratios"] == [0.0, 0.6]
    assert results["claims"][0]["holds"] is True


def test_run_with_training_on_cifar_files(tmp_path, shared_data):
    results = K.run(
        out=tmp_path,
        noise_ratios=(0.5,),
        num_tokens=16,
        num_trials=2,
        data_dir=shared_data,
        per_class=6,
        epochs=1,
        hidden_size=16,
        num_layers=1,
    )
    runs = results["training_speed"]["runs"]
    assert set(runs) == {"aot/dense", "aot/k = 0.5·n", "vit/dense", "vit/k = 0.5·n"}
    assert all(len(r["val_accuracy"]) == 1 for r in runs.values())
    assert (tmp_path / "training_speed.png").exists()


def test_training_speed_over_seeds_reports_the_seed_spread(tmp_path, shared_data):
    results = K.run(out=tmp_path, noise_ratios=(0.5,), num_tokens=16, num_trials=2, data_dir=shared_data, per_class=6,
                    epochs=2, hidden_size=16, num_layers=1, num_seeds=2, architectures=["vit"])  # fmt: skip
    runs = results["training_speed"]["runs"]
    assert set(runs) == {"vit/dense", "vit/k = 0.5·n"}
    for entry in runs.values():
        assert len(entry["per_seed"]) == 2 and len(entry["val_accuracy"]) == len(entry["val_accuracy_std"]) == 2
        curves = torch.tensor([h["val_accuracy"] for h in entry["per_seed"]])
        torch.testing.assert_close(torch.tensor(entry["val_accuracy"]), curves.mean(0))
    assert "epochs to reach" in results["claims"][-1]["quantity"] and "± " in results["claims"][-1]["measured"]


def test_train_classifier_times_its_epochs_from_the_start_of_training():
    import time

    from aot_transformers import AoTForImageClassification
    from aot_transformers.experiments._vision import train_classifier
    from support import tiny_config

    images, labels = torch.randn(24, 3, 16, 16), torch.randint(0, 5, (24,))
    data = {"train_images": images, "train_labels": labels, "val_images": images[:8], "val_labels": labels[:8]}
    before = time.perf_counter()
    history = train_classifier(AoTForImageClassification(tiny_config()), data, epochs=2, batch_size=8)
    elapsed = time.perf_counter() - before
    assert 0 < history["epoch_seconds"][0] <= history["epoch_seconds"][1] <= history["seconds"] <= elapsed
