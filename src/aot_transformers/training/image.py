"""Image-classification training of AoT models with `transformers.Trainer`.

Runs as `aot train image …`, `python -m aot_transformers.training.image …`, and under `torchrun` / `accelerate
launch -m aot_transformers.training.image …`. The image processor is saved with the model, so
`pipeline("image-classification", model=folder, trust_remote_code=True)` works on the result. Accuracy comes from
the local `evaluate` metric module in `training/metrics`.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Any

from .common import (
    PublishArguments,
    TrainingSetupError,
    build_config,
    finalize_run,
    prepare_training_arguments,
    resolve_resume,
    training_summary,
)
from .vision_data import (
    ImageBatchCollator,
    ImageDataArguments,
    load_image_source,
    make_image_processor,
    preprocess_images,
)

logger = logging.getLogger(__name__)

DEFAULT_IMAGE_PRESET = "aot-v-tiny"


@dataclass
class ImageModelArguments:
    """Which model to train."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "An AoT image classifier (folder or Hub id) to fine-tune."}
    )
    preset: str | None = field(
        default=None, metadata={"help": f"A named configuration (`aot info`); default {DEFAULT_IMAGE_PRESET}."}
    )
    config_file: str | None = field(default=None, metadata={"help": "A config.json to build the model from."})
    config_overrides: str | None = field(
        default=None, metadata={"help": "Config fields to override, e.g. 'hidden_size=128,patch_size=4'."}
    )
    image_size: int | None = field(
        default=None, metadata={"help": "Side the images are resized to (default: the config's image_size)."}
    )


@dataclass
class ImageRun:
    """Everything set up for a run, before training."""

    trainer: Any
    processor: Any
    resume: str | None
    push: bool
    source: Any
    augment: bool
    model_args: ImageModelArguments
    data_args: ImageDataArguments
    training_args: Any
    publish_args: PublishArguments


def _augmenting_trainer_class():
    from transformers import Trainer

    class AugmentingTrainer(Trainer):
        """`Trainer` whose training batches go through `train_data_collator` (with augmentation) while evaluation
        batches use the plain `data_collator`."""

        train_data_collator = None

        def get_train_dataloader(self):
            if self.train_data_collator is None:
                return super().get_train_dataloader()
            plain, self.data_collator = self.data_collator, self.train_data_collator
            try:
                return super().get_train_dataloader()
            finally:
                self.data_collator = plain

    return AugmentingTrainer


def accuracy_metrics():
    """`compute_metrics` for `Trainer`: accuracy through the local `evaluate` accuracy module."""
    import numpy as np

    from .metrics import load_metric

    metric = load_metric("accuracy")

    def compute(eval_prediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        return metric.compute(predictions=np.argmax(logits, axis=-1), references=eval_prediction.label_ids)

    return compute


def prepare_image_training(
    model_args: ImageModelArguments,
    data_args: ImageDataArguments,
    training_args,
    publish_args: PublishArguments | None = None,
    callbacks: list | None = None,
) -> ImageRun:
    """Check every input, load the images, build the model, processor and `Trainer`. Nothing is trained yet."""
    from transformers import set_seed

    from ..modeling_aot import AoTForImageClassification

    AugmentingTrainer = _augmenting_trainer_class()

    publish_args = publish_args or PublishArguments()
    push, _ = prepare_training_arguments(training_args)
    resume = resolve_resume(training_args.resume_from_checkpoint, training_args.output_dir)
    training_args.resume_from_checkpoint = resume
    if data_args.augment not in ("auto", "yes", "no"):
        raise TrainingSetupError(f"--augment must be 'auto', 'yes' or 'no', got {data_args.augment!r}.")
    # The config first: a bad preset or override fails before any image is read.
    config = build_config(
        model_args.model_name_or_path,
        model_args.preset,
        model_args.config_file,
        model_args.config_overrides,
        DEFAULT_IMAGE_PRESET,
        image_size=model_args.image_size,
    )
    set_seed(training_args.seed)
    with training_args.main_process_first(desc="loading images"):
        source = load_image_source(data_args, seed=training_args.seed)
    id2label = dict(enumerate(source.class_names))
    reinitialise_head = False
    if model_args.model_name_or_path:
        old = [config.id2label[i] for i in sorted(config.id2label)]
        if old != source.class_names:
            logger.warning(
                "The checkpoint's classes %s differ from the data's: the classification head is re-initialised.",
                old[:10],
            )
            reinitialise_head = True
    config.id2label = id2label
    config.label2id = {name: i for i, name in id2label.items()}
    processor = make_image_processor(config.image_size, config.num_channels)
    augment = data_args.augment == "yes" or (data_args.augment == "auto" and source.kind == "cifar10-archives")
    with training_args.main_process_first(desc="preparing images"):
        train = preprocess_images(source.train, processor, config.num_channels, "training images")
        validation = None
        if source.validation is not None:
            validation = preprocess_images(source.validation, processor, config.num_channels, "validation images")
    if validation is None and training_args.eval_strategy != "no":
        training_args.eval_strategy = "no"

    if model_args.model_name_or_path:
        model = AoTForImageClassification.from_pretrained(
            model_args.model_name_or_path, config=config, ignore_mismatched_sizes=reinitialise_head
        )
    else:
        model = AoTForImageClassification(config)
    logger.info("Model: %s parameters, %d classes", f"{sum(p.numel() for p in model.parameters()):,}", len(id2label))
    trainer = AugmentingTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=validation,
        processing_class=processor,
        data_collator=ImageBatchCollator(processor, augment=False),
        compute_metrics=accuracy_metrics(),
        callbacks=callbacks,
    )
    trainer.train_data_collator = ImageBatchCollator(processor, augment=augment, crop_padding=data_args.crop_padding)
    return ImageRun(
        trainer, processor, resume, push, source, augment, model_args, data_args, training_args, publish_args
    )


