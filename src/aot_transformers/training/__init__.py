"""Training, data and tokenizer preparation for AoT models on `transformers.Trainer`.

- `train_lm` / `aot train lm`: causal-LM pretraining and fine-tuning (Hub or local text, streaming, packing,
  byte-level BPE trained with `tokenizers` when no tokenizer is given);
- `train_image` / `aot train image`: image classification (Hub, imagefolder, the CIFAR-10 archives and MNIST CSV
  of `../shared/data/vision`, scikit-learn digits) with an image processor saved beside the model;
- `run_demo` / `aot demo`: both, end to end, on data every machine has.

Each run checks its inputs before the first step, writes Trainer checkpoints that are loadable models, resumes
after a kill, and writes its final folder atomically with a model card and training curves. The same commands run
under `torchrun` and `accelerate launch`. Heavy imports happen on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    ".run": "TrainingRun run_training",
    ".lm": "LMModelArguments prepare_lm_training run_lm_training train_bpe_tokenizer train_lm unigram_perplexity",
    ".image": "ImageModelArguments prepare_image_training run_image_training train_image",
    ".text_data": "TextDataArguments load_text_source tokenize_and_pack",
    ".vision_data": "ImageDataArguments load_image_source",
    ".arguments": "ModelArguments PublishArguments TrainingSetupError",
    ".lora": "LoraArguments",
    ".run_state": "last_complete_checkpoint",
    ".finish": "plot_training_curves",
    ".demo": "run_demo",
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
