"""Causal-LM pretraining and fine-tuning of AoT models with `transformers.Trainer`.

Runs as `aot train lm …`, `python -m aot_transformers.training.lm …`, `torchrun --nproc_per_node N -m
aot_transformers.training.lm …` and `accelerate launch --multi_gpu -m aot_transformers.training.lm …` (plus `--use_cpu`
without GPUs) with the same arguments:
the three dataclasses below plus every `TrainingArguments` flag. All input is checked (data, columns, preset,
tokenizer against the model, block size) before the first training step.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import atomic_folder, read_json, write_json
from .arguments import (
    ModelArguments,
    PublishArguments,
    TrainingSetupError,
    check_checkpoint_weights,
    use_training_attention,
)
from .distributed import enable_fsdp_on_cpu
from .finish import HubPlan, finish_run, hub_checkpoint_callback, perplexity, take_over_hub_options, training_summary
from .lora import LoraArguments
from .optim import OptimizerArguments, optimizer_cls_and_kwargs
from .run_state import (
    RecordRunTrainerMixin,
    data_fingerprint,
    run_identity,
    run_state_callbacks,
    start_run,
    train_unless_finished,
)
from .text_data import TextDataArguments, load_text_source, tokenize_and_pack

logger = logging.getLogger(__name__)

DEFAULT_LM_PRESET = "aot-mssa-l-tiny"
TOKENIZER_SUBDIR = "tokenizer"
TOKENIZER_STREAM_EXAMPLES = 100_000
TOKENIZER_RECORD = "aot_tokenizer.json"  # what the cached tokenizer was trained on


@dataclass
class LMModelArguments(ModelArguments):
    """Which model to train (see `ModelArguments`; default preset aot-mssa-l-tiny) and with which tokenizer."""

    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A tokenizer folder or Hub id (default: the checkpoint's, else train a byte-level BPE)."},
    )
    tokenizer_vocab_size: int | None = field(
        default=None, metadata={"help": "Vocabulary of the trained BPE (default: the model's vocab_size)."}
    )


@dataclass
class LMRun:
    """Everything set up for a run, before training: `trainer.train(resume_from_checkpoint=resume)` starts it."""

    trainer: Any
    tokenizer: Any
    resume: str | None
    hub: HubPlan
    source: Any
    block_size: int
    unigram_perplexity: float | None
    model_args: LMModelArguments
    data_args: TextDataArguments
    training_args: Any
    publish_args: PublishArguments
    lora: LoraArguments | None = None
    lock: Any = None  # the output folder's lock, held until the run ends


def load_or_train_tokenizer(
    model_args: LMModelArguments, config, source, training_args, resume: str | None, data_args: TextDataArguments
):
    """The tokenizer of the run: given, the checkpoint's, the resumed run's, or a byte-level BPE trained on the
    training text (by the main process; saved under `<output_dir>/tokenizer` for the others and for resuming)."""
    from .tokenizer import load_tokenizer

    candidates = [model_args.tokenizer_name_or_path]
    if not model_args.tokenizer_name_or_path:
        candidates += [resume, model_args.model_name_or_path]
    for candidate in candidates:
        if not candidate:
            continue
        if candidate == model_args.tokenizer_name_or_path or (Path(candidate) / "tokenizer_config.json").is_file():
            if candidate.startswith((".", "/", "~")) and not Path(candidate).exists():
                raise TrainingSetupError(f"--tokenizer_name_or_path {candidate}: no such folder.")
            try:
                return load_tokenizer(candidate)
            except Exception as error:
                raise TrainingSetupError(f"Could not load the tokenizer {candidate!r}: {error}") from error
    from .tokenizer import train_bpe_tokenizer

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
                except Exception as error:  # noqa: BLE001 - any unreadable cache is retrained
                    logger.warning("The cached tokenizer %s is unreadable (%s): training it again.", saved, error)
            else:
                logger.warning(
                    "The cached tokenizer %s was made from other data or settings: training it again.", saved
                )
        # A stream is sampled: its first examples teach the merges.
        texts = source.train.take(TOKENIZER_STREAM_EXAMPLES) if _length(source.train) is None else source.train
        tokenizer = train_bpe_tokenizer(
            (row[text_column] for row in texts), vocab_size=vocab_size, length=_length(texts), show_progress=True
        )
        if training_args.process_index == 0:
            with atomic_folder(saved) as staging:
                tokenizer.save_pretrained(staging)
                write_json(staging / TOKENIZER_RECORD, made_from)
        return tokenizer


def _length(dataset) -> int | None:
    try:
        return len(dataset)
    except TypeError:
        return None


def check_tokenizer_fits(tokenizer, config) -> None:
    """Every token id must index the model's embedding: `len(tokenizer) <= config.vocab_size`."""
    size = len(tokenizer)
    if size > config.vocab_size:
        raise TrainingSetupError(
            f"The tokenizer has {size} tokens but the model's vocab_size is {config.vocab_size}: token ids would "
            "overflow the embedding. Use a smaller tokenizer or, for a new model, "
            f"--config_overrides vocab_size={size}"
        )


