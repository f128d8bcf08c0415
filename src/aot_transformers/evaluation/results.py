"""Results files: `results.json` and a markdown table in the layout of the AoT paper's Table 3.

One `results.json` format for every folder the package writes: `aot eval lm` writes an `EvaluationReport`, and a
training run writes the same keys (`aot_transformers.model_card.training_results_json`); `read_results` reads both.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

from .._io import atomic_write_text
from ..errors import RunError
from ..model_card import add_eval_results, read_results_file
from .data import EvaluationError
from .runner import EvaluationReport

# Columns of the paper's Table 3: (task, metric, header). Losses are mean token cross-entropy in nats.
TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("lambada", "loss", "LAMBADA loss ↓"),
    ("ptb", "loss", "PTB loss ↓"),
    ("wikitext", "loss", "WikiText loss ↓"),
    ("lambada_acc", "acc", "LAMBADA acc ↑"),
    ("cbt_cn", "acc", "CBT-CN acc ↑"),
    ("cbt_ne", "acc", "CBT-NE acc ↑"),
)

# Every metric per task for the detailed table.
DETAIL_METRICS = ("loss", "perplexity", "bits_per_byte", "acc", "acc_norm", "last_word_perplexity")


def _format(value: object, metric: str) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "?"  # read_results refuses such files; a hand-made report must not crash the table
    if not math.isfinite(value):
        return "not finite"  # never a number that looks like a result (write_results refuses such reports)
    if metric in ("acc", "acc_norm"):
        return f"{100 * value:.2f}%"
    return f"{value:.3f}" if abs(value) < 1e4 else f"{value:.4g}"


def _parameters(report: EvaluationReport) -> str:
    count = report.model_info.get("num_parameters")
    if isinstance(count, bool) or not isinstance(count, (int, float)) or not math.isfinite(count) or not count:
        return "–"
    return f"{count / 1e6:.2f}M"


def markdown_table(reports: Sequence[EvaluationReport], names: Sequence[str] | None = None) -> str:
    """One row per model with the paper's six numbers (– where a task was not run), then a detailed table.

    Args:
        reports: The models to compare.
        names: Row labels (default: each report's `model`).
    """
    names = list(names) if names is not None else [report.model for report in reports]
    header = ["Model", "Params", *(column[2] for column in TABLE_COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, report in zip(names, reports, strict=True):
        cells = [name, _parameters(report)]
        cells += [_format(report.results.get(task, {}).get(metric), metric) for task, metric, _ in TABLE_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")

    lines += [
        "",
        "| Model | Task | Data | " + " | ".join(DETAIL_METRICS) + " | Tokens | Seconds |",
        "|" + "---|" * (len(DETAIL_METRICS) + 5),
    ]
    for name, report in zip(names, reports, strict=True):
        for task, result in report.results.items():
            source = result.get("source", {})
            path = str(source.get("path") or "")
            where = Path(path).name if source.get("type") == "file" else path
            if source.get("type") == "hub":
                where = f"{where} ({source.get('name') or ''} {source.get('split') or ''})".replace("( ", "(")
            cells = [name, task, where, *(_format(result.get(m), m) for m in DETAIL_METRICS)]
            seconds = result.get("seconds")
            finite = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds)
            cells += [str(result.get("tokens", "–")), f"{seconds:.1f}" if finite else "–"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


class NonFiniteMetricError(RunError):
    """An evaluation produced a NaN or infinite metric (a diverged model): it is never written into a results table
    or a model card (exit code 1)."""


def check_finite(report: EvaluationReport) -> None:
    """Raise `NonFiniteMetricError` naming every metric of `report` that is a NaN or an infinity."""
    found = [
        f"{task}.{metric}={value}"
        for task, result in report.results.items()
        for metric, value in result.items()
        if isinstance(value, float) and not math.isfinite(value)
    ]
    if found:
        raise NonFiniteMetricError(
            f"the evaluation of {report.model} gave non-finite metrics ({', '.join(found)}): the model's outputs are "
            "not finite (a diverged training run?). Nothing was written: earlier results files and the model card "
            "are unchanged."
        )


def write_results(report: EvaluationReport, output_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write `results.json` and `results.md` into `output_dir` (atomically); returns both paths.

    Raises:
        NonFiniteMetricError: A metric is NaN or infinite; nothing is written.
    """
    check_finite(report)
    output = Path(output_dir)
    json_path, markdown_path = output / "results.json", output / "results.md"
    payload = json.dumps(report.to_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n"
    atomic_write_text(json_path, payload)
    atomic_write_text(markdown_path, f"# Zero-shot evaluation of {report.model}\n\n{markdown_table([report])}")
    return json_path, markdown_path


def read_results(path: str | os.PathLike) -> EvaluationReport:
    """Read a `results.json` written by `write_results` (or by a training run).

    Raises:
        UsageError: The file is missing, unreadable, not JSON, or not a results file (naming what is wrong).
    """
    payload = read_results_file(path)
    try:
        return EvaluationReport.from_dict(payload)
    except EvaluationError as error:
        raise EvaluationError(f"{path}: {error}") from None


def update_model_card(card_path: str | os.PathLike, report: EvaluationReport) -> Path:
    """Add the report to the card at `card_path` (a `README.md`, or a model folder holding one), creating it if
    needed: `model-index` entries, the results table, and the Hub's `.eval_results/` (see
    `model_card.add_eval_results`). Returns the card's path.

    Raises:
        NonFiniteMetricError: A metric of `report` is NaN or infinite; the card is not touched.
        UsageError: The card cannot be read, or its folder does not exist.
    """
    check_finite(report)
    return add_eval_results(card_path, report, lambda name: markdown_table([report], names=[name]))
