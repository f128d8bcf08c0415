"""Causal-LM pretraining and fine-tuning of AoT models with `transformers.Trainer`.

Runs as `aot train lm …`, `python -m aot_transformers.training.lm …`, `torchrun --nproc_per_node N -m
aot_transformers.training.lm …` and `accelerate launch --multi_gpu -m aot_transformers.training.lm …` (plus `--use_cpu`
without GPUs) with the same arguments: those of `LM_ARGUMENTS` plus every `TrainingArguments` flag. All input is
checked (data, columns, preset, tokenizer against the model, block size) before the first training step. Without a
tokenizer, a byte-level BPE is trained with `tokenizers` and wrapped as a `transformers` fast tokenizer.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import arg, atomic_folder, looks_like_path, read_json, write_json
from .arguments import ModelArguments, PublishArguments, TrainingSetupError, parse_dataclasses
from .finish import perplexity
from .lora import LoraArguments
from .optim import OptimizerArguments
from .run import TrainingRun, dataset_length, run_main, run_training
from .run_state import RecordRunTrainerMixin, data_fingerprint
from .text_data import TextDataArguments, TextSource, load_text_source, tokenize_and_pack

if TYPE_CHECKING:
    import numpy as np
    from datasets import Dataset, IterableDataset
    from transformers import (
        PreTrainedConfig,
        PreTrainedTokenizerBase,
        PreTrainedTokenizerFast,
        Trainer,
        TrainingArguments,
    )

logger = logging.getLogger(__name__)

DEFAULT_LM_PRESET = "aot-mssa-l-tiny"
TOKENIZER_SUBDIR = "tokenizer"
TOKENIZER_STREAM_EXAMPLES = 100_000
TOKENIZER_RECORD = "aot_tokenizer.json"  # what the cached tokenizer was trained on
END_OF_TEXT = "<|endoftext|>"  # the BOS, EOS and padding token of the byte-level BPE trained here


@dataclass
class LMModelArguments(ModelArguments):
    """Which model to train (see `ModelArguments`; default preset aot-mssa-l-tiny) and with which tokenizer."""

    tokenizer_name_or_path: str | None = arg(
        None, "A tokenizer folder or Hub id (default: the checkpoint's, else train a byte-level BPE)."
    )
    tokenizer_vocab_size: int | None = arg(None, "Vocabulary of the trained BPE (default: the model's vocab_size).")


def load_tokenizer(name_or_path: str | os.PathLike, **kwargs: Any) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False)`: never the remote-code prompt.

    `AutoTokenizer` reads the folder's `config.json`, whose `auto_map` (the model is remote code) would make
    transformers ask on the terminal unless `trust_remote_code` is explicit. This package registers `aot`, so its own
    folders need no remote code for the tokenizer; one that does fails with a clear error instead of asking.
    """
    from transformers import AutoTokenizer, GPT2TokenizerFast

    folder = Path(name_or_path)
    if (
        folder.is_dir()
        and not any((folder / name).is_file() for name in ("tokenizer_config.json", "tokenizer.json"))
        and all((folder / name).is_file() for name in ("vocab.json", "merges.txt"))
    ):  # the GPT-2 tokenizer as OpenAI published it (vocabulary and merges only), e.g. ../shared/data/tokenizer-gpt2
        return GPT2TokenizerFast.from_pretrained(folder, **kwargs)
    return AutoTokenizer.from_pretrained(os.fspath(name_or_path), trust_remote_code=False, **kwargs)


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    show_progress: bool = True,
    length: int | None = None,
) -> PreTrainedTokenizerFast:
    """Train a GPT-2-style byte-level BPE tokenizer on `texts` (an iterable of strings, consumed once; `length`, if
    known, for the progress bar). Deterministic for a given input.

    Every byte is in the initial alphabet, so any text encodes without unknown tokens; `<|endoftext|>` (id 0) is
    the BOS, EOS and padding token. `vocab_size` counts it and must be at least 257 (256 bytes + `<|endoftext|>`);
    pairs seen only once are not merged. Returns a `transformers.PreTrainedTokenizerFast`
    with exactly `vocab_size` tokens (fewer if the text is too short to learn that many merges).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 257:
        raise ValueError(
            f"`vocab_size` of a byte-level BPE must be >= 257 (256 bytes + {END_OF_TEXT}), got {vocab_size}."
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator((text for text in texts if text), trainer=trainer, length=length)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        model_max_length=1_000_000,
    )


def load_or_train_tokenizer(
    model_args: LMModelArguments,
    config: PreTrainedConfig,
    source: TextSource,
    training_args: TrainingArguments,
    resume: str | None,
    data_args: TextDataArguments,
) -> PreTrainedTokenizerBase:
    """The tokenizer of the run: given, the checkpoint's, the resumed run's, or a byte-level BPE trained on the
    training text (by the main process; saved under `<output_dir>/tokenizer` for the others and for resuming)."""
    given = model_args.tokenizer_name_or_path
    if given and looks_like_path(given) and not Path(given).exists():
        raise TrainingSetupError(f"--tokenizer_name_or_path {given}: no such folder.")
    found = [c for c in (resume, model_args.model_name_or_path) if c and (Path(c) / "tokenizer_config.json").is_file()]
    if given or found:
        try:
            return load_tokenizer(given or found[0])
        except Exception as error:
            raise TrainingSetupError(f"Could not load the tokenizer {given or found[0]!r}: {error}") from error
    text_column = data_args.text_column
    saved = Path(training_args.output_dir) / TOKENIZER_SUBDIR
    vocab_size = model_args.tokenizer_vocab_size or config.vocab_size
    if vocab_size > config.vocab_size:
        raise TrainingSetupError(
            f"--tokenizer_vocab_size {vocab_size} is larger than the model's vocab_size {config.vocab_size}; lower it "
            f"or raise the model's with --config_overrides vocab_size={vocab_size}."
        )
    # The cached tokenizer is reused only when it was trained on the same data with the same vocabulary size, and
    # is readable (a kill or power loss may have truncated it); otherwise it is trained again.
    made_from = {
        "data": data_fingerprint(data_args.dataset_name, data_args.train_file),
        "dataset_config_name": data_args.dataset_config_name,
        "text_column": text_column,
        "vocab_size": vocab_size,
    }
    with training_args.main_process_first(desc="tokenizer training"):
        recorded = read_json(saved / TOKENIZER_RECORD)
        if (saved / "tokenizer.json").is_file():
            if recorded == made_from:
                try:
                    return load_tokenizer(saved)
                except Exception as error:  # any unreadable cache is retrained
                    logger.warning("The cached tokenizer %s is unreadable (%s): training it again.", saved, error)
            else:
                logger.warning(
                    "The cached tokenizer %s was made from other data or settings: training it again.", saved
                )
        # A stream is sampled: its first examples teach the merges.
        texts = source.train.take(TOKENIZER_STREAM_EXAMPLES) if dataset_length(source.train) is None else source.train
        tokenizer = train_bpe_tokenizer((row[text_column] for row in texts), vocab_size, length=dataset_length(texts))
        if training_args.process_index == 0:
            with atomic_folder(saved) as staging:
                tokenizer.save_pretrained(staging)
                write_json(staging / TOKENIZER_RECORD, made_from)
        return tokenizer


def _perplexity_trainer_class() -> type[Trainer]:
    from transformers import Trainer

    class PerplexityTrainer(RecordRunTrainerMixin, Trainer):
        """`Trainer` that logs the perplexity `exp(eval_loss)` beside every evaluation loss."""

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            for key in [k for k in logs if k.endswith("_loss") and k != "loss" and k != "train_loss"]:
                logs[key.removesuffix("_loss") + "_perplexity"] = perplexity(logs[key])
            super().log(logs, start_time)

    return PerplexityTrainer


def _token_chunks(blocks: Dataset | Mapping[str, Any]) -> list[np.ndarray]:
    """The token ids of a packed `Dataset` as flat NumPy arrays, one per Arrow chunk (no copy, no Python lists), or
    of a mapping `{"input_ids": [[...], ...]}` as one array."""
    import numpy as np

    if hasattr(blocks, "data") and hasattr(blocks.data, "column"):
        return [chunk.flatten().to_numpy() for chunk in blocks.data.column("input_ids").chunks]
    return [np.asarray(blocks["input_ids"], dtype=np.int64).ravel()]


def unigram_perplexity(
    train_blocks: Dataset | Mapping[str, Any], eval_blocks: Dataset | Mapping[str, Any], vocab_size: int
) -> float:
    """Perplexity on `eval_blocks` of the unigram model fitted to `train_blocks` (add-one smoothing): the baseline
    a language model has to beat. Counts the same target tokens as the LM's loss (all but the first of a block)."""
    import numpy as np

    counts = np.ones(vocab_size)
    for chunk in _token_chunks(train_blocks):
        counts += np.bincount(chunk, minlength=vocab_size)[:vocab_size]
    log_probs = np.log(counts / counts.sum())
    block_size = len(eval_blocks["input_ids"][0])
    targets = np.concatenate(_token_chunks(eval_blocks)).reshape(-1, block_size)[:, 1:]  # the LM loss's targets
    return math.exp(-float(log_probs[targets].sum()) / max(targets.size, 1))


