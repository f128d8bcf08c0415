"""Zero-shot evaluation of causal language models: the AoT paper's suite, with our runner or lm-evaluation-harness.

The suite (Wang et al., ICML 2025, Table 3; the GPT-2 paper's zero-shot protocol): validation loss on WikiText,
PTB and LAMBADA, LAMBADA last-word accuracy with greedy decoding, and Children's Book Test accuracy on common nouns
and named entities (10 candidates). Any causal LM works — AoT, GPT-2, ... — so comparisons are one command:

    aot eval lm path/to/model --tasks ptb,lambada,lambada_acc --data-dir ../shared/data/eval-dev

From Python:

    from aot_transformers.evaluation import evaluate_model, write_results
    report = evaluate_model("path/to/model", ["ptb", "lambada_acc"], data_dir="../shared/data/eval-dev")
    write_results(report, "eval_results/model")

The same tasks exist as an lm-evaluation-harness folder (`lm_eval_tasks_path()`; see its README.md), with numbers
that agree with ours.
"""

from __future__ import annotations

from pathlib import Path

from ..model_card import eval_results
from .data import (
    ClozeExample,
    DataFormatError,
    EvaluationError,
    EvaluationFailed,
    read_cbt,
    read_lambada,
    read_ptb,
    read_wikitext,
)
from .results import markdown_table, read_results, update_model_card, write_results
from .runner import EvaluationReport, evaluate_model, load_model_and_tokenizer
from .scoring import LanguageModelScorer, rolling_windows
from .tasks import DATASETS, TASKS, load_source, resolve_sources, run_task


def lm_eval_tasks_path() -> Path:
    """The folder of our lm-evaluation-harness tasks: pass it to `lm_eval --include_path`."""
    return Path(__file__).resolve().parent / "lm_eval_tasks"


__all__ = [
    "DATASETS",
    "TASKS",
    "ClozeExample",
    "DataFormatError",
    "EvaluationError",
    "EvaluationFailed",
    "EvaluationReport",
    "LanguageModelScorer",
    "eval_results",
    "evaluate_model",
    "lm_eval_tasks_path",
    "load_model_and_tokenizer",
    "load_source",
    "markdown_table",
    "read_cbt",
    "read_lambada",
    "read_ptb",
    "read_results",
    "read_wikitext",
    "resolve_sources",
    "rolling_windows",
    "run_task",
    "update_model_card",
    "write_results",
]
