"""Attention maps of a trained image classifier (AoT Fig. 7): [CLS]-to-patch attention of every head of one layer
(by default the penultimate, as Fig. 7).

With `--model PATH` the study loads a saved `AoTForImageClassification`; without it, it first trains a small AoT
(MSSA, no MLP) on the local MNIST digits (or CIFAR-10) so that the command runs end to end on a CPU. Besides the PNG
grid, it measures how much of the [CLS] attention falls on the object: on MNIST, the share of attention on "ink"
patches (mean intensity above a threshold) against the share those patches would get from uniform attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import torch
import torch.nn.functional as F

from .._io import load_pretrained
from ..modeling_aot import AoTForCausalLM, AoTForImageClassification
from . import _vision
from .knn import vision_config
from .study import Count, Positive, Range, Seed, Study, StudyOptions, arg

if TYPE_CHECKING:
    import numpy as np

DATASETS = ("mnist", "cifar10")


def layer_attentions(
    model: AoTForCausalLM | AoTForImageClassification, pixel_values: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Every layer's attention weights (B, H, N, N) for `pixel_values` (or token ids), run on a backend that returns
    them: `eager` unless it is `knn` already; the model's backend is restored afterwards."""
    backend = model.config._attn_implementation
    if backend not in ("eager", "knn"):  # the backends that return attention maps
        model.set_attn_implementation("eager")
    try:
        return model.model(pixel_values, output_attentions=True, return_dict=True).attentions
    finally:
        if model.config._attn_implementation != backend:
            model.set_attn_implementation(backend)


@torch.no_grad()
def cls_attention_maps(model: AoTForImageClassification, pixel_values: torch.Tensor, layer: int = -1) -> torch.Tensor:
    """[CLS]-to-patch attention (B, H, g, g), g = image_size / patch_size, of every head of `layer` (negative counts
    from the end); each (image, head) map sums to at most 1 (the rest of the weight is on [CLS] itself)."""
    num_layers = model.config.num_hidden_layers
    if not -num_layers <= layer < num_layers:
        raise ValueError(
            f"`layer` must be in [{-num_layers}, {num_layers - 1}] for this {num_layers}-layer model, got {layer}."
        )
    model.eval()
    attentions = layer_attentions(model, pixel_values)
    grid = model.config.image_size // model.config.patch_size
    cls_to_patches = attentions[layer][:, :, 0, 1:]  # (B, H, N)
    return cls_to_patches.reshape(*cls_to_patches.shape[:2], grid, grid)


def object_attention_share(maps: torch.Tensor, images: torch.Tensor, threshold: float = 0.2) -> dict[str, float]:
    """Share of the patch attention `maps` (B, H, g, g) on object patches of `images` (B, C, S, S) in [0, 1] (mean
    intensity above `threshold`) vs. their share of the patches (what uniform attention gives)."""
    grid = maps.shape[-1]
    patch_means = F.adaptive_avg_pool2d(images.float().mean(1, keepdim=True), grid)[:, 0]  # (B, g, g)
    is_object = (patch_means > threshold).float()[:, None]  # (B, 1, g, g)
    share = (maps * is_object).sum((-1, -2)) / maps.sum((-1, -2)).clamp(min=1e-12)  # (B, H)
    return {
        "attention_on_object": float(share.mean()),
        "object_patch_fraction": float(is_object.mean()),
        "per_head": share.mean(0).tolist(),
    }


def plot_attention_grid(axes: np.ndarray, images: torch.Tensor, maps: torch.Tensor, title: str) -> None:
    """On axes (B, H + 1): one row per image, the image then each head's map upsampled and overlaid on it."""
    num_images, num_heads = maps.shape[:2]
    side = images.shape[-1]
    upsampled = F.interpolate(maps, size=(side, side), mode="nearest")  # (B, H, S, S)
    for row in range(num_images):
        picture = images[row].permute(1, 2, 0).float().numpy()
        picture = picture[..., 0] if picture.shape[-1] == 1 else picture
        cmap = "gray" if picture.ndim == 2 else None
        axes[row, 0].imshow(picture, cmap=cmap)
        for head in range(num_heads):
            ax = axes[row, head + 1]
            ax.imshow(picture, cmap=cmap)
            ax.imshow(upsampled[row, head].numpy(), cmap="inferno", alpha=0.6)
            if row == 0:
                ax.set_title(f"head {head}", fontsize=8)
    for ax in axes.flat:
        ax.axis("off")
    axes[0, 0].figure.suptitle(title, fontsize=9)


@dataclass
class Options(StudyOptions):
    model: str | None = arg(None, "saved AoTForImageClassification folder (trains one if left out)")
    dataset: str = arg("mnist", "mnist or cifar10 (when training)", DATASETS)
    layer: Annotated[int, Range(-1000)] | None = arg(
        None, "layer shown (default: the penultimate, as the paper's Fig. 7; negative counts from the end)"
    )
    num_images: Annotated[int, Range(1, 64)] = arg(6, "images shown")
    epochs: Count = arg(15, "training epochs")
    per_class: Count = arg(300, "training images per class (CIFAR-10)")
    data_dir: str | None = arg(None, "shared data folder")
    hidden_size: Count = arg(96, "width of the trained classifier")
    num_layers: Count = arg(4, "layers of the trained classifier")
    patch_size: Count = arg(4, "patch size of the trained classifier")
    lr: Positive = arg(3e-3, "learning rate")
    train_images: Count | None = arg(None, "cap on the training images")
    save_model: bool = arg(True, "save the trained classifier next to the figures")
    seed: Seed = arg(0, "random seed")


