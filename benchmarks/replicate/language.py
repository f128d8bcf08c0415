"""Comparison 1 (and the language half of 3): GPT-2 vs AoT causal LMs trained identically on the same tokens.

Data, tokenizer and packing come from `aot_transformers.training` (the path `aot train lm` takes), training is
`transformers.Trainer` with one set of arguments for every row, and the zero-shot numbers come from
`aot_transformers.evaluation` (the scorer and task runner behind `aot eval lm`) on the local dev files.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .models import Row, build_causal_lm, count_parameters

logger = logging.getLogger(__name__)

ZERO_SHOT_TASKS = ("ptb", "lambada", "lambada_acc")
NOT_LOCAL_TASKS = ("wikitext", "cbt_cn", "cbt_ne")  # no local dev files in ../shared/data/eval-dev


@dataclass
class LanguageData:
    """Everything the rows share: tokenizer, packed blocks, zero-shot data."""

    tokenizer: Any
    train: Any
    validation: Any
    description: str
    train_tokens_available: int
    unigram_loss: float  # validation loss of the unigram model of the training tokens: the floor to beat
    zero_shot: dict[str, tuple[Any, Any]]  # dataset key -> (data, source)
    zero_shot_error: str | None


def load_tokenizer(path: Path):
    """A tokenizer folder; a bare GPT-2 `vocab.json` + `merges.txt` pair (as in ../shared/data/tokenizer-gpt2) loads
    as `GPT2TokenizerFast` (AutoTokenizer cannot tell its class without a tokenizer_config.json)."""
    from transformers import AutoTokenizer, GPT2TokenizerFast

    path = Path(path)
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file() and not (path / "tokenizer.json").is_file():
        return GPT2TokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def prepare_language_data(plan, text_path: Path, tokenizer_path: Path, eval_dir: Path) -> LanguageData:
    """Tokenize and pack the training text with GPT-2's tokenizer (validation: the package's held-out last 5% of
    the lines), and load the zero-shot data (PTB cut to its first `plan.ptb_sentences` sentences)."""
    from aot_transformers.evaluation import EvaluationError, load_source, resolve_sources
    from aot_transformers.training import TextDataArguments, load_text_source, tokenize_and_pack, unigram_perplexity

    tokenizer = load_tokenizer(tokenizer_path)
    args = TextDataArguments(train_file=[str(text_path)], block_size=plan.block_size)
    source = load_text_source(args)
    train_text, validation_text = source.train, source.validation
    if plan.max_train_lines is not None:
        train_text = train_text.select(range(min(len(train_text), plan.max_train_lines)))
        validation_text = validation_text.select(range(min(len(validation_text), plan.max_train_lines)))
    add_eos = source.documents and tokenizer.eos_token_id is not None
    train = tokenize_and_pack(train_text, tokenizer, plan.block_size, "text", add_eos, desc="training text")
    validation = tokenize_and_pack(validation_text, tokenizer, plan.block_size, "text", add_eos, desc="validation")
    validation = validation.select(range(min(len(validation), plan.eval_blocks)))

    zero_shot: dict[str, tuple[Any, Any]] = {}
    error = None
    try:
        sources = resolve_sources(list(ZERO_SHOT_TASKS), data_dir=eval_dir)
        for key, data_source in sources.items():
            data = load_source(data_source)
            if key == "ptb":  # one document, one sentence a line: keep the first sentences
                data = ["\n".join(data[0].splitlines()[: plan.ptb_sentences]) + "\n"]
            elif key == "lambada":
                data = data[: plan.lambada_passages]
            zero_shot[key] = (data, data_source)
    except EvaluationError as failure:  # e.g. no local files and no internet
        error = str(failure)
        logger.warning("Zero-shot data unavailable: %s", error)
    unigram_loss = math.log(unigram_perplexity(train, validation, len(tokenizer)))
    return LanguageData(
        tokenizer, train, validation, source.description, len(train) * plan.block_size, unigram_loss, zero_shot, error
    )


def training_arguments(plan, output_dir: Path, seed: int):
    """One `TrainingArguments` for every row: AdamW, cosine schedule with linear warm-up, clipping at 1."""
    from transformers import TrainingArguments

    eval_steps = max(1, plan.max_steps // plan.evaluations)
    return TrainingArguments(
        output_dir=str(output_dir),
        max_steps=plan.max_steps,
        per_device_train_batch_size=plan.batch_size,
        per_device_eval_batch_size=max(plan.batch_size, 16),
        learning_rate=plan.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=plan.warmup_ratio,
        weight_decay=plan.weight_decay,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        eval_strategy="steps",
        eval_steps=eval_steps,
        logging_steps=max(1, plan.max_steps // 25),
        save_strategy="no",
        report_to=[],
        seed=seed,
        data_seed=seed,
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )


def _quiet(trainer) -> None:
    """No per-log printing: the benchmark prints one line per run."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def zero_shot_suite(model, data: LanguageData, plan) -> dict[str, dict[str, Any]]:
    """The local zero-shot tasks on a trained model, with the package's scorer (window = the model's context)."""
    from aot_transformers.evaluation import TASKS, LanguageModelScorer, run_task

    if not data.zero_shot:
        return {}
    model.eval()
    scorer = LanguageModelScorer(model, data.tokenizer, batch_size=16)
    results = {}
    for task in ZERO_SHOT_TASKS:
        dataset, source = data.zero_shot[TASKS[task].dataset]
        results[task] = run_task(scorer, task, dataset, source).to_dict()
    return results


