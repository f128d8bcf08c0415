"""Image-classification training of AoT models, or of transformers' ViT of the same size (`--model_type vit`),
with `transformers.Trainer`.

Runs as `aot train image …`, `python -m aot_transformers.training.image …`, and under `torchrun` / `accelerate
launch -m aot_transformers.training.image …`. The image processor is saved with the model, so
`pipeline("image-classification", model=folder, trust_remote_code=True)` works on the result (a ViT needs no remote
code).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._io import arg
from .arguments import ModelArguments, PublishArguments, TrainingSetupError, check_dataset_name, parse_dataclasses
from .lora import LoraArguments
from .optim import OptimizerArguments
from .run import TrainingRun, dataset_length, run_main, run_training
from .run_state import RecordRunTrainerMixin, data_fingerprint
from .vision_data import (
    RAND_AUGMENT_BINS,
    ImageBatchCollator,
    ImageDataArguments,
    RandAugment,
    load_image_source,
    make_image_processor,
    preprocess_images,
)

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset
    from torch.utils.data import DataLoader
    from transformers import EvalPrediction, Trainer, TrainingArguments

logger = logging.getLogger(__name__)

DEFAULT_IMAGE_PRESET = "aot-v-tiny"


@dataclass
class ImageModelArguments(ModelArguments):
    """Which model to train (see `ModelArguments`; default preset aot-v-tiny) and at which image size."""

    image_size: int | None = arg(None, "Side the images are resized to (default: the config's image_size).")


def _augmenting_trainer_class() -> type[Trainer]:
    from transformers import Trainer

    class AugmentingTrainer(RecordRunTrainerMixin, Trainer):
        """`Trainer` whose training batches go through `train_data_collator` (with augmentation) while evaluation
        batches use the plain `data_collator`."""

        train_data_collator = None

        def get_train_dataloader(self) -> DataLoader:
            plain, self.data_collator = self.data_collator, self.train_data_collator or self.data_collator
            try:
                return super().get_train_dataloader()
            finally:
                self.data_collator = plain

    return AugmentingTrainer


def accuracy_metrics() -> Callable[[EvalPrediction], dict[str, float]]:
    """`compute_metrics` for `Trainer`: scikit-learn's `accuracy_score` (what `evaluate`'s accuracy metric runs)."""
    import numpy as np
    from sklearn.metrics import accuracy_score

    def compute(eval_prediction: EvalPrediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        return {"accuracy": float(accuracy_score(eval_prediction.label_ids, np.argmax(logits, axis=-1)))}

    return compute


def prepare_image_training(
    model_args: ImageModelArguments,
    data_args: ImageDataArguments,
    training_args: TrainingArguments,
    *more: Any,
    **options: Any,
) -> TrainingRun:
    """Check every input, load the images, build the model, processor and `Trainer`. Nothing is trained yet.
    `publish_args`, `callbacks`, `lora` and `optim` follow, as in `TrainingRun.begin`."""
    run = TrainingRun.begin("image-classification", "accuracy", model_args, data_args, training_args, *more, **options)
    with run.refusals_undone():  # a refusal leaves the output folder as the run found it
        _prepare_image(run, model_args, data_args, training_args)
    return run


def _prepare_image(
    run: TrainingRun, model_args: ImageModelArguments, data_args: ImageDataArguments, training_args: TrainingArguments
) -> None:
    """The preparation of `prepare_image_training`, once its run has begun."""
    from transformers import AutoModelForImageClassification

    if data_args.augment not in ("auto", "yes", "no"):
        raise TrainingSetupError(f"--augment must be 'auto', 'yes' or 'no', got {data_args.augment!r}.")
    if isinstance(data_args.crop_padding, bool) or data_args.crop_padding < 0:
        raise TrainingSetupError(
            "", argument="--crop_padding", value=data_args.crop_padding, allowed="an integer >= 0 (pixels)"
        )
    rand_augment = _rand_augment(data_args)
    check_dataset_name(
        data_args.dataset_name,
        "an image folder, archive folder, CSV or Hub dataset id; leave it out for scikit-learn's digits",
    )
    # The config first: a bad preset or override fails before any image is read. The classification head may be
    # re-initialised for new classes; every other tensor of a checkpoint must fit the config.
    config = run.build_config(
        AutoModelForImageClassification, DEFAULT_IMAGE_PRESET, ("classifier.",), image_size=model_args.image_size
    )
    data = data_fingerprint(data_args.dataset_name, data_args.validation_dir) + [f"{data_args.dataset_config_name}"]
    if rand_augment is not None and config.num_channels not in (1, 3):
        raise TrainingSetupError(
            f"RandAugment works on grayscale or RGB images; the model has {config.num_channels} channels",
            argument="--rand_augment",
        )
    run.start(config, data, augment=data_args.augment, **_data_settings(data_args))
    with training_args.main_process_first(desc="loading images"):
        run.source = source = load_image_source(data_args, seed=training_args.seed)
    id2label = dict(enumerate(source.class_names))
    old = [config.id2label[i] for i in sorted(config.id2label)]
    reinitialise_head = bool(model_args.model_name_or_path) and old != source.class_names
    if reinitialise_head:
        logger.warning(
            "The checkpoint's classes %s differ from the data's: the classification head is re-initialised.", old[:10]
        )
    config.id2label = id2label
    config.label2id = {name: i for i, name in id2label.items()}
    processor = make_image_processor(config.image_size, config.num_channels)
    augment = data_args.augment == "yes" or (data_args.augment == "auto" and source.kind == "cifar10-archives")

    def prepare(split: Dataset | IterableDataset | None, desc: str) -> Dataset | IterableDataset | None:
        return None if split is None else preprocess_images(split, processor, config.num_channels, desc)

    with training_args.main_process_first(desc="preparing images"):
        train, validation = prepare(source.train, "training images"), prepare(source.validation, "validation images")
    if source.test is not None:
        run.test = lambda: prepare(source.test, "test images")
    augmentations = [f"random crop (padding {data_args.crop_padding}) + horizontal flip"] if augment else []
    if rand_augment is not None:
        augmentations.append(f"RandAugment ({rand_augment.num_ops} ops, magnitude {rand_augment.magnitude})")
    run.summary = {
        "image size": f"{config.image_size} px, patch {config.patch_size}",
        "augmentation": " + ".join(augmentations) or "none",
        "training images": "streamed" if dataset_length(source.train) is None else len(source.train),
    }
    if source.kind != "stream":
        run.summary["split seed"] = data_args.split_seed
    model = run.load_model(config, f", {len(id2label)} classes", ignore_mismatched_sizes=reinitialise_head)
    trainer = run.make_trainer(
        _augmenting_trainer_class(),
        model,
        train,
        validation,
        processor,
        data_collator=ImageBatchCollator(processor, augment=False),
        compute_metrics=accuracy_metrics(),
    )
    trainer.train_data_collator = ImageBatchCollator(
        processor, augment, data_args.crop_padding, rand_augment, seed=training_args.seed
    )


def _rand_augment(data_args: ImageDataArguments) -> RandAugment | None:
    """The `RandAugment` of `--rand_augment` (None when off); a bad number of operations or magnitude is a
    `TrainingSetupError` naming its flag."""
    if not data_args.rand_augment:
        return None
    num_ops, magnitude = data_args.rand_augment_num_ops, data_args.rand_augment_magnitude
    if isinstance(num_ops, bool) or not isinstance(num_ops, int) or num_ops < 0:
        raise TrainingSetupError("", argument="--rand_augment_num_ops", value=num_ops, allowed="an integer >= 0")
    if isinstance(magnitude, bool) or not isinstance(magnitude, int) or not 0 <= magnitude < RAND_AUGMENT_BINS:
        allowed = f"an integer from 0 to {RAND_AUGMENT_BINS - 1}"
        raise TrainingSetupError("", argument="--rand_augment_magnitude", value=magnitude, allowed=allowed)
    return RandAugment(num_ops, magnitude)


def _data_settings(data_args: ImageDataArguments) -> dict[str, Any]:
    """The data settings a resumed run must share with its checkpoint, beyond the data itself: the held-out split
    and RandAugment (left out when off, so that a run that does not use it matches a checkpoint from before it)."""
    settings: dict[str, Any] = {} if data_args.streaming else {"split_seed": data_args.split_seed}
    if data_args.rand_augment:
        settings["rand_augment"] = f"{data_args.rand_augment_num_ops},{data_args.rand_augment_magnitude}"
    return settings


run_image_training = run_training  # train, evaluate (validation, and test when there is one), write, push if asked
IMAGE_ARGUMENTS = (ImageModelArguments, ImageDataArguments, PublishArguments, LoraArguments, OptimizerArguments)


def train_image(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Train an AoT (or ViT) image classifier end to end (see the module docstring) and return its metrics; takes the
    arguments of `prepare_image_training`."""
    return run_training(prepare_image_training(*args, **kwargs))


def parse_image_arguments(argv: list[str] | None = None) -> tuple[Any, ...]:
    """Parse `(ImageModelArguments, ImageDataArguments, PublishArguments, LoraArguments, OptimizerArguments,
    TrainingArguments)`."""
    return parse_dataclasses(IMAGE_ARGUMENTS, argv)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (`aot train image`, `python -m aot_transformers.training.image`)."""
    return run_main(prepare_image_training, IMAGE_ARGUMENTS, argv, prog="aot train image")


if __name__ == "__main__":
    sys.exit(main())
