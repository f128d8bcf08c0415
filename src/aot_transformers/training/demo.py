"""`aot demo`, the main job: train, evaluate, export and reload a tiny AoT language model and a tiny AoT image
classifier on data every machine has, with no download.

1. a byte-level BPE tokenizer and an AoT-MSSA causal LM (`aot-mssa-l-tiny`) on Python's `pydoc_data.topics`;
2. an AoT image classifier (`aot-v-tiny` at 8×8 px, patch 2) on scikit-learn's digits;
3. both written as hub-ready folders (weights, code files, tokenizer / image processor, model card, training
   curves) and reloaded in a fresh interpreter through the Auto classes with `trust_remote_code=True`, where the LM
   generates a sample and the classifier is scored on the held-out test digits through `pipeline`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import TrainingArguments

LM_FOLDER = "aot-mssa-l-tiny-pydoc"
IMAGE_FOLDER = "aot-v-tiny-digits"
REPORT_PREFIX = "AOT_RELOAD_REPORT "  # as printed by _reload_check.py
REPORT = (  # the closing summary, formatted with `rule` and the summary's fields
    "\n{rule}\nLanguage model:  {lm_folder}\n"
    "  validation perplexity {lm_validation_perplexity:.2f} (unigram baseline {lm_unigram_perplexity:.2f})\n"
    "  sample (fresh process, trust_remote_code=True): {sample!r}\nImage classifier: {image_folder}\n"
    "  test accuracy {reloaded_test_accuracy:.3f} on {test_images} held-out digits "
    "(fresh process, pipeline('image-classification'))\n"
    "Model cards: README.md in each folder; training curves: training_curves.png. Total {total_seconds:.0f} s.\n{rule}"
)


def idle_cores() -> int:
    """Cores not busy with other work (by the 1-minute load average): oversubscribed threads slow a tiny model down
    several times over, so the demo uses only what is free, and at least one."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except OSError:  # pragma: no cover
        busy = 0.0
    return max(1, min(cores, int(cores - busy + 0.5)))


def _training_arguments(
    output_dir: Path, epochs: float, seed: int, batch: int, eval_batch: int, lr: float, log: int
) -> TrainingArguments:
    """The demo's CPU `TrainingArguments`: cosine schedule, 20 warm-up steps, evaluation each epoch, no checkpoints."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(output_dir),
        save_strategy="no",
        eval_strategy="epoch",
        report_to="none",
        use_cpu=True,
        lr_scheduler_type="cosine",
        weight_decay=0.01,
        num_train_epochs=epochs,
        per_device_train_batch_size=batch,
        per_device_eval_batch_size=eval_batch,
        learning_rate=lr,
        warmup_steps=20,
        logging_steps=log,
        seed=seed,
        disable_tqdm=False,
    )


def train_demo_lm(output_dir: Path, epochs: float, seed: int = 0) -> dict[str, Any]:
    """Stage 1: tokenizer + tiny AoT-MSSA LM on the embedded corpus; returns the metrics."""
    from .arguments import PublishArguments
    from .lm import LMModelArguments, train_lm
    from .text_data import EMBEDDED_CORPUS, TextDataArguments

    return train_lm(
        LMModelArguments(preset="aot-mssa-l-tiny", tokenizer_vocab_size=1024),
        TextDataArguments(dataset_name=EMBEDDED_CORPUS, block_size=128, validation_split_percentage=8),
        _training_arguments(output_dir / "runs" / "lm", epochs, seed, batch=16, eval_batch=32, lr=3e-3, log=10),
        PublishArguments(final_model_dir=str(output_dir / LM_FOLDER), model_name=LM_FOLDER),
    )


def train_demo_image(output_dir: Path, epochs: float, seed: int = 0) -> tuple[dict[str, Any], Dataset]:
    """Stage 2: tiny AoT image classifier on scikit-learn's digits; returns `(metrics, test split)`."""
    from .arguments import PublishArguments
    from .image import ImageModelArguments, prepare_image_training, run_image_training
    from .vision_data import SKLEARN_DIGITS, ImageDataArguments

    run = prepare_image_training(
        ImageModelArguments(preset="aot-v-tiny", config_overrides="image_size=8,patch_size=2"),
        ImageDataArguments(dataset_name=SKLEARN_DIGITS, validation_split_percentage=10, test_split_percentage=20),
        _training_arguments(output_dir / "runs" / "image", epochs, seed, batch=32, eval_batch=128, lr=2e-3, log=20),
        PublishArguments(final_model_dir=str(output_dir / IMAGE_FOLDER), model_name=IMAGE_FOLDER),
    )
    return run_image_training(run), run.source.test


