"""Image data for classification: Hub datasets, `imagefolder` directories, the CIFAR-10 `train_<class>.tar.gz`
archives and MNIST-style pixel CSVs of `../shared/data/vision`, and scikit-learn's digits; plus the image
processor, the light augmentation (random crop with padding, horizontal flip) used for CIFAR-10, and RandAugment."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import math
import re
import tarfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import arg, is_hub_id
from .arguments import TrainingSetupError, load_hub_dataset

if TYPE_CHECKING:
    import torch
    from datasets import Dataset, IterableDataset
    from PIL import Image
    from transformers import BaseImageProcessor, ViTImageProcessorPil

SKLEARN_DIGITS = "sklearn-digits"
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
_CIFAR_ARCHIVE = re.compile(r"^train_(?P<label>[^.]+)\.tar\.gz$")
RAND_AUGMENT_BINS = 31  # torchvision's `num_magnitude_bins`


@dataclass
class ImageDataArguments:
    """Where the images come from and how they are prepared."""

    dataset_name: str | None = arg(
        None,
        "A Hub dataset id; an imagefolder directory (<root>/<class>/<image>); a folder of CIFAR-10 "
        "train_<class>.tar.gz archives; an MNIST-style CSV (.csv or .csv.gz: pixels, then the label); or "
        f"'{SKLEARN_DIGITS}' (no download). Default: {SKLEARN_DIGITS}.",
    )
    dataset_config_name: str | None = arg(None, "Config name of a Hub dataset.")
    validation_dir: str | None = arg(None, "A separate imagefolder directory for validation.")
    image_column: str | None = arg(None, "Column holding the images (default: 'image', 'img' or the only image one).")
    label_column: str = arg("label", "Column holding the class labels.")
    train_split: str = arg("train", "Split of a Hub dataset to train on.")
    validation_split: str = arg("validation", "Validation split of a Hub dataset.")
    validation_split_percentage: float = arg(
        10.0, "Share of the training images held out for validation (stratified)."
    )
    test_split_percentage: float = arg(0.0, "Share of the training images held out as a test set (stratified).")
    split_seed: int = arg(
        0,
        "Seed of the held-out validation and test images and of the --max_train_samples/--max_eval_samples subsets; "
        "independent of --seed, so that runs of different seeds are evaluated on the same images (CIFAR-10: "
        "45,000 / 5,000 with the default 10%).",
    )
    augment: str = arg("auto", "Random crop with padding + horizontal flip: 'yes', 'no' or 'auto' (on for CIFAR-10).")
    crop_padding: int = arg(4, "Padding of the random crop, in pixels.")
    rand_augment: bool = arg(
        False, "RandAugment (https://arxiv.org/abs/1909.13719) on training images, after the crop and flip."
    )
    rand_augment_num_ops: int = arg(2, "Number of RandAugment operations applied to each image.")
    rand_augment_magnitude: int = arg(9, f"Magnitude of the RandAugment operations, 0 to {RAND_AUGMENT_BINS - 1}.")
    max_train_samples: int | None = arg(None, "Use at most this many training images.")
    max_eval_samples: int | None = arg(None, "Use at most this many validation images.")
    streaming: bool = arg(
        False,
        "Stream a Hub dataset or a local imagefolder instead of loading it (ImageNet-scale data); needs "
        "--max_steps. Images are decoded batch by batch; validation comes from --validation_split.",
    )
    num_labels: int | None = arg(
        None, "Number of classes of a streamed dataset whose label column is a plain integer."
    )
    shuffle_buffer_size: int = arg(10_000, "Shuffle buffer of a streamed training set (examples).")


@dataclass
class ImageSource:
    """Splits with an `image` and an integer `label` column, class names, and a description for the card."""

    train: Any
    validation: Any
    test: Any
    class_names: list[str]
    description: str
    hub_ids: list[str]
    kind: str  # "hub", "imagefolder", "cifar10-archives", "pixel-csv", "sklearn-digits"
    name: str = "custom"  # the dataset's name in the model card's model-index


def _class_label_dataset(images: list, labels: list[int], class_names: list[str]) -> Dataset:
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=class_names)})
    return datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)


def load_cifar10_archives(folder: str | Path, max_per_class: int | None = None) -> Dataset:
    """The CIFAR-10 images of the `train_<class>.tar.gz` archives in `folder` (`train/<class>/NNNN.jpg`), read
    without unpacking to disk, at most `max_per_class` of each class (in name order). Classes are sorted by name;
    images keep their encoded JPEG bytes and decode on access."""
    folder = Path(folder)
    archives = sorted(p for p in folder.iterdir() if _CIFAR_ARCHIVE.match(p.name))
    class_names = [_CIFAR_ARCHIVE.match(p.name).group("label") for p in archives]
    images, labels = [], []
    for index, archive in enumerate(archives):
        try:
            with tarfile.open(archive, "r:gz") as tar:
                members = sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name)
                members = [m for m in members if Path(m.name).suffix.lower() in IMAGE_SUFFIXES][:max_per_class]
                for member in members:
                    images.append({"bytes": tar.extractfile(member).read(), "path": f"{archive}/{member.name}"})
                    labels.append(index)
        except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
            raise TrainingSetupError(
                f"{archive} is not a readable .tar.gz archive ({type(error).__name__}: {error}); it may be truncated: "
                "download it again."
            ) from None
    return _class_label_dataset(images, labels, class_names)


def load_pixel_csv(path: str | Path) -> Dataset:
    """An MNIST-style CSV (optionally gzipped): each row holds the pixels of a square grayscale image (0..255),
    then the integer label. A header row is skipped."""
    import numpy as np
    from PIL import Image

    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", newline="", encoding="utf-8") as handle:
            rows = [(number, row) for number, row in enumerate(csv.reader(handle), start=1) if row]
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as error:
        raise TrainingSetupError(f"{path} cannot be read as a UTF-8 CSV ({type(error).__name__}: {error}).") from None
    if rows and not rows[0][1][0].strip().lstrip("-").replace(".", "").isdigit():
        rows = rows[1:]
    if not rows:
        raise TrainingSetupError(f"{path} has no data rows.")
    width = len(rows[0][1])
    pixels = np.empty((len(rows), width - 1), dtype=np.float32)
    labels = np.empty(len(rows), dtype=np.int64)
    for i, (number, row) in enumerate(rows):
        if len(row) != width:
            raise TrainingSetupError(f"{path} line {number} has {len(row)} columns; the first row has {width}.")
        try:
            values = np.asarray(row, dtype=np.float64)
        except ValueError:
            for value in row:  # name the first value that is not a number
                try:
                    float(value)
                except ValueError:
                    raise TrainingSetupError(f"{path} line {number}: {value!r} is not a number.") from None
            raise  # every value parses on its own: numpy's own error
        outside = values[:-1][~((values[:-1] >= 0) & (values[:-1] <= 255))]  # NaN is outside too
        if outside.size or not np.isfinite(values[-1]):
            raise TrainingSetupError(
                f"{path} line {number}: pixel values must be finite numbers in [0, 255], found {outside[:3].tolist()}."
            )
        if not float(values[-1]).is_integer():
            raise TrainingSetupError(f"{path} line {number}: the label (last column) {row[-1]!r} is not an integer.")
        pixels[i], labels[i] = values[:-1], int(values[-1])
    side = int(round(math.sqrt(pixels.shape[1])))
    if side * side != pixels.shape[1]:
        raise TrainingSetupError(
            f"{path}: {pixels.shape[1]} pixel columns is not a square image; expected side² pixels then the label."
        )
    images = [Image.fromarray(p.reshape(side, side).clip(0, 255).astype(np.uint8), mode="L") for p in pixels]
    class_values, index = np.unique(labels, return_inverse=True)
    return _class_label_dataset(images, index.tolist(), [str(v) for v in class_values.tolist()])


def load_sklearn_digits() -> Dataset:
    """scikit-learn's 1,797 8×8 handwritten digits (shipped with scikit-learn) as grayscale images."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = [Image.fromarray((image * 255.0 / 16.0).round().astype(np.uint8), mode="L") for image in digits.images]
    return _class_label_dataset(images, digits.target.tolist(), [str(i) for i in range(10)])