def _perplexity_trainer_class():
    from transformers import Trainer

    class PerplexityTrainer(RecordRunTrainerMixin, Trainer):
        """`Trainer` that logs the perplexity `exp(eval_loss)` beside every evaluation loss."""

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            for key in [k for k in logs if k.endswith("_loss") and k != "loss" and k != "train_loss"]:
                logs[key.removesuffix("_loss") + "_perplexity"] = perplexity(logs[key])
            super().log(logs, start_time)

    return PerplexityTrainer


def unigram_perplexity(train_blocks, eval_blocks, vocab_size: int) -> float:
    """Perplexity on `eval_blocks` of the unigram model fitted to `train_blocks` (add-one smoothing): the baseline
    a language model has to beat. Counts the same target tokens as the LM's loss (all but the first of a block)."""
    import numpy as np

    counts = np.ones(vocab_size, dtype=np.float64)
    for block in train_blocks["input_ids"]:
        counts += np.bincount(np.asarray(block), minlength=vocab_size)[:vocab_size]
    log_probs = np.log(counts / counts.sum())
    total, count = 0.0, 0
    for block in eval_blocks["input_ids"]:
        targets = np.asarray(block[1:])
        total -= float(log_probs[targets].sum())
        count += targets.size
    return math.exp(total / max(count, 1))


def prepare_lm_training(
    model_args: LMModelArguments,
    data_args: TextDataArguments,
    training_args,
    publish_args: PublishArguments | None = None,
    callbacks: list | None = None,
    lora: LoraArguments | None = None,
    optim: OptimizerArguments | None = None,
) -> LMRun:
    """Check every input, load and pack the data, build the model and the `Trainer`. Nothing is trained yet."""
    import torch
    from transformers import default_data_collator, set_seed

    from ..modeling_aot import AoTForCausalLM

    publish_args = publish_args or PublishArguments()
    if lora is not None:
        lora.check()
        lora = lora if lora.enabled else None
    optimizer = optimizer_cls_and_kwargs(optim, training_args)
    if lora is not None and training_args.fsdp:
        raise TrainingSetupError("LoRA adapters are trained without FSDP here; drop --fsdp", argument="--lora_r")
    hub = take_over_hub_options(training_args, publish_args)
    config = model_args.build_config(DEFAULT_LM_PRESET)
    check_checkpoint_weights(model_args.model_name_or_path, AoTForCausalLM, config)
    if lora is not None:  # before any data is read
        import torch

        from .lora import check_lora_targets

        with torch.device("meta"):
            check_lora_targets(AoTForCausalLM(config), lora)
        lora.check_base(model_args.model_name_or_path)
    if data_args.streaming and training_args.max_steps <= 0:
        raise TrainingSetupError("--streaming has no length to plan epochs with: give --max_steps.")
    block_size = data_args.block_size or min(512, config.max_position_embeddings)
    if not 2 <= block_size <= config.max_position_embeddings:
        raise TrainingSetupError(
            f"--block_size must be in [2, max_position_embeddings={config.max_position_embeddings}], got {block_size}."
        )
    identity = run_identity(
        training_args,
        config,
        data_fingerprint(data_args.dataset_name, data_args.train_file, data_args.validation_file)
        + [f"{data_args.dataset_config_name}", data_args.text_column],
        block_size=block_size,
        tokenizer=model_args.tokenizer_name_or_path or model_args.tokenizer_vocab_size,
        base_model=model_args.model_name_or_path,
        lora=lora.lora_r if lora is not None else None,
    )
    lock, resume = start_run(training_args, publish_args, identity)
    set_seed(training_args.seed)
    source = load_text_source(data_args, seed=training_args.seed)
    tokenizer = load_or_train_tokenizer(model_args, config, source, training_args, resume, data_args)
    check_tokenizer_fits(tokenizer, config)
    if not model_args.model_name_or_path:
        for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
            if getattr(config, name, None) is None and getattr(tokenizer, name, None) is not None:
                setattr(config, name, getattr(tokenizer, name))
    add_eos = source.documents and tokenizer.eos_token_id is not None
    with training_args.main_process_first(desc="tokenization"):
        train = tokenize_and_pack(
            source.train,
            tokenizer,
            block_size,
            data_args.text_column,
            add_eos,
            data_args.preprocessing_num_workers,
            "training text",
        )
        validation = None
        if source.validation is not None:
            validation = tokenize_and_pack(
                source.validation,
                tokenizer,
                block_size,
                data_args.text_column,
                add_eos,
                data_args.preprocessing_num_workers,
                "validation text",
            )
    if data_args.max_train_samples is not None:
        train = (
            train.take(data_args.max_train_samples)
            if data_args.streaming
            else train.select(range(min(len(train), data_args.max_train_samples)))
        )
    if validation is not None and data_args.max_eval_samples is not None:
        validation = validation.select(range(min(len(validation), data_args.max_eval_samples)))
    if not data_args.streaming and len(train) == 0:
        raise TrainingSetupError(
            f"The training text gives no complete block of {block_size} tokens; lower --block_size or add text."
        )
    if validation is not None and len(validation) == 0:
        logger.warning("The validation text is shorter than one block of %d tokens: no validation.", block_size)
        validation = None
    if validation is None and training_args.eval_strategy != "no":
        training_args.eval_strategy = "no"
    baseline = None
    if validation is not None and not data_args.streaming:
        baseline = unigram_perplexity(train, validation, config.vocab_size)

    if model_args.model_name_or_path:
        model = AoTForCausalLM.from_pretrained(model_args.model_name_or_path, config=config)
    else:
        model = AoTForCausalLM(config)
    model.config.use_cache = False  # no cache while training; generation turns it back on
    use_training_attention(model, training_args)
    if lora is not None:
        from .lora import apply_lora

        model = apply_lora(model, lora, "text-generation")
    logger.info("Model: %s parameters", f"{sum(p.numel() for p in model.parameters()):,}")
    torch.set_float32_matmul_precision("high")
    hub_callback = hub_checkpoint_callback(hub)
    trainer = _perplexity_trainer_class()(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=validation,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        optimizer_cls_and_kwargs=optimizer,
        callbacks=[*(callbacks or []), *run_state_callbacks(), *([hub_callback] if hub_callback else [])],
    )
    trainer.run_record = identity
    enable_fsdp_on_cpu(trainer)
    return LMRun(
        trainer,
        tokenizer,
        resume,
        hub,
        source,
        block_size,
        baseline,
        model_args,
        data_args,
        training_args,
        publish_args,
        lora,
        lock,
    )


