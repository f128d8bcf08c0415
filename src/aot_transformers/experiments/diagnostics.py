"""Layer-wise diagnostics of a trained AoT (`aot inspect MODEL`): token compression and what each head captures.

For every layer ℓ the tokens Z (n × d, the layer's input after its LayerNorm — what its heads see) of each input are
measured with the coding-rate quantities of the white-box (CRATE / AoT) line of work:

- coding rate `R(Z) = ½ log det(I + d/(n ε²) ZᵀZ)`, the number of nats needed to code the tokens up to precision ε;
- compressed rate `R_c(Z; U) = Σ_k ½ log det(I + p/(n ε²) (Z U_k)ᵀ(Z U_k))` against the layer's head subspaces U_k;
- the gap `R − R_c`, large when the tokens concentrate on the heads' subspaces;
- per head, the share of the token energy inside its subspace, `‖Z U_k‖² / ‖Z‖²` (a random p-dimensional subspace
  gets p/d).

A head's subspace U_k is an orthonormal basis of the rows of its projection: MSSA's shared query/key/value
projection, or MHSA's value projection (the part of the token the head passes on).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._io import load_pretrained
from ..configuration_aot import AoTConfig
from ..modeling_aot import AoTForCausalLM, AoTForImageClassification
from . import _vision
from .study import Study, check_int, check_real, set_axes


def coding_rate(tokens: torch.Tensor, eps: float = 0.5) -> torch.Tensor:
    """½ log det(I + d/(n ε²) ZᵀZ) for tokens Z (n, d): `subspace_coding_rate` with the one subspace U = I."""
    return subspace_coding_rate(tokens, torch.eye(tokens.shape[1], dtype=torch.float64)[None], eps)


def subspace_coding_rate(tokens: torch.Tensor, subspaces: torch.Tensor, eps: float = 0.5) -> torch.Tensor:
    """Σ_k ½ log det(I + p/(n ε²) (Z U_k)ᵀ(Z U_k)) for tokens (n, d) and orthonormal subspaces (K, d, p)."""
    num = tokens.shape[0]
    projected = torch.einsum("nd,kdp->knp", tokens.double(), subspaces.double())  # (K, n, p)
    width = projected.shape[-1]
    gram = projected.transpose(1, 2) @ projected  # (K, p, p)
    return 0.5 * torch.logdet(torch.eye(width, dtype=torch.float64) + width / (num * eps**2) * gram).sum()


def head_energy(tokens: torch.Tensor, subspaces: torch.Tensor) -> torch.Tensor:
    """Share of the tokens' energy inside each head's subspace: (K,)."""
    projected = torch.einsum("nd,kdp->knp", tokens.double(), subspaces.double())
    return projected.square().sum((1, 2)) / tokens.double().square().sum()


def head_subspaces(attention: nn.Module) -> torch.Tensor:
    """Orthonormal bases (K, d, D) of the heads of an `AoTAttention` module (see the module docstring)."""
    weight = attention.subspace_proj.weight if hasattr(attention, "subspace_proj") else attention.v_proj.weight
    heads = weight.detach().double().reshape(attention.num_heads, attention.head_dim, -1)  # (K, D, d)
    basis, _ = torch.linalg.qr(heads.transpose(1, 2))  # (K, d, D)
    return basis


def load_model(model: str | Path) -> nn.Module:
    """A saved AoT folder (causal LM or image classifier), or a preset name (random weights, for a dry run)."""
    from ..presets import list_presets

    if str(model) in list_presets():
        config = AoTConfig.from_preset(str(model))
        torch.manual_seed(0)
        return AoTForImageClassification(config) if str(model).startswith("aot-v") else AoTForCausalLM(config)
    path = Path(model)
    if not (path / "config.json").exists():
        raise ValueError(
            f"`model` must be a saved AoT folder (with config.json) or one of the presets "
            f"{list_presets()}, got {str(model)!r}."
        )
    try:
        config = AoTConfig.from_pretrained(path)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"`model` {str(model)!r} has an unreadable or invalid config.json: {error}") from None
    architectures = config.architectures or []
    if any("ImageClassification" in name for name in architectures):
        return load_pretrained(AoTForImageClassification, path)
    return load_pretrained(AoTForCausalLM, path)


def _text_inputs(
    model: AoTForCausalLM, source: str | Path | None, num_samples: int, seq_len: int, model_path: str | Path
) -> tuple[torch.Tensor, str]:
    """Token ids (num_samples, seq_len) from a text file, with the model's tokenizer when it has one."""
    path = Path(source) if source else _vision.default_data_dir() / "text" / "tinyshakespeare" / "input.txt"
    if not path.exists():
        raise ValueError(f"`data`: text file {path} not found; pass a UTF-8 text file.")
    text = path.read_text(encoding="utf-8", errors="replace")[:200_000]
    vocab = model.config.vocab_size
    ids, how = None, ""
    folder = Path(model_path)
    if folder.is_dir() and any((folder / name).exists() for name in ("tokenizer.json", "vocab.json")):
        from transformers import AutoTokenizer

        # Only a local folder is ever passed, so this never reaches the network.
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        ids, how = tokenizer(text)["input_ids"], "the model's tokenizer"
    else:
        gpt2 = _vision.default_data_dir() / "tokenizer-gpt2"
        if vocab >= 50257 and gpt2.exists():
            from transformers import GPT2TokenizerFast

            ids, how = GPT2TokenizerFast.from_pretrained(gpt2)(text)["input_ids"], "the GPT-2 tokenizer"
    if ids is None:
        if vocab < 256:
            raise ValueError(f"No tokenizer found for a model with vocab_size {vocab} (< 256 byte ids).")
        ids, how = list(text.encode("utf-8")), "UTF-8 bytes (no tokenizer found)"
    seq_len = min(seq_len, model.config.max_position_embeddings)
    ids = torch.tensor(ids[: num_samples * seq_len], dtype=torch.long)
    usable = len(ids) // seq_len
    if usable == 0:
        raise ValueError(f"{path} is too short for one sequence of {seq_len} tokens.")
    return ids[: usable * seq_len].view(usable, seq_len).clamp(max=vocab - 1), how