def classifier_for(study: Study, o: Options) -> tuple[AoTForImageClassification, dict, torch.Tensor, torch.Tensor]:
    """`o.model` loaded, or a small AoT-MSSA trained on `o.dataset` first; with the data split and the normalisation
    mean and std (the training statistics)."""
    dataset = o.dataset
    classifier = None
    if o.model is not None:
        classifier = load_pretrained(AoTForImageClassification, o.model)
        dataset = "mnist" if classifier.config.num_channels == 1 else "cifar10"
    if dataset == "mnist":
        images, labels = _vision.load_mnist5k(o.data_dir)
    else:
        images, labels = _vision.load_cifar10(o.data_dir, o.per_class)
    data = _vision.split(images, labels, 0.2, o.seed)
    for key in ("train_images", "train_labels"):  # capped at `train_images` (None: all of them)
        data[key] = data[key][: o.train_images]
    normalised, mean, std = _vision.standardised(data)
    if classifier is None:
        torch.manual_seed(o.seed)
        size, channels = images.shape[-1], images.shape[1]
        config = vision_config("aot", None, size, o.patch_size, o.hidden_size, o.num_layers, num_channels=channels)
        config.image_mean, config.image_std = mean.tolist(), std.tolist()  # kept with the model for reuse
        classifier = AoTForImageClassification(config)
        study.results["training"] = _vision.train_classifier(classifier, normalised, o.epochs, lr=o.lr, seed=o.seed)
        if o.save_model:
            classifier.save_pretrained(study.folder / "model")
    else:
        stored = getattr(classifier.config, "image_mean", None), getattr(classifier.config, "image_std", None)
        if None not in stored:
            mean, std = map(torch.tensor, stored)
    study.results["dataset"] = dataset
    return classifier, data, mean, std


def figure7(
    study: Study, o: Options, classifier: AoTForImageClassification, data: dict, mean: torch.Tensor, std: torch.Tensor
) -> None:
    """AoT Fig. 7: [CLS]-to-patch attention of every head of the penultimate layer (or `o.layer`), and its share on
    the object (`object_attention_share`)."""
    side = classifier.config.image_size
    dataset = study.results["dataset"]
    val_images, val_labels = data["val_images"], data["val_labels"]
    val_accuracy = _vision.accuracy(classifier, _vision.normalise(val_images, mean, std, side), val_labels)
    layers = classifier.config.num_hidden_layers
    layer = -min(2, layers) if o.layer is None else o.layer  # AoT Fig. 7: the penultimate layer
    chosen = val_images[: o.num_images]
    maps = cls_attention_maps(classifier, _vision.normalise(chosen, mean, std, side), layer)
    layer_index = layer % layers
    title = f"[CLS] → patch attention, layer {layer_index} of {layers}, {dataset}"
    axes = study.figure("attention_maps.png", ncols=maps.shape[1] + 1, nrows=len(maps), size=(1.6, 1.6))
    plot_attention_grid(axes, chosen.float() / 255.0, maps, title)
    measured = val_images[:256]
    share = object_attention_share(
        cls_attention_maps(classifier, _vision.normalise(measured, mean, std, side), layer),
        F.interpolate(measured.float() / 255.0, size=(side, side), mode="area"),
    )
    study.results.update({"layer": layer_index, "val_accuracy": val_accuracy, "object_share": share, "maps": maps})
    study.claim("validation accuracy of the classifier", f"{val_accuracy:.3f}", "(trained model needed for Fig. 7)")
    study.claim(
        f"[CLS] attention on object patches, layer {layer_index} (penultimate of {layers}; mean over heads)",
        f"{share['attention_on_object']:.2f} vs {share['object_patch_fraction']:.2f} for uniform attention",
        "heads attend to the object / semantically meaningful parts (Fig. 7, penultimate layer)",
        share["attention_on_object"] > share["object_patch_fraction"] if dataset == "mnist" else None,
    )
    study.note(f"Per-head share of attention on the object: {', '.join(f'{v:.2f}' for v in share['per_head'])}")
    study.note("Object patches: mean intensity > 0.2 (meaningful for MNIST digits; reported only for CIFAR-10).")


def run(out: str | Path | None = None, **options: Any) -> dict[str, Any]:
    """AoT's Fig. 7 (an ImageNet-1K AoT-MSSA there) for a saved or freshly trained small classifier (`Options`)."""
    o = Options.parse(options)
    study = Study("attention-maps", "Attention maps (AoT Fig. 7)", o, out)
    classifier, data, mean, std = classifier_for(study, o)
    figure7(study, o, classifier, data, mean, std)
    return study.finish()
