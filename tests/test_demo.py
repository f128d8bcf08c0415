"""`aot demo`, the main job: a shortened run in the default suite, the full one as a slow test.

Full run: `.venv/bin/pytest -m slow tests/test_demo.py` (about 3–5 minutes on 2 cores).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("datasets")
pytest.importorskip("sklearn")

from aot_transformers.training.demo import IMAGE_FOLDER, LM_FOLDER, run_demo

FOLDER_FILES = {
    "config.json",
    "model.safetensors",
    "README.md",
    "training_curves.png",
    "results.json",
    "configuration_aot.py",
    "attention_aot.py",
    "modeling_aot.py",
}


def _check_folders(out):
    for folder, extra in ((LM_FOLDER, "tokenizer.json"), (IMAGE_FOLDER, "preprocessor_config.json")):
        names = {p.name for p in (out / folder).iterdir()}
        assert FOLDER_FILES | {extra} <= names, folder
        assert "custom_code" in (out / folder / "README.md").read_text()
    assert json.loads((out / "demo_results.json").read_text())["sample"]


def test_short_demo_end_to_end(tmp_path, capsys):
    summary = run_demo(tmp_path / "demo", lm_epochs=0.05, image_epochs=1)
    _check_folders(tmp_path / "demo")
    assert summary["sample"].startswith("The")
    # The fresh process (Auto classes + pipeline, no aot_transformers importable) scores the test digits exactly as
    # the in-process evaluation did.
    assert summary["reloaded_test_accuracy"] == pytest.approx(summary["image_test_accuracy"], abs=1e-9)
    assert summary["test_images"] == 359
    out = capsys.readouterr().out
    assert "sample (fresh process, trust_remote_code=True)" in out and "test accuracy" in out


@pytest.mark.slow
def test_full_demo_learns_in_under_ten_minutes(tmp_path):
    summary = run_demo(tmp_path / "demo")
    _check_folders(tmp_path / "demo")
    assert summary["total_seconds"] < 600
    assert summary["lm_validation_perplexity"] < 0.7 * summary["lm_unigram_perplexity"]
    assert summary["reloaded_test_accuracy"] > 0.85
