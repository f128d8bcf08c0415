"""LoRA fine-tuning through PEFT (the optional `peft` extra): `aot train lm|image --lora_r 8 …`.

The low-rank adapters go on the attention projections by default — MSSA: the shared subspace projection `U` and the
output projection (`subspace_proj`, `o_proj`); MHSA: `q_proj`, `k_proj`, `v_proj`, `o_proj` — since an AoT layer has
nothing else to adapt (no MLP). For an image classifier the classification head is trained in full
(`modules_to_save`), as a new task usually brings new classes. The final folder is the adapter
(`adapter_config.json` + `adapter_model.safetensors`, loadable with `PeftModel.from_pretrained(base, folder)`), with
the tokenizer or image processor and a model card; `--merge_lora` writes a plain merged model folder instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import arg
from .arguments import TrainingSetupError

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import BaseImageProcessor, PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_TARGETS = {"mssa": ["subspace_proj", "o_proj"], "mhsa": ["q_proj", "k_proj", "v_proj", "o_proj"]}
IMAGE_HEAD = "classifier"


@dataclass
class LoraArguments:
    """LoRA fine-tuning (off unless `--lora_r` is given; needs `pip install 'aot-transformers[peft]'`)."""

    lora_r: int | None = arg(None, "Rank of the LoRA adapters; enables LoRA.")
    lora_alpha: float | None = arg(None, "LoRA scaling numerator (default: 2 x rank).")
    lora_dropout: float = arg(0.05, "Dropout on the LoRA input.")
    lora_target_modules: list[str] | None = arg(
        None, "Module names to adapt (default: MSSA subspace_proj o_proj; MHSA q_proj k_proj v_proj o_proj)."
    )
    merge_lora: bool = arg(False, "Write the final model with the adapters merged in, as a plain folder.")

    @property
    def enabled(self) -> bool:
        return self.lora_r is not None

    def check(self) -> None:
        """Raise `TrainingSetupError` naming the argument for a value LoRA cannot use."""
        if self.lora_r is None:
            for name, value, default in (
                ("--lora_alpha", self.lora_alpha, None),
                ("--lora_target_modules", self.lora_target_modules, None),
                ("--merge_lora", self.merge_lora, False),
            ):
                if value != default:
                    raise TrainingSetupError("needs --lora_r (LoRA is off without it)", argument=name, value=value)
            return
        if isinstance(self.lora_r, bool) or self.lora_r < 1:
            raise TrainingSetupError("", argument="--lora_r", value=self.lora_r, allowed="a positive integer")
        if self.lora_alpha is not None and not self.lora_alpha > 0:
            raise TrainingSetupError("", argument="--lora_alpha", value=self.lora_alpha, allowed="a positive number")
        if not 0 <= self.lora_dropout < 1:
            raise TrainingSetupError("", argument="--lora_dropout", value=self.lora_dropout, allowed="0 <= p < 1")

    def check_base(self, base_model: str | None) -> None:
        """Refuse LoRA without a trained base model (`base_model`, the run's `--model_name_or_path`): the base would
        be randomly initialised and frozen, and the adapters alone trained over it."""
        if not base_model:
            raise TrainingSetupError(
                "adapts a trained model, but no --model_name_or_path was given: the base would be randomly "
                "initialised and frozen. Give the model to fine-tune, or drop --lora_r to train all weights",
                argument="--lora_r",
                value=self.lora_r,
            )


def check_lora_targets(model: PreTrainedModel, lora: LoraArguments) -> list[str]:
    """The modules LoRA adapts in `model` (which may live on the meta device, to check before any data is read).
    Raises `TrainingSetupError` for target modules the model does not have."""
    targets = lora.lora_target_modules or DEFAULT_TARGETS[model.config.attention_type]
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [target for target in targets if target not in names]
    if missing:
        allowed = sorted(n for n in names if n.endswith("proj"))
        raise TrainingSetupError(
            f"{missing} not in this {model.config.attention_type.upper()} model",
            argument="--lora_target_modules",
            value=" ".join(targets),
            allowed=" ".join(allowed),
        )
    # A rank above a target's smaller side adds parameters without adding rank: most likely a typo.
    widths = [
        min(module.in_features, module.out_features)
        for name, module in model.named_modules()
        if name.rsplit(".", 1)[-1] in targets and hasattr(module, "in_features") and hasattr(module, "out_features")
    ]
    if widths and lora.lora_r > min(widths):
        raise TrainingSetupError(
            f"is larger than the adapted layers ({' '.join(targets)}: smallest side {min(widths)})",
            argument="--lora_r",
            value=lora.lora_r,
            allowed=f"an integer in [1, {min(widths)}]",
        )
    return list(targets)


def apply_lora(model: PreTrainedModel, lora: LoraArguments, task: str) -> PeftModel:
    """Wrap `model` in a `peft.PeftModel` with LoRA adapters as `lora` says; only the adapters (and an image
    classifier's head) stay trainable. Raises `TrainingSetupError` for target modules the model does not have."""
    try:
        import peft
    except ImportError:
        raise TrainingSetupError(
            "LoRA needs PEFT: pip install 'aot-transformers[peft]'", argument="--lora_r"
        ) from None
    targets = check_lora_targets(model, lora)
    config = peft.LoraConfig(
        r=lora.lora_r,
        lora_alpha=lora.lora_alpha or 2 * lora.lora_r,
        lora_dropout=lora.lora_dropout,
        target_modules=list(targets),
        task_type=peft.TaskType.CAUSAL_LM if task == "text-generation" else None,
        modules_to_save=[IMAGE_HEAD] if task != "text-generation" else None,
    )
    return peft.get_peft_model(model, config)


def export_adapter(
    model: PeftModel,
    save_directory: str | os.PathLike,
    *,
    processor: PreTrainedTokenizerBase | BaseImageProcessor | None = None,
    card_kwargs: dict[str, Any],
    files: dict[str, Any] | None = None,
    protected: tuple[str | os.PathLike, ...] = (),
) -> Path:
    """Write the LoRA adapter of `model` (a `PeftModel`) atomically, with the processor, a model card and `files`.

    The card names the base model: in `base_model` metadata when it is a Hub id (`card_kwargs["base_model"]`),
    otherwise in the text, as the Hub accepts only repository ids there. Like `export_model`, it replaces only an
    earlier export, never a folder in `protected` or a parent of one (`hub.check_replaceable`).
    """
    from ..hub import write_export
    from ..model_card import render_model_card

    card_kwargs = {**card_kwargs, "tags": ["lora", "peft"], "library_name": "peft", "adapter": lora_summary(model)}
    card = render_model_card(model.get_base_model().config, **card_kwargs)
    files = {**(files or {}), "README.md": str(card)}
    return write_export(model, save_directory, (processor,), files, protected=protected)


def lora_summary(model: PeftModel) -> dict[str, Any]:
    """Rank, alpha, target modules and trainable parameters of a `PeftModel`, for the card."""
    config = model.peft_config["default"]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "rank": config.r,
        "alpha": config.lora_alpha,
        "dropout": config.lora_dropout,
        "target modules": ", ".join(sorted(config.target_modules)),
        "trainable parameters": trainable,
        "base model": config.base_model_name_or_path,
    }


__all__ = ["DEFAULT_TARGETS", "LoraArguments", "apply_lora", "export_adapter", "lora_summary"]
