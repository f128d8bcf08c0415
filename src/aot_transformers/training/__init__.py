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

_EXPORTS = {
    "TrainingRun": ".run",
    "run_training": ".run",
    "LMModelArguments": ".lm",
    "prepare_lm_training": ".lm",
    "run_lm_training": ".lm",
    "train_lm": ".lm",
    "unigram_perplexity": ".lm",
    "ImageModelArguments": ".image",
    "prepare_image_training": ".image",
    "run_image_training": ".image",
    "train_image": ".image",
    "TextDataArguments": ".text_data",
    "load_text_source": ".text_data",
    "tokenize_and_pack": ".text_data",
    "ImageDataArguments": ".vision_data",
    "load_image_source": ".vision_data",
    "ModelArguments": ".arguments",
    "PublishArguments": ".arguments",
    "TrainingSetupError": ".arguments",
    "LoraArguments": ".lora",
    "last_complete_checkpoint": ".run_state",
    "plot_training_curves": ".finish",
    "train_bpe_tokenizer": ".tokenizer",
    "run_demo": ".demo",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