def spread(dataset: Dataset, count: int) -> Dataset:
    """`count` examples of `dataset` evenly spaced from its first to its last (all of them if it has fewer): a
    sample of every document of a validation split, not its first few."""
    import numpy as np

    if count >= len(dataset):
        return dataset
    return dataset.select(np.linspace(0, len(dataset) - 1, count).round().astype(int).tolist())


def prepare_lm_training(
    model_args: LMModelArguments,
    data_args: TextDataArguments,
    training_args: TrainingArguments,
    *more: Any,
    **options: Any,
) -> TrainingRun:
    """Check every input, load and pack the data, build the model and the `Trainer`. Nothing is trained yet.
    `publish_args`, `callbacks`, `lora` and `optim` follow, as in `TrainingRun.begin`."""
    run = TrainingRun.begin("text-generation", "perplexity", model_args, data_args, training_args, *more, **options)
    with run.refusals_undone():  # a refusal leaves the output folder as the run found it
        _prepare_lm(run, model_args, data_args, training_args)
    return run


def _prepare_lm(
    run: TrainingRun, model_args: LMModelArguments, data_args: TextDataArguments, training_args: TrainingArguments
) -> None:
    """The preparation of `prepare_lm_training`, once its run has begun."""
    import torch
    from transformers import AutoModelForCausalLM, default_data_collator

    config = run.build_config(AutoModelForCausalLM, DEFAULT_LM_PRESET)
    block_size = data_args.block_size or min(512, config.max_position_embeddings)
    if not 2 <= block_size <= config.max_position_embeddings:
        raise TrainingSetupError(
            f"--block_size must be in [2, max_position_embeddings={config.max_position_embeddings}], got {block_size}."
        )
    source = load_text_source(data_args)  # bad data is refused before the output folder is touched
    run.start(
        config,
        data_fingerprint(data_args.dataset_name, data_args.train_file, data_args.validation_file)
        + [f"{data_args.dataset_config_name}", data_args.text_column],
        block_size=block_size,
        tokenizer=model_args.tokenizer_name_or_path or model_args.tokenizer_vocab_size,
    )
    run.source = source
    tokenizer = load_or_train_tokenizer(model_args, config, source, training_args, run.resume, data_args)
    if len(tokenizer) > config.vocab_size:  # every token id must index the model's embedding
        raise TrainingSetupError(
            f"The tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {config.vocab_size}: token ids "
            f"would overflow the embedding. Use a smaller tokenizer or, for a new model, --config_overrides "
            f"vocab_size={len(tokenizer)}"
        )
    if not model_args.model_name_or_path:  # a new model speaks its tokenizer's special tokens (GPT-2's are 50256)
        for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
            if getattr(tokenizer, name, None) is not None:
                setattr(config, name, getattr(tokenizer, name))
    add_eos = source.documents and tokenizer.eos_token_id is not None

    def pack(split: str, desc: str) -> Dataset | IterableDataset:  # split: "train", "validation" or "test"
        text_column, workers = data_args.text_column, data_args.preprocessing_num_workers
        data, origin = getattr(source, split), source.origins.get(split)
        return tokenize_and_pack(data, tokenizer, block_size, text_column, add_eos, workers, desc, origin=origin)

    with training_args.main_process_first(desc="tokenization"):
        train = pack("train", "training text")
        validation = pack("validation", "validation text") if source.validation is not None else None
    if source.test is not None:
        run.test = lambda: pack("test", "test text")
    if data_args.max_train_samples is not None:
        train = (
            train.take(data_args.max_train_samples)
            if data_args.streaming
            else train.select(range(min(len(train), data_args.max_train_samples)))
        )
    if validation is not None and data_args.max_eval_samples is not None:
        validation = spread(validation, data_args.max_eval_samples)
    if not data_args.streaming and len(train) == 0:
        raise TrainingSetupError(
            f"The training text gives no complete block of {block_size} tokens; lower --block_size or add text."
        )
    if validation is not None and len(validation) == 0:
        logger.warning("The validation text is shorter than one block of %d tokens: no validation.", block_size)
        validation = None
    run.summary = {"block size (tokens)": block_size, "tokenizer vocabulary": len(tokenizer)}
    if validation is not None and not data_args.streaming:
        baseline = unigram_perplexity(train, validation, config.vocab_size)
        run.extra_metrics["eval_unigram_perplexity"] = baseline
        run.summary["unigram baseline perplexity (validation)"] = round(baseline, 2)
    model = run.load_model(config)
    # Evaluation needs the loss only: gathering the logits would hold blocks x block size x vocabulary floats (8 GB
    # for 1,000 blocks of 256 tokens over 8,192 tokens) and compute nothing from them.
    training_args.prediction_loss_only = True
    torch.set_float32_matmul_precision("high")
    run.make_trainer(
        _perplexity_trainer_class(), model, train, validation, tokenizer, data_collator=default_data_collator
    )


run_lm_training = run_training  # train, evaluate, write the final hub-ready folder (and push it if asked)
LM_ARGUMENTS = (LMModelArguments, TextDataArguments, PublishArguments, LoraArguments, OptimizerArguments)


def train_lm(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Train an AoT causal LM end to end (see the module docstring) and return its metrics; takes the arguments of
    `prepare_lm_training`."""
    return run_training(prepare_lm_training(*args, **kwargs))


def parse_lm_arguments(argv: list[str] | None = None) -> tuple[Any, ...]:
    """Parse `(*LM_ARGUMENTS, TrainingArguments)` as `arguments.parse_dataclasses` does."""
    return parse_dataclasses(LM_ARGUMENTS, argv)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (`aot train lm`, `python -m aot_transformers.training.lm`)."""
    return run_main(prepare_lm_training, LM_ARGUMENTS, argv, prog="aot train lm")


if __name__ == "__main__":
    sys.exit(main())