def _image_and_label(
    dataset: Dataset | IterableDataset, args: ImageDataArguments, where: str
) -> Dataset | IterableDataset:
    """`dataset` with only its image column (`--image_column`, else `image`, `img` or the only `Image` feature) as an
    `Image` feature named `image`, and its `--label_column` named `label`."""
    import datasets

    names, label_column = list(dataset.column_names), args.label_column
    image_columns = [n for n, f in dataset.features.items() if isinstance(f, datasets.Image)]
    image_column = args.image_column or next((n for n in ("image", "img") if n in names), None)
    if image_column is None and len(image_columns) == 1:
        image_column = image_columns[0]
    if image_column is None:
        raise TrainingSetupError(f"{where} has no image column (columns: {names}); name it with --image_column.")
    if image_column not in names:
        raise TrainingSetupError(f"{where} has no image column {image_column!r} (columns: {names}).")
    if label_column not in names:
        raise TrainingSetupError(
            f"{where} has no label column {label_column!r} (columns: {names}); use --label_column."
        )
    dataset = dataset.select_columns([image_column, label_column])
    dataset = dataset.rename_columns({k: v for k, v in ((image_column, "image"), (label_column, "label")) if k != v})
    if not isinstance(dataset.features["image"], datasets.Image):
        dataset = dataset.cast_column("image", datasets.Image())
    return dataset


