"""Smoke runs of every `aot experiment NAME` command and of `aot inspect`, with tiny options."""

from __future__ import annotations

import json

import pytest
import torch

from aot_transformers import AoTForCausalLM
from aot_transformers.cli import main
from aot_transformers.experiments import STUDIES, run_experiment


@pytest.fixture(autouse=True)
def _restore_threads():
    previous = torch.get_num_threads()  # the commands set one thread; leave other tests as they were
    yield
    torch.set_num_threads(previous)


def _claims(folder):
    return json.loads((folder / "results.json").read_text())["claims"]


def test_denoising_command(tmp_path, capsys):
    assert (
        main(
            [
                "experiment",
                "denoising",
                "--out",
                str(tmp_path),
                "--noise-levels",
                "0.2",
                "--num-subspaces",
                "2",
                "--subspace-dim",
                "64",
                "--num-tokens",
                "64",
                "--num-layers",
                "2",
            ]
        )
        == 0
    )
    assert "1 + ητ" in capsys.readouterr().out
    assert (tmp_path / "summary.md").exists() and _claims(tmp_path)


def test_clustering_command(tmp_path):
    assert (
        main(
            [
                "experiment",
                "clustering",
                "--out",
                str(tmp_path),
                "--steps",
                "5",
                "--softmax-steps",
                "5",
                "--batch-size",
                "8",
                "--rhos",
                "0",
                "0.2",
                "--mc-sequences",
                "2",
                "--mc-seq-len",
                "40",
            ]
        )
        == 0
    )
    assert (tmp_path / "fig1_manifold_init.png").exists()


def test_icl_command(tmp_path):
    assert (
        main(
            [
                "experiment",
                "icl",
                "--out",
                str(tmp_path),
                "--dim",
                "2",
                "--tasks",
                "linear",
                "--hidden-size",
                "16",
                "--num-heads",
                "2",
                "--aot-layers",
                "1",
                "--transformer-layers",
                "1",
                "--steps",
                "2",
                "--batch-size",
                "4",
                "--eval-prompts",
                "8",
            ]
        )
        == 0
    )
    assert (tmp_path / "icl_error_curves.png").exists()


def test_knn_command(tmp_path):
    assert (
        main(
            [
                "experiment",
                "knn",
                "--out",
                str(tmp_path),
                "--noise-ratios",
                "0",
                "0.6",
                "--num-tokens",
                "16",
                "--num-trials",
                "2",
                "--skip-training",
            ]
        )
        == 0
    )
    assert (tmp_path / "noise_distillation.png").exists()


def test_attention_maps_and_inspect_commands(tmp_path, shared_data):
    maps = tmp_path / "maps"
    assert (
        main(
            [
                "experiment",
                "attention-maps",
                "--out",
                str(maps),
                "--epochs",
                "1",
                "--num-images",
                "2",
                "--hidden-size",
                "16",
                "--num-layers",
                "1",
                "--train-images",
                "256",
                "--data-dir",
                str(shared_data),
            ]
        )
        == 0
    )
    assert (maps / "attention_maps.png").exists() and (maps / "model" / "config.json").exists()
    report = tmp_path / "inspect"
    assert main(["inspect", str(maps / "model"), "--out", str(report), "--num-samples", "4"]) == 0
    assert json.loads((report / "results.json").read_text())["inputs"] == "MNIST digits"


def test_inspect_command_on_a_text_model(tmp_path):
    model = AoTForCausalLM(
        AoTForCausalLM.config_class(
            vocab_size=260, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=32
        )
    )
    model.save_pretrained(tmp_path / "lm")
    text = tmp_path / "t.txt"
    text.write_text("subspace denoising " * 100)
    assert (
        main(
            [
                "inspect",
                str(tmp_path / "lm"),
                "--out",
                str(tmp_path / "r"),
                "--data",
                str(text),
                "--seq-len",
                "16",
                "--num-samples",
                "2",
            ]
        )
        == 0
    )
    assert (tmp_path / "r" / "layerwise.png").exists()


def test_unknown_study_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["experiment", "telepathy"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="Unknown study 'telepathy'"):
        run_experiment("telepathy")
    assert set(STUDIES) == {"denoising", "icl", "clustering", "knn", "attention-maps"}


def test_bad_option_value_is_a_clear_error(tmp_path, capsys):
    # The error contract of `aot` (aot_transformers.errors): a rejected value is one line with exit code 2.
    assert main(["experiment", "denoising", "--out", str(tmp_path), "--noise-levels", "-1"]) == 2
    assert "noise_levels" in capsys.readouterr().err
    assert main(["experiment", "clustering", "--out", str(tmp_path), "--rhos", "-0.5"]) == 2
    assert "rho" in capsys.readouterr().err
