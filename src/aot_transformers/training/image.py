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

from .arguments import (
    ModelArguments,
    PublishArguments,
    TrainingSetupError,
    check_checkpoint_weights,
    use_training_attention,
)
from .distributed import enable_fsdp_on_cpu
from .finish import HubPlan, finish_run, hub_checkpoint_callback, take_over_hub_options, training_summary
from .lora import LoraArguments
from .optim import OptimizerArguments, optimizer_cls_and_kwargs
from .run_state import (
    RecordRunTrainerMixin,
    data_fingerprint,
    run_identity,
    run_state_callbacks,
    start_run,
    train_unless_finished,
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
class ImageModelArguments(ModelArguments):
    """Which model to train (see `ModelArguments`; default preset aot-v-tiny) and at which image size."""

    image_size: int | None = field(
        default=None, metadata={"help": "Side the images are resized to (default: the config's image_size)."}
    )


@dataclass
class ImageRun:
    """Everything set up for a run, before training."""

    trainer: Any
    processor: Any
    resume: str | None
    hub: HubPlan
    source: Any
    augment: bool
    model_args: ImageModelArguments
    data_args: ImageDataArguments
    training_args: Any
    publish_args: PublishArguments
    lora: LoraArguments | None = None
    lock: Any = None  # the output folder's lock, held until the run ends


def _augmenting_trainer_class():
    from transformers import Trainer

    class AugmentingTrainer(RecordRunTrainerMixin, Trainer):
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
    lora: LoraArguments | None = None,
    optim: OptimizerArguments | None = None,
) -> ImageRun:
    """Check every input, load the images, build the model, processor and `Trainer`. Nothing is trained yet."""
    from transformers import set_seed

    from ..modeling_aot import AoTForImageClassification

    AugmentingTrainer = _augmenting_trainer_class()

    publish_args = publish_args or PublishArguments()
    if lora is not None:
        lora.check()
        lora = lora if lora.enabled else None
    optimizer = optimizer_cls_and_kwargs(optim, training_args)
    if lora is not None and training_args.fsdp:
        raise TrainingSetupError("LoRA adapters are trained without FSDP here; drop --fsdp", argument="--lora_r")
    hub = take_over_hub_options(training_args, publish_args)
    if data_args.augment not in ("auto", "yes", "no"):
        raise TrainingSetupError(f"--augment must be 'auto', 'yes' or 'no', got {data_args.augment!r}.")
    if isinstance(data_args.crop_padding, bool) or data_args.crop_padding < 0:
        raise TrainingSetupError(
            "", argument="--crop_padding", value=data_args.crop_padding, allowed="an integer >= 0 (pixels)"
        )
    if data_args.dataset_name is not None and not data_args.dataset_name.strip():
        raise TrainingSetupError(
            "is empty",
            argument="--dataset_name",
            value=data_args.dataset_name,
            allowed="an image folder, archive folder, CSV or Hub dataset id; leave it out for scikit-learn's digits",
        )
    # The config first: a bad preset or override fails before any image is read.
    config = model_args.build_config(DEFAULT_IMAGE_PRESET, image_size=model_args.image_size)
    # The classification head may be re-initialised for new classes; every other tensor must fit the config.
    check_checkpoint_weights(model_args.model_name_or_path, AoTForImageClassification, config, ("classifier.",))
    if lora is not None:  # before any data is read
        import torch

        from .lora import check_lora_targets

        with torch.device("meta"):
            check_lora_targets(AoTForImageClassification(config), lora)
        lora.check_base(model_args.model_name_or_path)
    if data_args.streaming and training_args.max_steps <= 0:
        raise TrainingSetupError(
            "a stream has no length to plan epochs with: give --max_steps", argument="--streaming"
        )
    identity = run_identity(
        training_args,
        config,
        data_fingerprint(data_args.dataset_name, data_args.validation_dir) + [f"{data_args.dataset_config_name}"],
        augment=data_args.augment,
        base_model=model_args.model_name_or_path,
        lora=lora.lora_r if lora is not None else None,
    )
    lock, resume = start_run(training_args, publish_args, identity)
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
    use_training_attention(model, training_args)
    if lora is not None:
        from .lora import apply_lora

        model = apply_lora(model, lora, "image-classification")
    logger.info("Model: %s parameters, %d classes", f"{sum(p.numel() for p in model.parameters()):,}", len(id2label))
    trainer = AugmentingTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=validation,
        processing_class=processor,
        data_collator=ImageBatchCollator(processor, augment=False),
        compute_metrics=accuracy_metrics(),
        optimizer_cls_and_kwargs=optimizer,
        callbacks=[
            *(callbacks or []),
            *run_state_callbacks(),
            *([hub_callback] if (hub_callback := hub_checkpoint_callback(hub)) else []),
        ],
    )
    trainer.run_record = identity
    enable_fsdp_on_cpu(trainer)
    trainer.train_data_collator = ImageBatchCollator(processor, augment=augment, crop_padding=data_args.crop_padding)
    return ImageRun(
        trainer,
        processor,
        resume,
        hub,
        source,
        augment,
        model_args,
        data_args,
        training_args,
        publish_args,
        lora,
        lock,
    )


