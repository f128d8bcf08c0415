"""Write evaluation results into a model card: `model-index` metadata (`huggingface_hub.EvalResult`) and a table.

Existing card content is kept: results of other datasets or metrics stay, results of the same task, dataset and
metric are replaced, and the markdown table lives between two HTML comments so a later run replaces it in place.
"""

from __future__ import annotations

import os
from pathlib import Path

from .data import EvaluationError
from .results import _atomic_write, markdown_table
from .runner import EvaluationReport
from .tasks import DATASETS, TASKS

SECTION_START = "<!-- aot-eval:start -->"
SECTION_END = "<!-- aot-eval:end -->"
SOURCE_NAME = "aot eval (aot-transformers)"

# (metric key in results, model-index metric type, display name)
_CARD_METRICS = {
    "perplexity": (
        ("loss", "loss", "Loss (nats/token)"),
        ("perplexity", "perplexity", "Perplexity"),
        ("bits_per_byte", "bits_per_byte", "Bits per byte"),
    ),
    "last_word": (
        ("acc", "accuracy", "Accuracy (greedy last word)"),
        ("last_word_perplexity", "last_word_perplexity", "Last-word perplexity"),
    ),
    "cloze": (("acc", "accuracy", "Accuracy"), ("acc_norm", "accuracy_norm", "Accuracy (length-normalised)")),
}
# model-index groups results by task type and dataset, so one task name serves every metric of a dataset.
TASK_NAME = "Zero-shot evaluation"


def eval_results(report: EvaluationReport) -> list:
    """The `huggingface_hub.EvalResult`s of a report, one per (task, metric)."""
    from huggingface_hub import EvalResult

    # How the number was measured (model-index has no free-form source without a URL).
    settings = {
        "tool": SOURCE_NAME,
        "max_length": report.settings.get("max_length"),
        "stride": report.settings.get("stride"),
    }
    results = []
    for task_name, result in report.results.items():
        if task_name not in TASKS:
            continue
        task = TASKS[task_name]
        dataset = DATASETS[task.dataset]
        source = result.get("source", {})
        if source.get("type") == "hub":
            dataset_kwargs = dict(
                dataset_type=source["path"],
                dataset_name=dataset.title,
                dataset_config=source.get("name"),
                dataset_split=source.get("split"),
            )
        else:
            file_name = Path(source.get("path", "")).name or "local file"
            dataset_kwargs = dict(
                dataset_type=dataset.hub.path,
                dataset_name=f"{dataset.title} ({file_name})",
                dataset_args={"data_file": file_name},
            )
        for key, metric_type, metric_name in _CARD_METRICS[task.kind]:
            if result.get(key) is None:
                continue
            results.append(
                EvalResult(
                    task_type="text-generation",
                    task_name=TASK_NAME,
                    metric_type=metric_type,
                    metric_name=metric_name,
                    metric_value=round(float(result[key]), 6),
                    metric_args=settings,
                    **dataset_kwargs,
                )
            )
    return results


def _key(result) -> tuple:
    """What identifies a number in model-index (the task name is not kept per metric, so it is left out)."""
    return (
        result.task_type,
        result.dataset_type,
        result.dataset_name,
        result.dataset_config,
        result.dataset_split,
        result.metric_type,
    )


def _with_section(text: str, section: str) -> str:
    block = f"{SECTION_START}\n{section.rstrip()}\n{SECTION_END}"
    if SECTION_START in text and SECTION_END in text:
        before, rest = text.split(SECTION_START, 1)
        _, after = rest.split(SECTION_END, 1)
        return before + block + after
    return text.rstrip() + "\n\n## Zero-shot evaluation\n\n" + block + "\n"


def update_model_card(card_path: str | os.PathLike, report: EvaluationReport, model_name: str | None = None) -> Path:
    """Add the report to the card at `card_path` (a `README.md`, or a model folder holding one); create it if needed.

    Args:
        card_path: The card file, or the model folder (its `README.md`).
        report: Results of `evaluate_model`.
        model_name: Name in `model-index` when the card has none (default: the folder's name).

    Returns:
        The path of the written card.
    """
    from huggingface_hub import ModelCard, ModelCardData

    path = Path(card_path)
    if path.is_dir() or path.suffix.lower() != ".md":
        path = path / "README.md"
    if not path.parent.is_dir():
        raise EvaluationError(f"cannot write a model card into {path.parent}: not a folder.")
    if path.exists():
        card = ModelCard.load(path)
    else:
        data = ModelCardData(library_name="transformers", tags=["aot", "zero-shot-evaluation"])
        card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n# {model_name or path.parent.name}\n")
    new = eval_results(report)
    replaced = {_key(result) for result in new}
    kept = [result for result in (card.data.eval_results or []) if _key(result) not in replaced]
    card.data.eval_results = kept + new
    if not card.data.model_name:
        card.data.model_name = model_name or path.parent.resolve().name
    table = markdown_table([report], names=[card.data.model_name])
    note = (
        f"Measured with `aot eval lm` (window {report.settings.get('max_length')}, stride "
        f"{report.settings.get('stride')}); losses are mean token cross-entropy in nats.\n\n"
    )
    card.text = _with_section(card.text, note + table)
    _atomic_write(path, str(card))
    return path


__all__ = ["SECTION_END", "SECTION_START", "eval_results", "update_model_card"]