def train_language_row(row: Row, seed: int, plan, data: LanguageData, run_dir: Path) -> dict[str, Any]:
    """Train one row with one seed; return its curves, held-out loss, zero-shot numbers and timings."""
    from transformers import Trainer, default_data_collator, set_seed

    set_seed(seed)
    model = build_causal_lm(row, len(data.tokenizer), plan.knn_k, data.tokenizer.eos_token_id)
    args = training_arguments(plan, run_dir, seed)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.validation,
        data_collator=default_data_collator,
    )
    _quiet(trainer)
    start = time.perf_counter()
    train_output = trainer.train()
    train_seconds = time.perf_counter() - start
    final = trainer.evaluate()
    start = time.perf_counter()
    zero_shot = zero_shot_suite(model, data, plan)
    history = trainer.state.log_history
    return {
        "row": row.name,
        "label": row.label,
        "seed": seed,
        "knn": row.knn,
        "parameters": count_parameters(model),
        "tokens": plan.max_steps * plan.batch_size * plan.block_size,
        "train_seconds": train_seconds,
        "train_loss": train_output.training_loss,
        "eval_loss": final["eval_loss"],
        "curve": {
            "train": [(e["step"], e["loss"]) for e in history if "loss" in e],
            "eval": [(e["step"], e["eval_loss"]) for e in history if "eval_loss" in e],
        },
        "zero_shot": zero_shot,
        "zero_shot_seconds": time.perf_counter() - start,
    }


def training_step_closure(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    """One forward + backward + AdamW step of `model` on a fixed batch, for side-by-side timing."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def time_language_rows(rows: list[Row], plan, data: LanguageData) -> dict[str, float]:
    """Seconds per training step of every row, measured in interleaved rounds (best of `timing_rounds`) so that a
    change in the machine's load hits all rows alike."""
    from transformers import set_seed

    from .._common import interleaved_best_times

    blocks = data.train.select(range(plan.batch_size))
    ids = torch.tensor(blocks["input_ids"])  # (B, T)
    batch = {"input_ids": ids, "labels": ids}
    steps = {}
    for row in rows:
        set_seed(0)
        model = build_causal_lm(row, len(data.tokenizer), plan.knn_k, data.tokenizer.eos_token_id)
        steps[row.name] = training_step_closure(model, batch)
    return interleaved_best_times(steps, rounds=plan.timing_rounds, warmup=1)