def save_test_images(test: Dataset, path: Path) -> Path:
    """The test digits as uint8 arrays in an .npz (no pickle), for the fresh-process check."""
    import numpy as np

    images = np.stack([np.asarray(example["image"].convert("L"), dtype=np.uint8) for example in test])
    labels = np.asarray(test["label"], dtype=np.int64)
    np.savez(path, images=images, labels=labels)
    return path


def reload_in_fresh_process(lm_dir: Path, image_dir: Path, test_images: Path, prompt: str) -> dict[str, Any]:
    """Run `_reload_check.py` in a new interpreter (without aot-transformers importable) and return its report."""
    script = Path(__file__).with_name("_reload_check.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    command = [sys.executable, str(script), "--lm", str(lm_dir), "--prompt", prompt]
    command += ["--image", str(image_dir), "--test-images", str(test_images)]
    completed = subprocess.run(
        command, env=env, capture_output=True, text=True, cwd=lm_dir.parent, stdin=subprocess.DEVNULL
    )
    reports = [line.split(REPORT_PREFIX, 1)[1] for line in completed.stdout.splitlines() if REPORT_PREFIX in line]
    if completed.returncode != 0 or not reports:
        raise RuntimeError(
            f"Reloading in a fresh process failed:\n{completed.stdout[-2000:]}\n{completed.stderr[-4000:]}"
        )
    return json.loads(reports[-1])


def run_demo(
    output_dir: str | os.PathLike = "aot-demo",
    lm_epochs: float = 6.0,
    image_epochs: float = 30.0,
    prompt: str = "The ",
    seed: int = 0,
) -> dict[str, Any]:
    """Run the whole demo (see the module docstring); returns and writes `demo_results.json`."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning()
    torch.set_num_threads(idle_cores())
    output_dir = Path(output_dir).resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    print(f"[1/3] Tokenizer + AoT-MSSA language model on pydoc_data.topics -> {output_dir / LM_FOLDER}", flush=True)
    lm_metrics = train_demo_lm(output_dir, lm_epochs, seed)
    lm_time = time.perf_counter() - start

    print(f"[2/3] AoT image classifier on scikit-learn digits -> {output_dir / IMAGE_FOLDER}", flush=True)
    image_metrics, test = train_demo_image(output_dir, image_epochs, seed)
    image_time = time.perf_counter() - start - lm_time

    print("[3/3] Reloading both folders in a fresh process (Auto classes, trust_remote_code=True)", flush=True)
    test_file = save_test_images(test, output_dir / "runs" / "digits_test.npz")
    reloaded = reload_in_fresh_process(output_dir / LM_FOLDER, output_dir / IMAGE_FOLDER, test_file, prompt)
    summary = {
        "lm_folder": str(output_dir / LM_FOLDER),
        "image_folder": str(output_dir / IMAGE_FOLDER),
        "lm_validation_loss": lm_metrics.get("eval_loss"),
        "lm_validation_perplexity": lm_metrics.get("eval_perplexity"),
        "lm_unigram_perplexity": lm_metrics.get("eval_unigram_perplexity"),
        "image_validation_accuracy": image_metrics.get("eval_accuracy"),
        "image_test_accuracy": image_metrics.get("test_accuracy"),
        "reloaded_test_accuracy": reloaded.get("test_accuracy"),
        "test_images": reloaded.get("test_images"),
        "sample": reloaded.get("sample"),
        "lm_seconds": round(lm_time, 1),
        "image_seconds": round(image_time, 1),
        "total_seconds": round(time.perf_counter() - start, 1),
    }
    (output_dir / "demo_results.json").write_text(json.dumps(summary, indent=2))
    print(REPORT.format(rule="=" * 80, **summary))
    return summary