def class_names_of(dataset: Dataset | IterableDataset) -> list[str] | None:
    import datasets

    feature = dataset.features["label"]
    return list(feature.names) if isinstance(feature, datasets.ClassLabel) else None


def align_labels(train_names: list[str], other: Dataset, where: str) -> Dataset:
    """`other` with its labels expressed in the training classes `train_names`. Raises `TrainingSetupError` naming
    any class of `other` that the training data never shows (the model could not have learned it)."""
    import datasets

    other_names = class_names_of(other)

    def name_of(value: Any) -> str:
        return str(value) if other_names is None else other_names[value]

    unseen = sorted({name_of(value) for value in other.unique("label")} - set(train_names))
    if unseen:
        raise TrainingSetupError(
            f"{where} has label classes the training data does not have: {unseen[:20]}"
            f"{' …' if len(unseen) > 20 else ''} (training classes: {train_names[:20]})."
        )
    index = {name: i for i, name in enumerate(train_names)}
    features = other.features.copy()
    features["label"] = datasets.ClassLabel(names=train_names)
    return other.map(
        lambda batch: {"label": [index[name_of(value)] for value in batch["label"]]}, batched=True, features=features
    )


def load_image_source(args: ImageDataArguments, seed: int = 42) -> ImageSource:
    """Load the image splits described by `args`; every column and label problem raises `TrainingSetupError`.

    The validation and test images held out of the training images, and the `--max_*_samples` subsets, are drawn
    with `args.split_seed`: the training `seed` only orders a streamed training set, so runs that differ in their
    seed see the same training images and are evaluated on the same validation images."""
    if args.streaming:
        return load_streamed_image_source(args, seed)

    name = args.dataset_name or SKLEARN_DIGITS
    hub_ids: list[str] = []
    validation = test = None
    path = Path(name).expanduser()
    if name == SKLEARN_DIGITS:
        train, kind, description = load_sklearn_digits(), "sklearn-digits", "scikit-learn's 8×8 digits"
    elif path.is_dir() and any(_CIFAR_ARCHIVE.match(p.name) for p in path.iterdir()):
        train, kind = load_cifar10_archives(path), "cifar10-archives"
        description = f"CIFAR-10 training images ({path.name}: train_<class>.tar.gz)"
    elif path.is_file() and name.endswith((".csv", ".csv.gz")):
        train, kind, description = load_pixel_csv(path), "pixel-csv", f"pixel CSV {path.name}"
    elif path.is_dir():
        train, kind, description = _load_imagefolder(path, "training"), "imagefolder", f"image folder {path.name}"
    elif not is_hub_id(name) or path.suffix:
        raise TrainingSetupError(f"Image data: no such file or folder: {name}.")
    else:
        loaded = load_hub_dataset(name, args, "images pass a folder or file that exists")
        train, kind, description = loaded[args.train_split], "hub", f"[{name}](https://huggingface.co/datasets/{name})"
        hub_ids = [name]
    train = _image_and_label(train, args, f"Dataset {name!r}" if hub_ids else description)
    if hub_ids and args.validation_split in loaded and not args.validation_dir:
        validation = _image_and_label(loaded[args.validation_split], args, f"Split {args.validation_split!r}")
    if hub_ids and "test" in loaded and args.train_split != "test" and args.validation_split != "test":
        test = _image_and_label(loaded["test"], args, "Split 'test'")
    if class_names_of(train) is None:
        train = train.class_encode_column("label")
    if len(train) == 0:
        raise TrainingSetupError(f"{description} has no images.")
    if args.validation_dir:
        validation = _load_imagefolder(Path(args.validation_dir), "validation")
        validation = _image_and_label(validation, args, "validation data")
    for share, split_name in ((args.test_split_percentage, "test"), (args.validation_split_percentage, "validation")):
        if not 0 <= share < 100:
            raise TrainingSetupError(f"--{split_name}_split_percentage must be in [0, 100), got {share}.")
    if test is None and args.test_split_percentage > 0:
        train, test = _stratified_split(train, args.test_split_percentage, args.split_seed + 1)
    if validation is None and args.validation_split_percentage > 0:
        train, validation = _stratified_split(train, args.validation_split_percentage, args.split_seed)
    class_names = class_names_of(train)
    if validation is not None:
        validation = align_labels(class_names, validation, "The validation data")
    if test is not None:
        test = align_labels(class_names, test, "The test data")
    if args.max_train_samples is not None:
        train = train.shuffle(seed=args.split_seed).select(range(min(len(train), args.max_train_samples)))
    if validation is not None and args.max_eval_samples is not None:
        validation = validation.shuffle(seed=args.split_seed)
        validation = validation.select(range(min(len(validation), args.max_eval_samples)))
    label = hub_ids[0] if hub_ids else SKLEARN_DIGITS if kind == "sklearn-digits" else path.name
    return ImageSource(train, validation, test, class_names, description, hub_ids, kind, label)