def run_image_training(run: ImageRun) -> dict[str, Any]:
    """Train, evaluate (validation, and test when there is a test split), write the final folder, push if asked."""
    trainer, training_args = run.trainer, run.training_args
    train_result = trainer.train(resume_from_checkpoint=run.resume)
    metrics = dict(train_result.metrics)
    results = []
    name = run.source.name
    if trainer.eval_dataset is not None:
        metrics.update(trainer.evaluate())
        results.append(
            {
                "metric": "accuracy",
                "value": metrics["eval_accuracy"],
                "split": "validation",
                "dataset": name,
                "dataset_type": name,
            }
        )
    if run.source.test is not None:
        test = preprocess_images(run.source.test, run.processor, trainer.model.config.num_channels, "test images")
        metrics.update(trainer.evaluate(test, metric_key_prefix="test"))
        results.append(
            {
                "metric": "accuracy",
                "value": metrics["test_accuracy"],
                "split": "test",
                "dataset": name,
                "dataset_type": name,
            }
        )
    config = trainer.model.config
    training = training_summary(
        training_args,
        trainer,
        {
            "image size": f"{config.image_size} px, patch {config.patch_size}",
            "augmentation": f"random crop (padding {run.data_args.crop_padding}) + horizontal flip"
            if run.augment
            else "none",
            "training images": len(run.source.train),
        },
    )
    final_dir = finalize_run(
        trainer,
        training_args,
        run.publish_args,
        task="image-classification",
        processor=run.processor,
        metrics=metrics,
        results=results,
        datasets=run.source.hub_ids,
        dataset_description=run.source.description,
        training=training,
        push=run.push,
        base_model=run.model_args.model_name_or_path,
    )
    metrics["final_model_dir"] = str(final_dir) if final_dir else None
    if trainer.is_world_process_zero():
        trainer.save_metrics("all", {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    return metrics


def train_image(
    model_args: ImageModelArguments,
    data_args: ImageDataArguments,
    training_args,
    publish_args: PublishArguments | None = None,
    callbacks: list | None = None,
) -> dict[str, Any]:
    """Train an AoT image classifier end to end (see the module docstring) and return its metrics."""
    return run_image_training(prepare_image_training(model_args, data_args, training_args, publish_args, callbacks))


def parse_image_arguments(argv: list[str] | None = None):
    """Parse `(ImageModelArguments, ImageDataArguments, PublishArguments, TrainingArguments)`."""
    from .cli_args import parse_dataclasses

    return parse_dataclasses((ImageModelArguments, ImageDataArguments, PublishArguments), argv)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (`aot train image`, `python -m aot_transformers.training.image`)."""
    from .cli_args import run_with_clear_errors

    def job():
        model_args, data_args, publish_args, training_args = parse_image_arguments(argv)
        return train_image(model_args, data_args, training_args, publish_args)

    return run_with_clear_errors(job)


if __name__ == "__main__":
    sys.exit(main())
