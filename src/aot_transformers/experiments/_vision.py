"""Small image datasets from local files and a plain training loop for the image studies (k-NN speed, attention maps).

Data never comes from the network: CIFAR-10 is read from one `train_<class>.tar.gz` of JPEGs per class, MNIST from
the 5,000-digit `mnist_5k.csv.gz` (the layout of the project's shared data folder, see `default_data_dir`). Any other
folder with the same files works through `data_dir`.
"""

from __future__ import annotations

import gzip
import io
import itertools
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .study import check_int, make_generator

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def default_data_dir() -> Path:
    """The shared data folder: `$AOT_SHARED_DATA`, else `../shared/data` from the working directory or the repo."""
    if "AOT_SHARED_DATA" in os.environ:
        return Path(os.environ["AOT_SHARED_DATA"])
    for base in (Path.cwd(), Path(__file__).resolve().parents[3]):
        candidate = base.parent / "shared" / "data"
        if candidate.exists():
            return candidate
    return Path.cwd().parent / "shared" / "data"


def _require(path: Path, what: str, layout: str) -> Path:
    """`path`, or FileNotFoundError saying which folder `data_dir` must be (the one holding `layout`)."""
    if not path.exists():
        raise FileNotFoundError(
            f"{what} file {path} not found; pass `data_dir` pointing at the folder that holds {layout}."
        )
    return path


def load_cifar10(data_dir: str | Path | None = None, per_class: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `per_class` (<= 5000) training images, in archive order, of every CIFAR-10 class: `images` uint8
    (N, 3, 32, 32) and `labels` (N,) in `CIFAR10_CLASSES` order, from `data_dir` (default `default_data_dir()`), the
    folder holding `vision/cifar10/train_<class>.tar.gz` or the `cifar10` folder itself.
    """
    from PIL import Image

    check_int("per_class", per_class, 1, 5000)
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    folder = root if (root / "train_airplane.tar.gz").exists() else root / "vision" / "cifar10"
    images, labels = [], []
    for label, name in enumerate(CIFAR10_CLASSES):
        path = _require(folder / f"train_{name}.tar.gz", "CIFAR-10", "vision/cifar10/train_<class>.tar.gz")
        # Streaming mode reads members in archive order and stops early, instead of decompressing whole archives.
        with tarfile.open(path, "r|gz") as archive:
            for member in itertools.islice((m for m in archive if m.name.endswith(".jpg")), per_class):
                with Image.open(io.BytesIO(archive.extractfile(member).read())) as image:
                    pixels = torch.frombuffer(bytearray(image.convert("RGB").tobytes()), dtype=torch.uint8)
                images.append(pixels.view(32, 32, 3).permute(2, 0, 1))
        labels += [label] * (len(images) - len(labels))
    return torch.stack(images), torch.tensor(labels)


def load_mnist5k(data_dir: str | Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The 5,000 MNIST digits of `vision/mnist5k/mnist_5k.csv.gz`: uint8 (5000, 1, 28, 28) and labels (5000,)."""
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    path = root / "mnist_5k.csv.gz"
    path = path if path.exists() else root / "vision" / "mnist5k" / "mnist_5k.csv.gz"
    _require(path, "MNIST", "vision/mnist5k/mnist_5k.csv.gz")
    import numpy as np

    with gzip.open(path, "rt") as handle:
        header = not handle.readline().split(",")[0].strip().isdigit()
    values = torch.from_numpy(np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2, skiprows=int(header)))
    return values[:, :784].to(torch.uint8).view(-1, 1, 28, 28), values[:, 784]


def split(images: torch.Tensor, labels: torch.Tensor, val_fraction: float, seed: int) -> dict[str, torch.Tensor]:
    """A seeded shuffle into train and validation parts."""
    order = torch.randperm(len(labels), generator=make_generator(seed))
    num_val = max(1, int(len(labels) * val_fraction))
    val, train = order[:num_val], order[num_val:]
    return {
        "train_images": images[train],
        "train_labels": labels[train],
        "val_images": images[val],
        "val_labels": labels[val],
    }


def normalise(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, size: int | None = None) -> torch.Tensor:
    """uint8 (N, C, H, W) → float, standardised per channel, then resized (bilinear) to `size` × `size` if given."""
    pixels = (images.float() / 255.0 - mean[:, None, None]) / std[:, None, None]
    if size is not None and pixels.shape[-1] != size:  # a model trained at another resolution
        pixels = torch.nn.functional.interpolate(pixels, size=(size, size), mode="bilinear", align_corners=False)
    return pixels


def standardised(data: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """`data` (from `split`) with its images `normalise`d by the training images' per-channel mean and standard
    deviation (in [0, 1] units), and that mean and std."""
    scaled = data["train_images"].float() / 255.0
    mean, std = scaled.mean(dim=(0, 2, 3)), scaled.std(dim=(0, 2, 3)).clamp(min=1e-3)
    return {key: normalise(v, mean, std) if key.endswith("images") else v for key, v in data.items()}, mean, std


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 256) -> float:
    """Top-1 accuracy of an image classifier on pre-normalised images."""
    model.eval()
    correct = 0
    for start in range(0, len(labels), batch_size):
        logits = model(pixel_values=images[start : start + batch_size]).logits
        correct += int((logits.argmax(-1) == labels[start : start + batch_size]).sum())
    return correct / len(labels)


def train_classifier(
    model: nn.Module,
    data: dict[str, torch.Tensor],
    epochs: int = 5,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
) -> dict[str, Any]:
    """Train an image classifier (returning `.logits`) with AdamW (weight decay 0.05) and cross-entropy, `lr`
    decaying to 0 (cosine); validation accuracy after every epoch.

    `data` is `split(...)` output with the images already normalised to float; `seed` orders the batches. Returns
    `val_accuracy` and `train_loss` per epoch, `epoch_seconds` (cumulative) and `seconds`.
    """
    generator = make_generator(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    steps_per_epoch = -(-len(data["train_labels"]) // batch_size)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * steps_per_epoch)
    history: dict[str, list[float]] = {"val_accuracy": [], "train_loss": [], "epoch_seconds": []}
    started = time.perf_counter()
    for _ in range(epochs):
        model.train()
        order = torch.randperm(len(data["train_labels"]), generator=generator)
        total, count = 0.0, 0
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            loss = model(pixel_values=data["train_images"][batch], labels=data["train_labels"][batch]).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total, count = total + float(loss.detach()) * len(batch), count + len(batch)
        history["train_loss"].append(total / count)
        history["val_accuracy"].append(accuracy(model, data["val_images"], data["val_labels"]))
        history["epoch_seconds"].append(time.perf_counter() - started)
    return {**history, "seconds": time.perf_counter() - started}