def load_streamed_image_source(args: ImageDataArguments, seed: int = 42) -> ImageSource:
    """The image splits of `args` as `datasets.IterableDataset`s: a Hub dataset or a local imagefolder, read as it
    is consumed (nothing is downloaded or decoded ahead). Class names come from the label column's `ClassLabel`, or
    `--num_labels` for a plain integer column (e.g. the `cls` field of webdataset shards). No split is carved out of
    a stream: validation is the dataset's `--validation_split` (or `--validation_dir`), capped by
    `--max_eval_samples`."""
    import datasets

    name = args.dataset_name
    if not name:
        raise TrainingSetupError("a stream needs a Hub dataset or an imagefolder", argument="--streaming")
    path = Path(name).expanduser()
    local = path.is_dir()
    if not local and (not is_hub_id(name) or path.suffix):
        raise TrainingSetupError(f"Image data: no such file or folder: {name}.")
    builder = ("imagefolder", None) if local else (name, args.dataset_config_name)
    try:
        loaded = datasets.load_dataset(*builder, data_dir=str(path) if local else None, streaming=True)
    except Exception as error:
        raise TrainingSetupError(
            f"Could not stream {name!r}: {type(error).__name__}: {error}", argument="--dataset_name", value=name
        ) from error
    if args.train_split not in loaded:
        raise TrainingSetupError(f"Dataset {name!r} has no split {args.train_split!r} (splits: {list(loaded)}).")
    where = f"Dataset {name!r}"

    # webdataset and json streams: the columns are known after one example
    def resolved(split: IterableDataset) -> IterableDataset:
        return split._resolve_features() if split.features is None else split

    train = _image_and_label(resolved(loaded[args.train_split]), args, where)
    class_names = class_names_of(train)
    if class_names is None:
        if not args.num_labels or args.num_labels < 2:
            raise TrainingSetupError(
                f"{where}'s label column {args.label_column!r} has no class names",
                argument="--num_labels",
                value=args.num_labels,
                allowed="the number of classes (>= 2)",
            )
        class_names = [str(i) for i in range(args.num_labels)]
        train = train.cast_column("label", datasets.ClassLabel(names=class_names))
    validation = None
    if args.validation_dir:
        validation = datasets.load_dataset("imagefolder", data_dir=args.validation_dir, streaming=True)["train"]
    elif args.validation_split in loaded and args.validation_split != args.train_split:
        validation = loaded[args.validation_split]
    if validation is not None:
        validation = _image_and_label(resolved(validation), args, "validation data")
        if class_names_of(validation) is None:
            validation = validation.cast_column("label", datasets.ClassLabel(names=class_names))
        validation = validation.take(args.max_eval_samples or 10_000)
    train = train.shuffle(seed=seed, buffer_size=args.shuffle_buffer_size)
    if args.max_train_samples is not None:
        train = train.take(args.max_train_samples)
    description = f"image folder {path.name}" if local else f"[{name}](https://huggingface.co/datasets/{name})"
    hub_ids, label = ([], path.name) if local else ([name], name)
    return ImageSource(train, validation, None, class_names, f"{description} (streamed)", hub_ids, "stream", label)