def run_image_training(run: ImageRun) -> dict[str, Any]:
    """Train, evaluate (validation, and test when there is a test split), write the final folder, push if asked."""
    try:
        return _train_and_finish(run)
    finally:
        if run.lock is not None:
            run.lock.release()


def _train_and_finish(run: ImageRun) -> dict[str, Any]:
    trainer, training_args = run.trainer, run.training_args
    metrics = train_unless_finished(trainer, run.resume)
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
        channels = trainer.accelerator.unwrap_model(trainer.model).config.num_channels
        test = preprocess_images(run.source.test, run.processor, channels, "test images")
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
    config = trainer.accelerator.unwrap_model(trainer.model).config
    training = training_summary(
        training_args,
        trainer,
        {
            "image size": f"{config.image_size} px, patch {config.patch_size}",
            "augmentation": f"random crop (padding {run.data_args.crop_padding}) + horizontal flip"
            if run.augment
            else "none",
            "training images": _count(run.source.train),
        },
    )
    return finish_run(
        trainer,
        training_args,
        run.publish_args,
        run.hub,
        task="image-classification",
        processor=run.processor,
        metrics=metrics,
        results=results,
        datasets=run.source.hub_ids,
        dataset_description=run.source.description,
        training=training,
        base_model=run.model_args.model_name_or_path,
        lora=run.lora,
    )


def _count(dataset) -> int | str:
    try:
        return len(dataset)
    except TypeError:  # a stream
        return "streamed"


def train_image(
    model_args: ImageModelArguments,
    data_args: ImageDataArguments,
    training_args,
    publish_args: PublishArguments | None = None,
    callbacks: list | None = None,
    lora: LoraArguments | None = None,
    optim: OptimizerArguments | None = None,
) -> dict[str, Any]:
    """Train an AoT image classifier end to end (see the module docstring) and return its metrics."""
    return run_image_training(
        prepare_image_training(model_args, data_args, training_args, publish_args, callbacks, lora=lora, optim=optim)
    )


def parse_image_arguments(argv: list[str] | None = None):
    """Parse `(ImageModelArguments, ImageDataArguments, PublishArguments, LoraArguments, OptimizerArguments,
    TrainingArguments)`."""
    from .arguments import parse_dataclasses

    return parse_dataclasses(
        (ImageModelArguments, ImageDataArguments, PublishArguments, LoraArguments, OptimizerArguments), argv
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (`aot train image`, `python -m aot_transformers.training.image`)."""
    from .arguments import run_with_clear_errors

    def job():
        model_args, data_args, publish_args, lora, optim, training_args = parse_image_arguments(argv)
        return train_image(model_args, data_args, training_args, publish_args, lora=lora, optim=optim)

    return run_with_clear_errors(job, prog="aot train image")


if __name__ == "__main__":
    sys.exit(main())
