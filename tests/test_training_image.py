"""Image-classification training: the data sources, clear errors before training, preprocessing equal to the saved
image processor, augmentation, and a trained folder that works with `pipeline(..., trust_remote_code=True)`."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("datasets")
pytest.importorskip("sklearn")

from PIL import Image
from safetensors import safe_open
from transformers import (
    AutoImageProcessor,
    AutoModelForImageClassification,
    EvalPrediction,
    TrainerCallback,
    TrainingArguments,
    ViTForImageClassification,
    pipeline,
)

from aot_transformers.training.arguments import PublishArguments, TrainingSetupError
from aot_transformers.training.image import (
    ImageModelArguments,
    accuracy_metrics,
    prepare_image_training,
    run_image_training,
    train_image,
)
from aot_transformers.training.vision_data import (
    RAND_AUGMENT_OPS,
    ImageBatchCollator,
    ImageDataArguments,
    RandAugment,
    apply_rand_augment_op,
    load_cifar10_archives,
    load_image_source,
    load_pixel_csv,
    load_sklearn_digits,
    make_image_processor,
    preprocess_images,
    rand_augment_magnitude,
    random_crop_flip,
)

TINY = "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,image_size=16,patch_size=4"
COLOURS = {"cat": (220, 40, 40), "dog": (40, 40, 220), "frog": (40, 200, 40)}


def _image(colour, seed: int, size: int = 32) -> Image.Image:
    rng = np.random.default_rng(seed)
    array = np.clip(np.asarray(colour)[None, None, :] + rng.normal(0, 25, (size, size, 3)), 0, 255)
    return Image.fromarray(array.astype(np.uint8))


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory) -> Path:
    """CIFAR-10-style archives: train_<class>.tar.gz holding train/<class>/NNNN.jpg."""
    root = tmp_path_factory.mktemp("cifar")
    for label, colour in COLOURS.items():
        with tarfile.open(root / f"train_{label}.tar.gz", "w:gz") as tar:
            for i in range(24):
                buffer = io.BytesIO()
                _image(colour, i).save(buffer, format="JPEG")
                info = tarfile.TarInfo(f"train/{label}/{i:04d}.jpg")
                info.size = buffer.tell()
                buffer.seek(0)
                tar.addfile(info, buffer)
    return root


@pytest.fixture(scope="module")
def imagefolder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("imagefolder")
    for split, labels in (("train", ["cat", "dog"]), ("val", ["cat", "dog"]), ("val_extra", ["cat", "dog", "frog"])):
        for label in labels:
            folder = root / split / label
            folder.mkdir(parents=True)
            for i in range(6):
                _image(COLOURS[label], i, size=20).save(folder / f"{i}.png")
    return root


def training_args(tmp_path: Path, **overrides) -> TrainingArguments:
    fields = dict(
        output_dir=str(tmp_path / "run"),
        max_steps=3,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        learning_rate=3e-3,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        eval_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    fields.update(overrides)
    return TrainingArguments(**fields)


# --------------------------------------------------------------------------------------------------------------
# data sources
# --------------------------------------------------------------------------------------------------------------


def test_cifar_archives_load_with_sorted_class_names(cifar_dir):
    dataset = load_cifar10_archives(cifar_dir)
    assert dataset.features["label"].names == ["cat", "dog", "frog"]
    assert len(dataset) == 72
    assert dataset[0]["image"].size == (32, 32)
    assert len(load_cifar10_archives(cifar_dir, max_per_class=5)) == 15


def test_pixel_csv_and_digits(tmp_path):
    rows = [",".join(map(str, list(np.full(16, 10 * label)) + [label])) for label in (3, 7, 3, 9)]
    path = tmp_path / "pixels.csv.gz"
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(rows) + "\n")
    dataset = load_pixel_csv(path)
    assert dataset.features["label"].names == ["3", "7", "9"]
    assert dataset[1]["image"].size == (4, 4) and dataset[1]["label"] == 1
    (tmp_path / "bad.csv").write_text("1,2,3,0\n")
    with pytest.raises(TrainingSetupError, match="not a square image"):
        load_pixel_csv(tmp_path / "bad.csv")
    digits = load_sklearn_digits()
    assert len(digits) == 1797 and digits[0]["image"].size == (8, 8)


def test_shared_mnist_and_cifar_files_load(shared_data):
    mnist = load_pixel_csv(shared_data / "vision" / "mnist5k" / "mnist_5k.csv.gz")
    assert len(mnist) == 5000 and len(mnist.features["label"].names) == 10
    assert mnist[0]["image"].size == (28, 28)
    cifar = load_cifar10_archives(shared_data / "vision" / "cifar10", max_per_class=2)
    assert len(cifar) == 20 and "airplane" in cifar.features["label"].names


def test_splits_are_stratified_and_disjoint(cifar_dir):
    source = load_image_source(
        ImageDataArguments(dataset_name=str(cifar_dir), validation_split_percentage=25, test_split_percentage=25)
    )
    assert source.kind == "cifar10-archives" and source.class_names == ["cat", "dog", "frog"]
    assert len(source.train) + len(source.validation) + len(source.test) == 72
    assert sorted(set(source.validation["label"])) == [0, 1, 2]


def _pixels_and_labels(dataset) -> list[tuple[bytes, int]]:
    return [(example["pixel_values"].tobytes(), int(example["labels"])) for example in dataset]


def test_validation_images_do_not_depend_on_the_training_seed(tmp_path, cifar_dir):
    def datasets_of(seed: int, **data):
        run = prepare_image_training(
            ImageModelArguments(config_overrides=TINY),
            ImageDataArguments(dataset_name=str(cifar_dir), test_split_percentage=10, max_train_samples=40, **data),
            training_args(tmp_path, output_dir=str(tmp_path / f"run-{seed}-{data.get('split_seed', 0)}"), seed=seed),
        )
        splits = (run.trainer.train_dataset, run.trainer.eval_dataset, run.test())
        return [sorted(_pixels_and_labels(split)) for split in splits]

    train, validation, test = datasets_of(seed=0)
    assert len(validation) == 6 and len(test) == 7 and len(train) == 40
    assert datasets_of(seed=1) == [train, validation, test]  # the same images, whatever the training seed
    assert datasets_of(seed=0, split_seed=1)[1] != validation  # --split_seed draws another split


@pytest.mark.slow
def test_shared_cifar10_archives_split_into_45000_training_and_5000_validation_images(shared_data):
    source = load_image_source(ImageDataArguments(dataset_name=str(shared_data / "vision" / "cifar10")))
    assert (len(source.train), len(source.validation), source.test) == (45_000, 5_000, None)
    assert np.bincount(source.validation["label"]).tolist() == [500] * 10  # stratified


def test_imagefolder_with_validation_dir(imagefolder):
    source = load_image_source(
        ImageDataArguments(dataset_name=str(imagefolder / "train"), validation_dir=str(imagefolder / "val"))
    )
    assert source.class_names == ["cat", "dog"] and len(source.validation) == 12


# --------------------------------------------------------------------------------------------------------------
# errors before training
# --------------------------------------------------------------------------------------------------------------


def test_unseen_validation_classes_are_a_clear_error(imagefolder):
    with pytest.raises(TrainingSetupError, match=r"label classes the training data does not have: \['frog'\]"):
        load_image_source(
            ImageDataArguments(dataset_name=str(imagefolder / "train"), validation_dir=str(imagefolder / "val_extra"))
        )


def _fake_hub(monkeypatch, splits):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: datasets.DatasetDict(splits))


def test_hub_dataset_without_image_column_is_a_clear_error(monkeypatch):
    import datasets

    _fake_hub(monkeypatch, {"train": datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]})})
    with pytest.raises(TrainingSetupError, match="has no image column"):
        load_image_source(ImageDataArguments(dataset_name="someone/texts"))


def test_hub_dataset_with_unseen_integer_labels_is_a_clear_error(monkeypatch):
    import datasets

    images = [_image(COLOURS["cat"], i, 8) for i in range(4)]
    _fake_hub(
        monkeypatch,
        {
            "train": datasets.Dataset.from_dict({"img": images, "fine_label": [0, 1, 0, 1]}),
            "validation": datasets.Dataset.from_dict({"img": images[:2], "fine_label": [1, 5]}),
        },
    )
    with pytest.raises(TrainingSetupError, match=r"does not have: \['5'\]"):
        load_image_source(ImageDataArguments(dataset_name="someone/images", label_column="fine_label"))
    with pytest.raises(TrainingSetupError, match="no label column 'label'"):
        load_image_source(ImageDataArguments(dataset_name="someone/images"))


@pytest.mark.parametrize(
    "model_args, data_args, message",
    [
        (dict(preset="aot-v-nonsense"), dict(), "Unknown preset"),
        (dict(config_overrides="image_size=30,patch_size=4"), dict(), "image_size"),
        (dict(), dict(dataset_name="./no/such/folder"), "no such file or folder"),
        (dict(), dict(dataset_name="IMAGEFOLDER", image_column="photo"), "no image column 'photo'"),
        (dict(), dict(augment="maybe"), "--augment"),
        (dict(), dict(rand_augment=True, rand_augment_magnitude=31), "--rand_augment_magnitude 31"),
        (dict(), dict(rand_augment=True, rand_augment_num_ops=-1), "--rand_augment_num_ops -1"),
        (dict(model_type="gpt2"), dict(), "--model_type 'gpt2'"),
    ],
)
def test_bad_input_fails_before_training(tmp_path, imagefolder, model_args, data_args, message):
    if data_args.get("dataset_name") == "IMAGEFOLDER":
        data_args["dataset_name"] = str(imagefolder / "train")
    with pytest.raises(TrainingSetupError, match=message):
        prepare_image_training(
            ImageModelArguments(**model_args), ImageDataArguments(**data_args), training_args(tmp_path)
        )
    assert not (tmp_path / "run" / "model").exists()


# --------------------------------------------------------------------------------------------------------------
# preprocessing, augmentation, metric
# --------------------------------------------------------------------------------------------------------------


def test_batches_match_the_saved_image_processor(cifar_dir):
    dataset = load_cifar10_archives(cifar_dir, max_per_class=3)
    processor = make_image_processor(16, 3)
    prepared = preprocess_images(dataset, processor, 3)
    batch = ImageBatchCollator(processor)([prepared[i] for i in range(len(prepared))])
    expected = processor([example["image"] for example in dataset], return_tensors="pt")["pixel_values"]
    assert batch["pixel_values"].shape == (9, 3, 16, 16)
    torch.testing.assert_close(batch["pixel_values"], expected, atol=1e-5, rtol=0)
    assert batch["labels"].tolist() == dataset["label"]


def test_random_crop_flip():
    torch.manual_seed(0)
    images = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
    out = random_crop_flip(images, padding=0)
    for original, augmented in zip(images, out, strict=True):
        assert torch.equal(augmented, original) or torch.equal(augmented, original.flip(-1))
    padded = random_crop_flip(images, padding=2)
    assert padded.shape == images.shape
    assert (padded == 0).any()  # some crops reach into the zero padding


def _pattern_image() -> Image.Image:
    """A 32×32 RGB image with structure in both directions and every channel (no random generator involved)."""
    y, x, c = np.meshgrid(np.arange(32), np.arange(32), np.arange(3), indexing="ij")
    return Image.fromarray(((x * 7 + y * 13 + c * 50 + (x * y) % 17) % 256).astype(np.uint8))


# Pixel sums of `_pattern_image()` after each operation at magnitude 9 (positive sign, then negative), and after
# `RandAugment()` seeded with torch.manual_seed(0 … 4), computed with torchvision 0.28's `RandAugment` and `_apply_op`
# (torchvision.transforms.autoaugment) on the same image.
TORCHVISION_SUMS = {
    "Identity": (392795,),
    "ShearX": (374886, 376018),
    "ShearY": (373814, 377544),
    "TranslateX": (346173, 343751),
    "TranslateY": (346429, 341447),
    "Rotate": (367128, 369432),
    "Brightness": (474226, 285198),
    "Color": (392335, 392124),
    "Contrast": (391522, 391366),
    "Sharpness": (391875, 391638),
    "Posterize": (391256,),
    "Solarize": (223719,),
    "AutoContrast": (392795,),
    "Equalize": (391670,),
}
TORCHVISION_SEEDED_SUMS = [341026, 345815, 212282, 391256, 284091]


def test_rand_augment_operations_match_torchvision():
    image = _pattern_image()
    assert tuple(TORCHVISION_SUMS) == RAND_AUGMENT_OPS  # the order in which operations are drawn
    for op, expected in TORCHVISION_SUMS.items():
        magnitude, signed = rand_augment_magnitude(op, 9, 32, 32)
        signs = (1, -1) if signed else (1,)
        sums = tuple(int(np.asarray(apply_rand_augment_op(image, op, s * magnitude), np.int64).sum()) for s in signs)
        assert sums == expected, op
    seeded = []
    for seed in range(5):
        torch.manual_seed(seed)
        seeded.append(int(np.asarray(RandAugment()(image), np.int64).sum()))
    assert seeded == TORCHVISION_SEEDED_SUMS


def test_rand_augment_at_magnitude_zero_leaves_images_unchanged():
    image = _pattern_image()
    image = Image.fromarray(np.minimum(np.asarray(image), 254))  # Solarize at magnitude 0 inverts only 255
    for op in set(RAND_AUGMENT_OPS) - {"AutoContrast", "Equalize"}:  # these two have no magnitude
        unchanged = apply_rand_augment_op(image, op, rand_augment_magnitude(op, 0, 32, 32)[0])
        assert np.array_equal(np.asarray(unchanged), np.asarray(image)), op
    shift, _ = rand_augment_magnitude("TranslateX", 9, 32, 32)  # 150/331 of the width at 9/30: 4.35 -> 4 pixels
    moved = np.asarray(apply_rand_augment_op(image, "TranslateX", shift))
    assert np.array_equal(moved[:, 4:], np.asarray(image)[:, :-4]) and not moved[:, :4].any()


def test_rand_augment_is_seeded_changes_images_and_keeps_shape_and_dtype(cifar_dir):
    processor = make_image_processor(16, 3)
    prepared = preprocess_images(load_cifar10_archives(cifar_dir, max_per_class=4), processor, 3)
    pixels = torch.as_tensor(np.stack([example["pixel_values"] for example in prepared]), dtype=torch.uint8)

    def augmented(seed: int):
        torch.manual_seed(seed)
        return RandAugment(num_ops=2, magnitude=9).augment_batch(pixels)

    first = augmented(0)
    assert first.shape == pixels.shape and first.dtype == torch.uint8
    assert torch.equal(augmented(0), first) and not torch.equal(augmented(1), first)
    assert sum(not torch.equal(a, p) for a, p in zip(first, pixels, strict=True)) >= 9
    grey = pixels[:, :1]  # (12, 1, 16, 16)
    torch.manual_seed(0)
    assert RandAugment().augment_batch(grey).shape == grey.shape
    with pytest.raises(ValueError, match="magnitude must be an integer from 0 to 30, got 31"):
        RandAugment(magnitude=31)


def test_rand_augment_applies_to_training_batches_only(tmp_path, cifar_dir):
    run = prepare_image_training(
        ImageModelArguments(config_overrides=TINY),
        ImageDataArguments(dataset_name=str(cifar_dir), augment="no", rand_augment=True),
        training_args(tmp_path),
    )
    trainer = run.trainer
    plain = ImageBatchCollator(run.processor)
    evaluation = next(iter(trainer.get_eval_dataloader()))["pixel_values"]
    expected = plain([trainer.eval_dataset[i] for i in range(len(evaluation))])["pixel_values"]
    torch.testing.assert_close(evaluation, expected, atol=0, rtol=0)
    unaugmented = {image.numpy().tobytes() for image in plain(list(trainer.train_dataset))["pixel_values"]}
    training = next(iter(trainer.get_train_dataloader()))["pixel_values"]
    assert sum(image.numpy().tobytes() not in unaugmented for image in training) >= len(training) // 2
    assert run.summary["augmentation"] == "RandAugment (2 ops, magnitude 9)"


def test_accuracy_of_logits():
    logits = np.eye(3)[[0, 1, 2, 2]]
    prediction = EvalPrediction(predictions=(logits,), label_ids=np.array([0, 1, 1, 2]))
    assert accuracy_metrics()(prediction) == {"accuracy": 0.75}


# --------------------------------------------------------------------------------------------------------------
# training end to end
# --------------------------------------------------------------------------------------------------------------


def test_train_and_classify_with_pipeline(tmp_path, cifar_dir):
    metrics = train_image(
        ImageModelArguments(config_overrides=TINY),
        ImageDataArguments(dataset_name=str(cifar_dir), validation_split_percentage=20, test_split_percentage=20),
        training_args(tmp_path, max_steps=25, eval_strategy="steps", eval_steps=25),
        PublishArguments(model_name="tiny-colours"),
    )
    final = tmp_path / "run" / "model"
    names = {p.name for p in final.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
        "README.md",
        "training_curves.png",
    } <= names
    assert metrics["eval_accuracy"] > 0.6 and "test_accuracy" in metrics  # colours are easy
    card = (final / "README.md").read_text()
    assert "image-classification" in card and "random crop" in card  # CIFAR-10 archives: augmentation on
    processor = AutoImageProcessor.from_pretrained(final)
    assert processor.size == {"height": 16, "width": 16}
    classifier = pipeline("image-classification", model=str(final), trust_remote_code=True)
    prediction = classifier(_image(COLOURS["dog"], 99, size=40))  # any size: the processor resizes
    assert {p["label"] for p in prediction} <= {"cat", "dog", "frog"}


def test_fine_tune_on_new_classes_replaces_the_head(tmp_path, cifar_dir, imagefolder):
    train_image(
        ImageModelArguments(config_overrides=TINY),
        ImageDataArguments(dataset_name=str(cifar_dir)),
        training_args(tmp_path, max_steps=2),
    )
    run = prepare_image_training(
        ImageModelArguments(model_name_or_path=str(tmp_path / "run" / "model")),
        ImageDataArguments(dataset_name=str(imagefolder / "train"), validation_split_percentage=0),
        training_args(tmp_path, output_dir=str(tmp_path / "finetune"), max_steps=1),
    )
    assert run.trainer.model.config.id2label == {0: "cat", 1: "dog"}
    assert run.trainer.model.classifier.out_features == 2


def test_vit_baseline_trains_and_reloads_with_auto_classes(tmp_path, cifar_dir):
    run = prepare_image_training(
        ImageModelArguments(model_type="vit", config_overrides=TINY),
        ImageDataArguments(dataset_name=str(cifar_dir), validation_split_percentage=20, rand_augment=True),
        training_args(tmp_path, max_steps=3),
        PublishArguments(model_name="tiny-vit"),
    )
    metrics = run_image_training(run)
    final = tmp_path / "run" / "model"
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "README.md", "results.json"} <= {
        p.name for p in final.iterdir()
    }
    assert not list(final.glob("*.py"))  # transformers' own model: no remote code
    reloaded = AutoModelForImageClassification.from_pretrained(final).eval()
    assert isinstance(reloaded, ViTForImageClassification)
    sizes = ("hidden_size", "num_hidden_layers", "num_attention_heads", "image_size", "patch_size")
    assert {name: getattr(reloaded.config, name) for name in sizes} == dict(zip(sizes, (32, 2, 4, 16, 4), strict=True))
    assert reloaded.config.id2label == {0: "cat", 1: "dog", 2: "frog"}
    batch = ImageBatchCollator(run.processor)([run.trainer.eval_dataset[i] for i in range(8)])
    trained = run.trainer.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(pixel_values=batch["pixel_values"]).logits,
            trained(pixel_values=batch["pixel_values"]).logits,
            atol=0,
            rtol=0,
        )
    results = json.loads((final / "results.json").read_text())
    assert results["results"]["validation"]["accuracy"] == metrics["eval_accuracy"]
    assert results["settings"]["augmentation"].endswith("+ RandAugment (2 ops, magnitude 9)")
    classifier = pipeline("image-classification", model=str(final))  # no trust_remote_code needed
    assert {p["label"] for p in classifier(_image(COLOURS["dog"], 99, size=40))} <= {"cat", "dog", "frog"}


def test_a_resumed_augmented_run_repeats_the_uninterrupted_one(tmp_path, cifar_dir):
    """Crop, flip and RandAugment draw from a generator keyed by the seed and the batch, not from the global one
    (which a checkpoint saves a batch ahead of the data): resumed at step 2, steps 3 and 4 give the same losses."""

    def losses(resume: str | None = None) -> list[float]:
        run = prepare_image_training(
            ImageModelArguments(config_overrides=TINY),
            ImageDataArguments(dataset_name=str(cifar_dir), validation_split_percentage=20, rand_augment=True),
            training_args(tmp_path, max_steps=4, save_strategy="steps", save_steps=2, logging_steps=1,
                          resume_from_checkpoint=resume),
            PublishArguments(model_name="tiny-aot"),
        )  # fmt: skip
        assert run.summary["augmentation"].startswith("random crop") and "RandAugment" in run.summary["augmentation"]
        run_image_training(run)
        return [entry["loss"] for entry in run.trainer.state.log_history if "loss" in entry]

    uninterrupted = losses()
    shutil.rmtree(tmp_path / "run" / "checkpoint-4")
    shutil.rmtree(tmp_path / "run" / "model")
    resumed = losses(resume=str(tmp_path / "run" / "checkpoint-2"))
    assert len(uninterrupted) == 4 and resumed == uninterrupted


def test_resumed_vit_starts_from_its_checkpoints_weights(tmp_path, cifar_dir):
    """transformers' ViT saves its layers under other names than its modules' (`vit.encoder.layer.0` on disk,
    `vit.layers.0` in memory); a resume must rename them, not restart those layers from a fresh initialisation."""

    def prepare(resume: str | None = None):
        return prepare_image_training(
            ImageModelArguments(model_type="vit", config_overrides=TINY),
            ImageDataArguments(dataset_name=str(cifar_dir), validation_split_percentage=20),
            training_args(tmp_path, max_steps=4, save_strategy="steps", save_steps=2, resume_from_checkpoint=resume),
            PublishArguments(model_name="tiny-vit"),
        )

    run_image_training(prepare())
    checkpoint = tmp_path / "run" / "checkpoint-2"
    with safe_open(checkpoint / "model.safetensors", "pt") as saved_file:
        assert any(name.startswith("vit.encoder.layer.0.") for name in saved_file.keys())
    saved = ViTForImageClassification.from_pretrained(checkpoint).state_dict()
    shutil.rmtree(tmp_path / "run" / "checkpoint-4")
    shutil.rmtree(tmp_path / "run" / "model")

    class FirstWeights(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.weights = {name: value.detach().clone() for name, value in model.state_dict().items()}

    resumed = prepare(resume=str(checkpoint))
    first = FirstWeights()
    resumed.trainer.add_callback(first)
    run_image_training(resumed)
    assert first.weights.keys() == saved.keys()
    for name, value in saved.items():
        torch.testing.assert_close(first.weights[name], value, rtol=0, atol=0, msg=name)