def _load_imagefolder(path: Path, what: str) -> Dataset:
    import datasets

    if not path.is_dir():
        raise TrainingSetupError(f"{what} images: no such folder: {path}.")
    if not any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.rglob("*")):
        raise TrainingSetupError(f"{what} images: {path} holds no image files ({sorted(IMAGE_SUFFIXES)}).")
    return datasets.load_dataset("imagefolder", data_dir=str(path), split="train")


def _stratified_split(dataset: Dataset, percentage: float, seed: int) -> tuple[Dataset, Dataset]:
    count = max(1, int(round(len(dataset) * percentage / 100)))
    try:
        parts = dataset.train_test_split(test_size=count, seed=seed, stratify_by_column="label")
    except ValueError:  # a class too small to stratify
        parts = dataset.train_test_split(test_size=count, seed=seed)
    return parts["train"], parts["test"]


# Image processor, transforms and augmentation


def make_image_processor(image_size: int, num_channels: int) -> ViTImageProcessorPil:
    """A ViT image processor resizing to the model's `image_size` (saved with the model, used by `pipeline`)."""
    from transformers import ViTImageProcessorPil  # the PIL backend: torchvision does not install beside this torch

    return ViTImageProcessorPil(
        do_resize=True,
        size={"height": image_size, "width": image_size},
        image_mean=[0.5] * num_channels,
        image_std=[0.5] * num_channels,
        do_convert_rgb=num_channels == 3,
    )