def _image_inputs(model: AoTForImageClassification, num_samples: int) -> tuple[torch.Tensor, str]:
    config = model.config
    if config.num_channels == 1:
        images, _ = _vision.load_mnist5k()
        how = "MNIST digits"
    else:
        images, _ = _vision.load_cifar10(per_class=max(1, -(-num_samples // 10)))
        how = "CIFAR-10 images"
    images = images[torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[:num_samples]]
    mean = torch.tensor(getattr(config, "image_mean", None) or [0.5] * config.num_channels)
    std = torch.tensor(getattr(config, "image_std", None) or [0.25] * config.num_channels)
    return _vision.normalise(images, mean, std, config.image_size), how


@torch.no_grad()
def layerwise_diagnostics(model: nn.Module, inputs: torch.Tensor, eps: float = 0.5) -> dict[str, Any]:
    """Per layer: R, R_c, R − R_c (precision `eps`, averaged over the inputs) and each head's energy share, for an
    `AoTForCausalLM` (`inputs`: token ids (B, T)) or an `AoTForImageClassification` (pixels (B, C, S, S))."""
    check_real("eps", eps, 0.0, open_min=True)
    model.eval()
    backbone = model.model
    if isinstance(model, AoTForImageClassification):
        hidden = backbone(inputs, output_hidden_states=True, return_dict=True).hidden_states
    else:
        hidden = backbone(input_ids=inputs, output_hidden_states=True, use_cache=False, return_dict=True).hidden_states
    names = ("rate", "compressed_rate", "rate_gap", "head_energy", "random_subspace_share")
    rows: dict[str, list] = {key: [] for key in names}
    for index, layer in enumerate(backbone.layers):
        subspaces = head_subspaces(layer.attention).to(torch.float64)
        seen = layer.attention_norm(hidden[index]).double()  # (B, T, d): what the heads see
        rate = torch.stack([coding_rate(z, eps) for z in seen])
        compressed = torch.stack([subspace_coding_rate(z, subspaces, eps) for z in seen])
        energy = torch.stack([head_energy(z, subspaces) for z in seen]).mean(0)
        rows["rate"].append(float(rate.mean()))
        rows["compressed_rate"].append(float(compressed.mean()))
        rows["rate_gap"].append(float((rate - compressed).mean()))
        rows["head_energy"].append(energy.tolist())
        rows["random_subspace_share"].append(subspaces.shape[-1] / subspaces.shape[1])
    return rows


def run(
    model: str | Path,
    out: str | Path | None = None,
    data: str | Path | None = None,
    num_samples: int = 16,
    seq_len: int = 128,
    eps: float = 0.5,
    knn_k: float | int | None = None,
) -> dict[str, Any]:
    """`aot inspect MODEL`: layer-wise coding rates (precision `eps`) and head energy shares of a saved AoT folder or a
    preset (random weights), on `num_samples` images of the shared MNIST/CIFAR-10 files or sequences of `seq_len`
    tokens of the text file `data` (default: the shared tinyshakespeare); results.json, PNGs and summary.md in `out`
    (default `out/experiments/inspect`). With `knn_k` (an int, or a fraction of the keys in (0, 1]), also KVT's Fig. 2
    diagnostics per layer, dense attention against k-NN attention with that k (`knn_evidence.dense_vs_knn`).
    """
    check_int("num_samples", num_samples)
    check_int("seq_len", seq_len, 2)
    command = f"aot inspect {model}" + (f" --data {data}" if data else "") + (f" --knn-k {knn_k}" if knn_k else "")
    study = Study("inspect", f"Layer-wise diagnostics of {model}", None, out, command)
    network = load_model(model)
    if isinstance(network, AoTForImageClassification):
        inputs, source = _image_inputs(network, num_samples)
    else:
        inputs, source = _text_inputs(network, data, num_samples, seq_len, model)
    rows = layerwise_diagnostics(network, inputs, eps)
    axes = study.figure("layerwise.png", ncols=2)
    layers = list(range(len(rows["rate"])))
    for key, label in (("rate", "R(Z)"), ("compressed_rate", "R_c(Z; U)"), ("rate_gap", "R − R_c")):
        axes[0, 0].plot(layers, rows[key], marker="o", label=label)
    set_axes(axes[0, 0], xlabel="layer", ylabel="nats", title=f"Coding rates (ε = {eps})")
    energy = torch.tensor(rows["head_energy"])  # (layers, heads)
    image = axes[0, 1].imshow(energy.T.numpy(), aspect="auto", cmap="viridis")
    random_share = rows["random_subspace_share"][0]
    axes[0, 1].set(xlabel="layer", ylabel="head", title=f"energy share per head (random: {random_share:.3f})")
    axes[0, 1].figure.colorbar(image, ax=axes[0, 1])
    study.results.update(model=str(model), inputs=source, num_inputs=int(inputs.shape[0]), eps=eps, layers=rows)
    if knn_k is not None:
        study.results["knn_comparison"] = _knn_comparison(study, network, inputs, knn_k)
    study.claim(
        "coding rate R(Z), first → last layer",
        f"{rows['rate'][0]:.1f} → {rows['rate'][-1]:.1f}",
        "compression: tokens move towards low-dimensional subspaces with depth",
    )
    study.claim(
        "R − R_c, first → last layer",
        f"{rows['rate_gap'][0]:.1f} → {rows['rate_gap'][-1]:.1f}",
        "grows when the tokens concentrate on the heads' subspaces",
    )
    study.claim(
        "mean head energy share, first → last layer",
        f"{energy[0].mean():.3f} → {energy[-1].mean():.3f} (random {random_share:.3f})",
        "> random when heads capture the tokens",
    )
    study.note(f"Inputs: {inputs.shape[0]} × {source}.")
    study.note(
        "Tokens measured after each layer's LayerNorm; head subspaces from the MSSA projection "
        "(MHSA: value projection)."
    )
    return study.finish()


def _knn_comparison(
    study: Study, network: AoTForCausalLM | AoTForImageClassification, inputs: torch.Tensor, knn_k: float | int
) -> dict:
    """KVT Fig. 2's three metrics per layer with the model's dense attention and with k-NN attention (`knn_k`)."""
    from ..configuration_aot import check_knn_k
    from .knn_evidence import dense_vs_knn, set_k

    check_knn_k(knn_k)
    original = network.config.knn_k
    try:
        return dense_vs_knn(
            study, {None: network, knn_k: network}, knn_k, f"knn_k={knn_k}", inputs, "knn_comparison.png"
        )
    finally:
        set_k(network, original)
