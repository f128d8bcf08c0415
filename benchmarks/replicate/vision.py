"""Comparison 2 (and the vision half of 3): ViT vs AoT image classifiers on the local CIFAR-10 archives.

Images, the stratified validation split, the image processor, the augmentation (random crop with padding 4 +
horizontal flip), the accuracy metric and the augmenting `Trainer` all come from `aot_transformers.training` — the
path `aot train image` takes — and every row (transformers' ViT included) goes through them identically.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .language import _quiet, training_step_closure
from .models import Row, build_image_classifier, count_parameters

IMAGE_SIZE = 32


@dataclass
class VisionData:
    """Preprocessed splits (uint8 pixels) and what the rows share."""

    train: Any
    validation: Any
    processor: Any
    id2label: dict[int, str]
    description: str


def prepare_vision_data(plan, cifar_dir: Path, seed: int = 0) -> VisionData:
    """The CIFAR-10 archives with a stratified 10% validation split (the package's default), the training pool cut
    to `plan.train_images` and the validation set to `plan.eval_images`: split and cuts are fixed by
    `ImageDataArguments.split_seed` (0), so every row and every training `seed` sees the same images."""
    from aot_transformers.training import ImageDataArguments, load_image_source
    from aot_transformers.training.vision_data import make_image_processor, preprocess_images

    args = ImageDataArguments(
        dataset_name=str(cifar_dir),
        validation_split_percentage=10.0,
        max_train_samples=plan.train_images,
        max_eval_samples=plan.eval_images,
    )
    source = load_image_source(args, seed=seed)
    processor = make_image_processor(IMAGE_SIZE, 3)
    train = preprocess_images(source.train, processor, 3, "training images")
    validation = preprocess_images(source.validation, processor, 3, "validation images")
    return VisionData(train, validation, processor, dict(enumerate(source.class_names)), source.description)


def _trainer(model, plan, data: VisionData, output_dir: Path, seed: int):
    """The package's augmenting Trainer (augmented training batches, plain evaluation batches) with one set of
    arguments for every row: AdamW, cosine schedule with linear warm-up, clipping at 1."""
    from transformers import TrainingArguments

    from aot_transformers.training.image import _augmenting_trainer_class, accuracy_metrics
    from aot_transformers.training.vision_data import ImageBatchCollator

    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=plan.max_steps,
        per_device_train_batch_size=plan.batch_size,
        per_device_eval_batch_size=256,
        learning_rate=plan.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=plan.warmup_ratio,
        weight_decay=plan.weight_decay,
        max_grad_norm=1.0,
        eval_strategy="steps",
        eval_steps=max(1, plan.max_steps // plan.evaluations),
        logging_steps=max(1, plan.max_steps // 25),
        save_strategy="no",
        report_to=[],
        seed=seed,
        data_seed=seed,
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = _augmenting_trainer_class()(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.validation,
        processing_class=data.processor,
        data_collator=ImageBatchCollator(data.processor, augment=False),
        compute_metrics=accuracy_metrics(),
    )
    trainer.train_data_collator = ImageBatchCollator(data.processor, augment=True)
    return trainer


def train_vision_row(row: Row, seed: int, plan, data: VisionData, run_dir: Path) -> dict[str, Any]:
    """Train one row with one seed; return its accuracy curve, final accuracy, parameters and timing."""
    from transformers import set_seed

    set_seed(seed)
    model = build_image_classifier(row, IMAGE_SIZE, data.id2label, plan.knn_k)
    trainer = _trainer(model, plan, data, run_dir, seed)
    _quiet(trainer)
    start = time.perf_counter()
    train_output = trainer.train()
    train_seconds = time.perf_counter() - start
    history = trainer.state.log_history
    final = next((e for e in reversed(history) if "eval_accuracy" in e and e["step"] == plan.max_steps), None)
    if final is None:
        final = trainer.evaluate()
    images_per_epoch = len(data.train)
    return {
        "row": row.name,
        "label": row.label,
        "seed": seed,
        "knn": row.knn,
        "parameters": count_parameters(model),
        "images": plan.max_steps * plan.batch_size,
        "epochs": plan.max_steps * plan.batch_size / images_per_epoch,
        "train_seconds": train_seconds,
        "train_loss": train_output.training_loss,
        "eval_accuracy": final["eval_accuracy"],
        "eval_loss": final["eval_loss"],
        "curve": {
            "train": [(e["step"], e["loss"]) for e in history if "loss" in e],
            "eval": [(e["step"], e["eval_accuracy"]) for e in history if "eval_accuracy" in e],
            "eval_loss": [(e["step"], e["eval_loss"]) for e in history if "eval_loss" in e],
        },
    }


def time_vision_rows(rows: list[Row], plan, data: VisionData) -> dict[str, float]:
    """Seconds per training step of every row at the training batch size, interleaved (best of `timing_rounds`)."""
    from transformers import set_seed

    from aot_transformers.training.vision_data import ImageBatchCollator

    from .._common import interleaved_best_times

    examples = [data.train[i] for i in range(min(plan.batch_size, len(data.train)))]
    batch = ImageBatchCollator(data.processor, augment=True)(examples)
    steps = {}
    for row in rows:
        set_seed(0)
        model = build_image_classifier(row, IMAGE_SIZE, data.id2label, plan.knn_k)
        steps[row.name] = training_step_closure(model, batch)
    torch.manual_seed(0)
    return interleaved_best_times(steps, rounds=plan.timing_rounds, warmup=1)