def preprocess_images(
    dataset: Dataset | IterableDataset, processor: BaseImageProcessor, num_channels: int, desc: str = "images"
) -> Dataset | IterableDataset:
    """Decode, convert and resize every image once with `processor` (no rescaling or normalisation), keeping
    `pixel_values` as uint8 (C, S, S) beside `labels`: batches are then assembled without touching an image file,
    and normalisation plus augmentation happen per batch in `ImageBatchCollator`. The dataset is returned in numpy
    format, so that rows come out as arrays rather than nested lists (much faster to fetch and collate)."""
    import datasets
    import numpy as np

    size = processor.size["height"]
    mode = "RGB" if num_channels == 3 else "L" if num_channels == 1 else None
    pixels = datasets.Array3D((num_channels, size, size), "uint8")
    features = datasets.Features({"pixel_values": pixels, "labels": dataset.features["label"]})
    streamed = isinstance(dataset, datasets.IterableDataset)
    image_feature = (getattr(dataset, "features", None) or {}).get("image")
    if isinstance(image_feature, datasets.Image) and image_feature.decode:
        # Decoded in `_open`, so that a corrupt file is named in a one-line error, not a traceback from `datasets`.
        dataset = dataset.cast_column("image", datasets.Image(decode=False))

    def convert(batch: Mapping[str, list[Any]]) -> dict[str, Any]:
        images = [_open(image, mode) for image in batch["image"]]
        resized = processor(images, do_rescale=False, do_normalize=False, return_tensors="np")["pixel_values"]
        if resized.shape[1:] != (num_channels, size, size):
            raise TrainingSetupError(
                f"Images became {tuple(resized.shape[1:])} arrays, but the model wants ({num_channels}, {size}, "
                f"{size}); check --config_overrides num_channels."
            )
        return {"pixel_values": np.clip(np.rint(resized), 0, 255).astype(np.uint8), "labels": batch["label"]}

    # A stream is decoded batch by batch as training consumes it (no progress bar, no column names to read).
    columns, progress = (["image", "label"], {}) if streamed else (dataset.column_names, {"desc": f"Preparing {desc}"})
    return dataset.map(
        convert, batched=True, batch_size=256, remove_columns=columns, features=features, **progress
    ).with_format("numpy")


def _open(image: Image.Image | dict[str, Any], mode: str | None) -> Image.Image:
    if isinstance(image, dict):  # undecoded {"bytes", "path"}
        from PIL import Image, UnidentifiedImageError

        try:
            image = Image.open(io.BytesIO(image["bytes"]) if image.get("bytes") else image["path"])
            image.load()
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
            where = image.get("path") or "an image given as bytes"
            raise TrainingSetupError(f"{where} is not a readable image ({type(error).__name__}: {error}).") from None
    if mode is not None and getattr(image, "mode", mode) != mode:
        image = image.convert(mode)
    return image


