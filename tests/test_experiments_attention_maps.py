"""Attention maps (AoT Fig. 7) and layer-wise diagnostics (`aot inspect`)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from aot_transformers import AoTForCausalLM, AoTForImageClassification
from aot_transformers.experiments import attention_maps as A
from aot_transformers.experiments import diagnostics as G
from aot_transformers.experiments.knn import vision_config
from aot_transformers.experiments.study import Study

pytestmark = pytest.mark.usefixtures("one_thread")


def _classifier(num_channels=1, image_size=8):
    torch.manual_seed(0)
    config = vision_config(
        "aot",
        None,
        image_size=image_size,
        patch_size=2,
        hidden_size=16,
        num_layers=2,
        num_heads=2,
        num_channels=num_channels,
    )
    return AoTForImageClassification(config)


# -------------------------------------------------------------------------------------------------- attention maps


def test_cls_attention_maps_shape_and_mass():
    model = _classifier()
    maps = A.cls_attention_maps(model, torch.randn(3, 1, 8, 8), layer=-1)
    assert maps.shape == (3, 2, 4, 4)
    total = maps.sum((-1, -2))
    assert torch.all(total <= 1 + 1e-6) and torch.all(total > 0)


def test_cls_attention_maps_reject_bad_layer():
    with pytest.raises(ValueError, match="layer"):
        A.cls_attention_maps(_classifier(), torch.randn(1, 1, 8, 8), layer=2)


def test_object_share_hand_case():
    # One bright quadrant; all attention on it gives share 1; uniform attention gives the patch fraction 1/4.
    images = torch.zeros(1, 1, 4, 4)
    images[..., :2, :2] = 1.0
    focused = torch.zeros(1, 1, 2, 2)
    focused[..., 0, 0] = 0.9
    uniform = torch.full((1, 1, 2, 2), 0.2)
    assert A.object_attention_share(focused, images)["attention_on_object"] == pytest.approx(1.0)
    share = A.object_attention_share(uniform, images)
    assert share["attention_on_object"] == pytest.approx(0.25)
    assert share["object_patch_fraction"] == pytest.approx(0.25)


def test_plot_grid(tmp_path):
    study = Study("grid", "t", None, tmp_path, "none")
    A.plot_attention_grid(
        study.figure("grid.png", ncols=3, nrows=2), torch.rand(2, 3, 8, 8), torch.rand(2, 2, 4, 4), "t"
    )
    study.finish()
    assert (tmp_path / "grid.png").stat().st_size > 0


def test_run_trains_saves_and_reloads(tmp_path, shared_data):
    results = A.run(
        out=tmp_path,
        dataset="mnist",
        epochs=1,
        num_images=2,
        data_dir=shared_data,
        hidden_size=16,
        num_layers=1,
        train_images=256,
    )
    assert {"results.json", "summary.md", "attention_maps.png", "model"} <= {p.name for p in tmp_path.iterdir()}
    assert results["maps"].shape[:2] == (2, 4)
    again = A.run(out=tmp_path / "again", model=tmp_path / "model", num_images=2, data_dir=shared_data)
    assert again["val_accuracy"] == pytest.approx(results["val_accuracy"])


def test_run_rejects_unknown_dataset(tmp_path):
    with pytest.raises(ValueError, match="dataset"):
        A.run(out=tmp_path, dataset="imagenet")


# ----------------------------------------------------------------------------------------------------- diagnostics


def test_coding_rate_hand_case():
    # Z = √s I_d (n = d tokens): ZᵀZ = s I, so R = ½ d log(1 + s/ε²).
    dim, s, eps = 4, 3.0, 0.5
    tokens = math.sqrt(s) * torch.eye(dim)
    assert G.coding_rate(tokens, eps).item() == pytest.approx(0.5 * dim * math.log(1 + s / eps**2))
    assert G.coding_rate(torch.zeros(5, dim), eps).item() == pytest.approx(0.0)


def test_subspace_rate_with_the_whole_space_equals_the_rate():
    tokens = torch.randn(20, 6)
    whole = torch.eye(6).unsqueeze(0)
    assert G.subspace_coding_rate(tokens, whole).item() == pytest.approx(G.coding_rate(tokens).item())
    assert G.head_energy(tokens, whole).item() == pytest.approx(1.0)


def test_head_energy_of_tokens_inside_one_head():
    subspaces = torch.eye(4).reshape(2, 2, 4).transpose(1, 2)  # head 0: e0, e1; head 1: e2, e3
    tokens = torch.zeros(3, 4)
    tokens[:, :2] = torch.randn(3, 2)
    torch.testing.assert_close(G.head_energy(tokens, subspaces), torch.tensor([1.0, 0.0], dtype=torch.float64))


def test_head_subspaces_are_orthonormal():
    model = _classifier()
    bases = G.head_subspaces(model.model.layers[0].attention)
    assert bases.shape == (2, 16, 8)
    torch.testing.assert_close(bases.transpose(1, 2) @ bases, torch.eye(8, dtype=torch.float64).expand(2, 8, 8))


def test_layerwise_diagnostics_on_language_and_vision_models():
    model = _classifier()
    rows = G.layerwise_diagnostics(model, torch.randn(2, 1, 8, 8))
    assert len(rows["rate"]) == 2 and len(rows["head_energy"][0]) == 2
    lm = AoTForCausalLM(
        G.AoTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=4, attention_type="mhsa")
    )
    rows = G.layerwise_diagnostics(lm, torch.randint(0, 50, (2, 12)))
    assert len(rows["rate"]) == 3
    assert all(0 <= e <= 1 for layer in rows["head_energy"] for e in layer)


def test_inspect_a_saved_text_model(tmp_path):
    model = AoTForCausalLM(
        G.AoTConfig(
            vocab_size=300, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=32
        )
    )
    model.save_pretrained(tmp_path / "lm")
    text = tmp_path / "text.txt"
    text.write_text("attention only transformers compress tokens layer by layer. " * 40)
    results = G.run(tmp_path / "lm", out=tmp_path / "report", data=text, num_samples=3, seq_len=16)
    assert results["inputs"].startswith("UTF-8 bytes")
    saved = json.loads((tmp_path / "report" / "results.json").read_text())
    assert len(saved["layers"]["rate"]) == 2
    assert (tmp_path / "report" / "layerwise.png").exists()


def test_inspect_rejects_unknown_model(tmp_path):
    with pytest.raises(ValueError, match="model"):
        G.run(tmp_path / "nothing-here", out=tmp_path)