def run_lm_training(run: LMRun) -> dict[str, Any]:
    """Train, evaluate, write the final hub-ready folder (and push it if asked). Returns the metrics."""
    try:
        return _train_and_finish(run)
    finally:
        if run.lock is not None:
            run.lock.release()


def _train_and_finish(run: LMRun) -> dict[str, Any]:
    trainer, training_args = run.trainer, run.training_args
    metrics = train_unless_finished(trainer, run.resume)
    results = []
    if trainer.eval_dataset is not None:
        eval_metrics = trainer.evaluate()
        eval_metrics["eval_perplexity"] = perplexity(eval_metrics["eval_loss"])
        metrics.update(eval_metrics)
        name = run.source.name
        results.append(
            {
                "metric": "perplexity",
                "value": eval_metrics["eval_perplexity"],
                "split": "validation",
                "dataset": name,
                "dataset_type": name,
            }
        )
        if run.unigram_perplexity is not None:
            metrics["eval_unigram_perplexity"] = run.unigram_perplexity
    trainer.accelerator.unwrap_model(trainer.model).config.use_cache = True
    training = training_summary(
        training_args, trainer, {"block size (tokens)": run.block_size, "tokenizer vocabulary": len(run.tokenizer)}
    )
    if run.unigram_perplexity is not None:
        training["unigram baseline perplexity (validation)"] = round(run.unigram_perplexity, 2)
    return finish_run(
        trainer,
        training_args,
        run.publish_args,
        run.hub,
        task="text-generation",
        processor=run.tokenizer,
        metrics=metrics,
        results=results,
        datasets=run.source.hub_ids,
        dataset_description=run.source.description,
        training=training,
        base_model=run.model_args.model_name_or_path,
        lora=run.lora,
    )


def train_lm(
    model_args: LMModelArguments,
    data_args: TextDataArguments,
    training_args,
    publish_args: PublishArguments | None = None,
    callbacks: list | None = None,
    lora: LoraArguments | None = None,
    optim: OptimizerArguments | None = None,
) -> dict[str, Any]:
    """Train an AoT causal LM end to end (see the module docstring) and return its metrics."""
    return run_lm_training(
        prepare_lm_training(model_args, data_args, training_args, publish_args, callbacks, lora=lora, optim=optim)
    )


def parse_lm_arguments(argv: list[str] | None = None):
    """Parse `(LMModelArguments, TextDataArguments, PublishArguments, LoraArguments, OptimizerArguments,
    TrainingArguments)` from the command line, from a single .json / .yaml file, or from a recipe file followed by
    overriding flags."""
    from .arguments import parse_dataclasses

    return parse_dataclasses(
        (LMModelArguments, TextDataArguments, PublishArguments, LoraArguments, OptimizerArguments), argv
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (`aot train lm`, `python -m aot_transformers.training.lm`)."""
    from .arguments import run_with_clear_errors

    def job():
        model_args, data_args, publish_args, lora, optim, training_args = parse_lm_arguments(argv)
        return train_lm(model_args, data_args, training_args, publish_args, lora=lora, optim=optim)

    return run_with_clear_errors(job, prog="aot train lm")


if __name__ == "__main__":
    sys.exit(main())