def random_crop_flip(
    pixel_values: torch.Tensor, padding: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Per image: pad by `padding` with zeros (the normalised mean), crop back at a random offset, and flip
    horizontally with probability 1/2 — the standard CIFAR-10 augmentation, on a (B, C, S, S) batch; the draws come
    from `generator` (torch's global one by default)."""
    import torch
    import torch.nn.functional as F

    batch, _, height, width = pixel_values.shape
    if padding > 0:
        padded = F.pad(pixel_values, (padding, padding, padding, padding))  # (B, C, S+2p, S+2p)
        top = torch.randint(0, 2 * padding + 1, (batch,), generator=generator).tolist()
        left = torch.randint(0, 2 * padding + 1, (batch,), generator=generator).tolist()
        crops = [image[:, t : t + height, x : x + width] for image, t, x in zip(padded, top, left, strict=True)]
        pixel_values = torch.stack(crops)
    flip = torch.rand(batch, generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], pixel_values.flip(-1), pixel_values)


# RandAugment (Cubuk et al., 2020, https://arxiv.org/abs/1909.13719) on PIL images, written after torchvision 0.28's
# `transforms.RandAugment` and `transforms.autoaugment._apply_op`, whose operations, magnitude bins, defaults and
# random draws it repeats. torchvision itself is no dependency: its wheels on PyPI are CUDA builds whose compiled ops
# do not load beside torch's CPU build ("operator torchvision::nms does not exist" at import).

RAND_AUGMENT_OPS = (  # torchvision's order: an operation is drawn by its index
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
)


def rand_augment_magnitude(op: str, level: int, height: int, width: int) -> tuple[float, bool]:
    """The magnitude of operation `op` at bin `level` (0 to 30) for an image of `height` × `width` pixels, and
    whether its sign is drawn at random: torchvision's `RandAugment._augmentation_space` with 31 bins."""
    import torch

    ranges = {  # magnitude at bin 0, at bin 30, signed
        "ShearX": (0.0, 0.3, True),
        "ShearY": (0.0, 0.3, True),
        "TranslateX": (0.0, 150.0 / 331.0 * width, True),
        "TranslateY": (0.0, 150.0 / 331.0 * height, True),
        "Rotate": (0.0, 30.0, True),
        "Brightness": (0.0, 0.9, True),
        "Color": (0.0, 0.9, True),
        "Contrast": (0.0, 0.9, True),
        "Sharpness": (0.0, 0.9, True),
        "Solarize": (255.0, 0.0, False),  # the threshold
    }
    if op == "Posterize":  # the bits kept: 8 down to 4
        return float(8 - round(level / ((RAND_AUGMENT_BINS - 1) / 4))), False
    if op not in ranges:
        return 0.0, False
    start, end, signed = ranges[op]
    # float32 bins, as torchvision's: a float64 threshold of 85.0 instead of 84.99999 would solarize other pixels
    return float(torch.linspace(start, end, RAND_AUGMENT_BINS)[level]), signed


def apply_rand_augment_op(image: Image.Image, op: str, magnitude: float, fill: int = 0) -> Image.Image:
    """`image` (PIL, "L" or "RGB") transformed by the RandAugment operation `op` at `magnitude`, as torchvision's
    `_apply_op` does on PIL images: nearest-neighbour resampling, `fill` outside the moved image. The shears keep the
    top-left corner fixed, rotation the centre."""
    from PIL import Image, ImageEnhance, ImageOps

    fill_colour = fill if len(image.getbands()) == 1 else (fill,) * len(image.getbands())
    affine = {  # output pixel (x, y) takes input pixel (a x + b y + c, d x + e y + f)
        "ShearX": (1.0, magnitude, 0.0, 0.0, 1.0, 0.0),
        "ShearY": (1.0, 0.0, 0.0, magnitude, 1.0, 0.0),
        "TranslateX": (1.0, 0.0, -float(int(magnitude)), 0.0, 1.0, 0.0),
        "TranslateY": (1.0, 0.0, 0.0, 0.0, 1.0, -float(int(magnitude))),
    }
    enhancers = {
        "Brightness": ImageEnhance.Brightness,
        "Color": ImageEnhance.Color,
        "Contrast": ImageEnhance.Contrast,
        "Sharpness": ImageEnhance.Sharpness,
    }
    if op in affine:
        nearest = Image.Resampling.NEAREST
        return image.transform(image.size, Image.Transform.AFFINE, affine[op], nearest, fillcolor=fill_colour)
    if op == "Rotate":
        return image.rotate(magnitude, Image.Resampling.NEAREST, expand=False, fillcolor=fill_colour)
    if op in enhancers:
        return enhancers[op](image).enhance(1.0 + magnitude)
    if op == "Posterize":
        return ImageOps.posterize(image, int(magnitude))
    if op == "Solarize":
        return ImageOps.solarize(image, magnitude)
    if op == "AutoContrast":
        return ImageOps.autocontrast(image)
    if op == "Equalize":
        return ImageOps.equalize(image)
    if op == "Identity":
        return image
    raise ValueError(f"Unknown RandAugment operation {op!r}; the operations are {', '.join(RAND_AUGMENT_OPS)}.")


class RandAugment:
    """RandAugment as torchvision's `transforms.RandAugment(num_ops, magnitude)` on PIL images: `num_ops`
    operations, each drawn uniformly from `RAND_AUGMENT_OPS` (with replacement), at bin `magnitude` of 31, with a
    random sign where the operation has one. The draws come from `generator` (torch's global one by default, so that
    `transformers.set_seed` makes them reproducible), in torchvision's order."""

    def __init__(self, num_ops: int = 2, magnitude: int = 9, fill: int = 0):
        if isinstance(num_ops, bool) or not isinstance(num_ops, int) or num_ops < 0:
            raise ValueError(f"RandAugment num_ops must be an integer >= 0, got {num_ops!r}.")
        if isinstance(magnitude, bool) or not isinstance(magnitude, int) or not 0 <= magnitude < RAND_AUGMENT_BINS:
            raise ValueError(
                f"RandAugment magnitude must be an integer from 0 to {RAND_AUGMENT_BINS - 1}, got {magnitude!r}."
            )
        self.num_ops, self.magnitude, self.fill = num_ops, magnitude, fill

    def __call__(self, image: Image.Image, generator: torch.Generator | None = None) -> Image.Image:
        import torch

        for _ in range(self.num_ops):
            op = RAND_AUGMENT_OPS[int(torch.randint(len(RAND_AUGMENT_OPS), (1,), generator=generator).item())]
            magnitude, signed = rand_augment_magnitude(op, self.magnitude, image.height, image.width)
            if signed and torch.randint(2, (1,), generator=generator):
                magnitude = -magnitude
            image = apply_rand_augment_op(image, op, magnitude, self.fill)
        return image

    def augment_batch(self, pixels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A uint8 batch (B, C, S, S) with C 1 or 3, each image augmented on its own; same shape and dtype."""
        import numpy as np
        import torch
        from PIL import Image

        if pixels.dtype != torch.uint8 or pixels.ndim != 4 or pixels.shape[1] not in (1, 3):
            raise ValueError(
                f"RandAugment takes uint8 (B, 1 or 3, H, W) batches, got {pixels.dtype} {tuple(pixels.shape)}."
            )
        augmented = []
        for image in pixels.numpy():  # (C, H, W)
            picture = Image.fromarray(image[0] if len(image) == 1 else image.transpose(1, 2, 0))
            array = np.array(self(picture, generator))
            augmented.append(array[None] if array.ndim == 2 else array.transpose(2, 0, 1))  # (C, H, W)
        return torch.from_numpy(np.stack(augmented))

    def __repr__(self) -> str:
        return f"RandAugment(num_ops={self.num_ops}, magnitude={self.magnitude}, fill={self.fill})"


class ImageBatchCollator:
    """Stacks uint8 `pixel_values` (from `preprocess_images`) into a normalised float batch (B, C, S, S) exactly as
    the image processor would. Training batches are augmented first, on the pixels: random crop-with-padding and
    horizontal flip when `augment`, then `rand_augment` (a `RandAugment`) when given. With a `seed`, a batch's draws
    come from a generator seeded by it and the batch's pixels, so a batch is augmented alike whenever it is drawn: a
    resumed run repeats an uninterrupted one exactly (the global generator, which a checkpoint saves, is one batch
    ahead of the data: the DataLoader fetches a batch before the step that trains it)."""

    def __init__(
        self,
        processor: BaseImageProcessor,
        augment: bool = False,
        crop_padding: int = 4,
        rand_augment: RandAugment | None = None,
        seed: int | None = None,
    ):
        import torch

        self.scale = float(processor.rescale_factor) if processor.do_rescale else 1.0
        mean = processor.image_mean if processor.do_normalize else 0.0
        std = processor.image_std if processor.do_normalize else 1.0
        self.mean = torch.as_tensor(mean, dtype=torch.float32).reshape(1, -1, 1, 1)  # (1, C, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).reshape(1, -1, 1, 1)
        # The crop pads with the pixel value that normalises to 0 (the mean), not with black.
        self.padding_value = self.mean / self.scale
        self.augment = augment
        self.crop_padding = crop_padding
        self.rand_augment = rand_augment
        self.seed = seed

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        pixels = torch.stack([torch.as_tensor(example["pixel_values"]) for example in examples])  # (B, C, S, S)
        generator = None
        if self.seed is not None and (self.augment or self.rand_augment is not None):
            key = hashlib.blake2b(pixels.numpy().tobytes(), digest_size=8, key=str(self.seed).encode()).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(key, "little") >> 1)
        if self.augment:
            padded = random_crop_flip(pixels.float() - self.padding_value, self.crop_padding, generator)
            pixels = padded + self.padding_value
        if self.rand_augment is not None:  # on whole pixel values, as torchvision's (the padding's 127.5: 128)
            pixels = self.rand_augment.augment_batch(pixels.round().to(torch.uint8), generator)
        pixel_values = (pixels.float() * self.scale - self.mean) / self.std
        labels = torch.as_tensor([int(example["labels"]) for example in examples], dtype=torch.long)
        return {"pixel_values": pixel_values, "labels": labels}
