"""Model cards of AoT models, in one place: rendering a card for an exported or trained model (the template
`model_card_template.md` shipped in the package, metadata through `huggingface_hub.ModelCard`/`ModelCardData`), the
`results.json` of a training run, and adding `aot eval` results to a card (`model-index` metadata and a table) and to
the Hub's `.eval_results/` folder. Shared by `training/`, `evaluation/` and `hub.py`; it imports none of them. A
report is anything with `results` (task or split -> metrics and `source`), `settings` and `date`: the
`EvaluationReport` of `aot eval`, or a `results.json` as `card_for_folder` reads it.

Metadata is what the Hub accepts: `base_model` only as a Hub repository id, a known `license`, `model-index` entries
with task, dataset and metrics.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

from ._io import EVAL_RESULTS_DIR, atomic_write_text, is_hub_id, load_json
from .errors import UsageError

if TYPE_CHECKING:
    from huggingface_hub import EvalResult, ModelCard
    from transformers import PreTrainedConfig

CARD_TEMPLATE = "model_card_template.md"
TEXT_TASK = "text-generation"
IMAGE_TASK = "image-classification"
EVAL_RESULTS_FILE = "aot-eval.yaml"
SECTION_START = "<!-- aot-eval:start -->"
SECTION_END = "<!-- aot-eval:end -->"
SOURCE_NAME = "aot eval (aot-transformers)"
TRAINING_SOURCE = "training"
# The `aot eval` suite as model-index names it: task -> (kind, dataset title, the dataset's Hub id). The tasks are
# defined in `evaluation/tasks.py` (`TASKS`, `DATASETS`); tests/test_wings.py keeps the two in step.
SUITE = {
    "wikitext": ("perplexity", "WikiText-2 (raw)", "Salesforce/wikitext"),
    "ptb": ("perplexity", "Penn Treebank", "ptb-text-only/ptb_text_only"),
    "lambada": ("perplexity", "LAMBADA (OpenAI)", "EleutherAI/lambada_openai"),
    "lambada_acc": ("last_word", "LAMBADA (OpenAI)", "EleutherAI/lambada_openai"),
    "cbt_cn": ("cloze", "Children's Book Test (CN)", "cam-cst/cbt"),
    "cbt_ne": ("cloze", "Children's Book Test (NE)", "cam-cst/cbt"),
}


class Report(Protocol):
    """A report as this module reads it (see the module docstring): an `EvaluationReport`, or a read `results.json`."""

    results: dict[str, dict[str, Any]]
    settings: dict[str, Any]
    date: str


def card_template() -> str:
    """The text of the card template, package data of `aot_transformers` (read through `importlib.resources`)."""
    return resources.files(__package__).joinpath(CARD_TEMPLATE).read_text(encoding="utf-8")


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    return "`None`" if value is None else str(value)


def architecture_rows(
    config: PreTrainedConfig, num_parameters: int | None = None, is_text: bool = True
) -> list[tuple[str, str]]:
    """The rows of the card's architecture table for an `AoTConfig` (or a baseline's config: the fields it has)."""
    fields = ["attention_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "head_dim", "knn_k"]
    fields += ["normalize_query", "step_size", "layer_norm", "mlp_layers", "mlp_type"]
    labels = {"knn_k": "knn_k (k-NN attention)", "step_size": "step_size (η)", "size": "image_size / patch_size"}
    computed = {"head_dim": config.hidden_size // config.num_attention_heads}
    if is_text:
        fields += ["vocab_size", "max_position_embeddings"]
    else:
        fields += ["size", "num_channels", "num_labels", "pooling"]
        computed["size"] = f"{config.image_size} / {config.patch_size}"
    fields = [f for f in fields if f in computed or hasattr(config, f)]
    rows = [(labels.get(f, f), computed[f] if f in computed else getattr(config, f)) for f in fields]
    if num_parameters is not None:
        rows.append(("parameters", num_parameters))
    return [(name, _format(value)) for name, value in rows]


def render_model_card(
    config: PreTrainedConfig,
    *,
    model_name: str,
    repo_id: str | None = None,
    task: str | None = None,
    datasets: list[str] | None = None,
    dataset_description: str | None = None,
    results: list[dict[str, Any]] | None = None,
    training: dict[str, Any] | None = None,
    num_parameters: int | None = None,
    curves_file: str | None = None,
    base_model: str | None = None,
    base_model_description: str | None = None,
    adapter: dict[str, Any] | None = None,
    library_name: str = "transformers",
    tags: list[str] | None = None,
) -> ModelCard:
    """Render the model card of an AoT model with `huggingface_hub.ModelCard.from_template`.

    Args:
        config: The model's `AoTConfig`.
        model_name: Title of the card and name in `model-index`.
        repo_id: Where the model lives (used in the loading snippet); defaults to `model_name`.
        task: `"text-generation"` or `"image-classification"`; inferred from the config when omitted.
        datasets: Hub dataset ids (for the metadata); local data is described by `dataset_description`.
        dataset_description: Free text naming the training data.
        results: Evaluation results, each `{"metric": "perplexity", "value": 12.3, "split": "validation",
            "dataset": "…", "dataset_type": "…"}`; they become `model-index` entries.
        training: Training settings shown in a table (learning rate, batch size, steps, …).
        num_parameters: Shown in the architecture table.
        curves_file: Name of a training-curve image inside the folder, shown in the card.
        base_model: The Hub id of the checkpoint this model was fine-tuned from (metadata `base_model`, which the
            Hub accepts only as a repository id: a local path raises `ValueError`).
        base_model_description: A base model that is not on the Hub (a local folder), named in the card's text.
        adapter: LoRA settings (rank, alpha, targets, …) when the folder is a PEFT adapter.
        library_name: `"transformers"`, or `"peft"` for an adapter.
        tags: More tags (`aot`, `attention-only`, `custom_code` and the task are always present).

    Returns:
        A `huggingface_hub.ModelCard`.
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    from . import __version__
    from .configuration_aot import REQUIRED_TRANSFORMERS

    if base_model is not None and not is_hub_id(base_model):
        raise ValueError(
            f"base_model {base_model!r} is not a Hub repository id (namespace/name); the Hub rejects such metadata. "
            "Pass a local base as base_model_description instead."
        )
    if task is None:  # a config saved by an image classifier names it in `architectures`
        image = any("ImageClassification" in name for name in getattr(config, "architectures", None) or [])
        task = IMAGE_TASK if image else TEXT_TASK
    is_text = task == TEXT_TASK
    repo_id = repo_id or model_name
    eval_results = [
        EvalResult(
            task_type=task,
            dataset_type=result.get("dataset_type") or result.get("dataset") or "custom",
            dataset_name=result.get("dataset") or "custom",
            dataset_split=result.get("split"),
            metric_type=result["metric"],
            metric_value=float(result["value"]),
        )
        for result in results or []
    ]
    is_aot = config.model_type == "aot"  # else a baseline (`aot train --model_type gpt2|llama|vit`): no remote code
    all_tags = ["aot", "attention-only", "custom_code", task] if is_aot else ["aot-baseline", config.model_type, task]
    all_tags += [tag for tag in tags or [] if tag not in all_tags]
    card_data = ModelCardData(
        library_name=library_name,
        pipeline_tag=task,
        license="apache-2.0",
        tags=all_tags,
        datasets=datasets or None,
        base_model=base_model,
        model_name=model_name,
        eval_results=eval_results or None,
    )
    return ModelCard.from_template(
        card_data,
        template_str=card_template(),
        model_name=model_name,
        summary=f"A causal language model ({config.num_hidden_layers} layers, width {config.hidden_size})."
        if is_text
        else f"An image classifier ({config.num_hidden_layers} layers, width {config.hidden_size}, "
        f"{config.num_labels} classes).",
        knn_k=getattr(config, "knn_k", None),
        is_aot=is_aot,
        model_class=(getattr(config, "architectures", None) or [config.model_type])[0],
        remote=", trust_remote_code=True" if is_aot else "",
        architecture=architecture_rows(config, num_parameters, is_text),
        repo_id=repo_id,  # the loading snippet: of the adapter (on `base`) or of the model (a text model or not)
        task=task,
        is_text=is_text,
        base=base_model or base_model_description,
        training=[(name, _format(value)) for name, value in (training or {}).items()],
        datasets_text=dataset_description or (", ".join(datasets) if datasets else None),
        results=[(r.get("split") or "", r["metric"], _format(float(r["value"]))) for r in results or []],
        curves_file=curves_file,
        base_model=base_model,  # the sentence naming the base model, a Hub id or a local checkpoint
        base_model_description=Path(base_model_description).name if base_model_description else None,
        is_adapter=adapter is not None,
        adapter=[(name, _format(value)) for name, value in (adapter or {}).items()],
        limitations="A research model: small, trained briefly, and not evaluated for safety or bias. Use it to "
        "study attention-only architectures, not in products.",
        library_version=__version__,
        required_transformers=REQUIRED_TRANSFORMERS,
    )


def card_for_folder(folder: str | os.PathLike, repo_id: str | None = None) -> ModelCard:
    """A model card for an exported folder that has none, from its `config.json` (and `results.json` if present:
    the results of a training run and those of `aot eval`)."""
    from .configuration_aot import AoTConfig

    folder = Path(folder)
    config = AoTConfig.from_pretrained(folder)
    results_file = folder / "results.json"
    report = SimpleNamespace(**{"settings": {}, **read_results_file(results_file)}) if results_file.is_file() else None
    card = render_model_card(
        config,
        model_name=(repo_id or folder.name).split("/")[-1],
        repo_id=repo_id,
        results=card_results(report) if report else [],
        curves_file="training_curves.png" if (folder / "training_curves.png").is_file() else None,
    )
    evaluated = eval_results(report) if report else []
    if evaluated:
        card.data.eval_results = (card.data.eval_results or []) + evaluated
    return card


def read_results_file(path: str | os.PathLike) -> dict[str, Any]:
    """The payload of a `results.json` (of `aot eval lm` or of a training run): `results` maps each task or split to
    metrics and a `source` mapping. `UsageError` (naming the file) when it is missing, unreadable or not that."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"results file not found: {path}")
    payload = load_json(path)
    results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(results, Mapping) or not isinstance(payload.get("settings", {}), Mapping):
        raise UsageError(f"{path}: not an `aot eval` results file: no 'results' and 'settings' mappings.")
    for task, result in results.items():
        if not isinstance(result, Mapping) or not isinstance(result.get("source", {}), Mapping):
            raise UsageError(f"{path}: not an `aot eval` results file: results[{task!r}] or its source is no mapping.")
    return payload


def training_results_json(
    model_name: str,
    *,
    task: str,
    results: list[dict[str, Any]],
    training: dict[str, Any],
    metrics: dict[str, Any],
    num_parameters: int | None = None,
) -> str:
    """The `results.json` of a training run of `model_name` for `task`, in the layout of `aot eval`'s
    `EvaluationReport`: `model`, `model_info` (`num_parameters`, `task`), `settings` = `training` (the settings the
    card shows), `results` = split -> metrics and data source (from `results`, each `{"metric", "value", "split",
    "dataset"}`), `versions`, `date`, plus Trainer's `metrics` (numbers and strings only)."""
    import torch
    import transformers

    from . import __version__

    by_split: dict[str, dict[str, Any]] = {}
    for result in results:
        source = {"type": TRAINING_SOURCE, "path": result.get("dataset"), "split": result.get("split")}
        entry = by_split.setdefault(result.get("split") or "validation", {"task_type": task, "source": source})
        entry[result["metric"]] = result["value"]
    payload = {
        "model": model_name,
        "model_info": {"num_parameters": num_parameters, "task": task},
        "settings": dict(training),
        "results": by_split,
        "versions": {
            "aot-transformers": __version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "metrics": {k: v for k, v in metrics.items() if isinstance(v, (int, float, str)) or v is None},
    }
    return json.dumps(payload, indent=2, default=str) + "\n"


def card_results(report: Report) -> list[dict[str, Any]]:
    """The training results of a report as the card's result entries (`aot eval` tasks become `model-index` through
    `eval_results`)."""
    entries = []
    for split, result in report.results.items():
        source = result.get("source", {})
        if source.get("type") != TRAINING_SOURCE:
            continue
        for metric, value in result.items():
            if metric in ("source", "task_type") or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue  # a non-finite number is never written into a card
            name = source.get("path") or "custom"
            entries.append({"metric": metric, "value": value, "split": split, "dataset": name, "dataset_type": name})
    return entries


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


def _suite_numbers(report: Report) -> Iterator[tuple[str, Mapping[str, Any], str, str, float]]:
    """(task, source, model-index metric type, display name, value) of each finite number of `report` on a task of
    the suite; absent and non-finite numbers are left out (a NaN is never written into a card)."""
    for task_name, result in report.results.items():
        for key, metric_type, metric_name in _CARD_METRICS[SUITE[task_name][0]] if task_name in SUITE else ():
            value = result.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                yield task_name, result.get("source", {}), metric_type, metric_name, round(float(value), 6)


def _dataset_fields(task_name: str, source: Mapping) -> dict[str, Any]:
    _, title, hub_path = SUITE[task_name]
    if source.get("type") == "hub":
        split = {"dataset_config": source.get("name"), "dataset_split": source.get("split")}
        return {"dataset_type": source["path"], "dataset_name": title, **split}
    file_name = Path(source.get("path", "")).name or "local file"
    return {
        "dataset_type": hub_path,
        "dataset_name": f"{title} ({file_name})",
        "dataset_args": {"data_file": file_name},
    }


def eval_results(report: Report) -> list:
    """The `huggingface_hub.EvalResult`s of a report, one per (task, metric)."""
    from huggingface_hub import EvalResult

    # How the number was measured (model-index has no free-form source without a URL).
    settings = {key: report.settings.get(key) for key in ("max_length", "stride")}
    return [
        EvalResult(
            task_type="text-generation",
            task_name=TASK_NAME,
            metric_type=metric_type,
            metric_name=metric_name,
            metric_value=value,
            metric_args={"tool": SOURCE_NAME, **settings},
            **_dataset_fields(task_name, source),
        )
        for task_name, source, metric_type, metric_name, value in _suite_numbers(report)
    ]


def load_card(path: Path) -> ModelCard:
    """The `huggingface_hub.ModelCard` at `path`, or a `UsageError` naming the file when it cannot be read
    (not UTF-8, malformed YAML metadata, metadata that is not a mapping, …)."""
    from huggingface_hub import ModelCard

    try:
        return ModelCard.load(path)
    except Exception as error:  # huggingface_hub raises ValueError, yaml errors, OSError, … depending on the damage
        message = " ".join(str(error).split())[:200]
        raise UsageError(
            f"the model card {path} cannot be read ({type(error).__name__}: {message}); fix or move it, or pass "
            "another card with --update-card PATH."
        ) from None


def card_file(target: str | os.PathLike) -> Path:
    """The card file `add_eval_results` writes for `target` (a `README.md`, any `.md` file, or a folder)."""
    path = Path(target)
    return path / "README.md" if path.is_dir() or path.suffix.lower() != ".md" else path


def _key(result: EvalResult) -> tuple:
    """What identifies a number in model-index (the task name is not kept per metric, so it is left out)."""
    fields = ("task_type", "dataset_type", "dataset_name", "dataset_config", "dataset_split", "metric_type")
    return tuple(getattr(result, name) for name in fields)


def _with_section(text: str, section: str) -> str:
    block = f"{SECTION_START}\n{section.rstrip()}\n{SECTION_END}"
    if SECTION_START in text and SECTION_END in text:
        before, rest = text.split(SECTION_START, 1)
        _, after = rest.split(SECTION_END, 1)
        return before + block + after
    return text.rstrip() + "\n\n## Zero-shot evaluation\n\n" + block + "\n"


def add_eval_results(card_path: str | os.PathLike, report: Report, table: Callable[[str], str]) -> Path:
    """Add an `aot eval` report to the card at `card_path` (a `README.md`, or a model folder holding one), creating
    it if needed (named after its folder): `model-index` entries (replacing those of the same
    task, dataset and metric, keeping the others), the markdown table `table(name in the card)` between
    `SECTION_START` and `SECTION_END` (replaced in place by a later run), and beside a `README.md` the Hub's
    `.eval_results/` file. The caller checks that every metric is finite. Returns the card's path; raises
    `UsageError` when the card cannot be read or its folder does not exist."""
    import yaml
    from huggingface_hub import ModelCard, ModelCardData, eval_result_entries_to_yaml

    path = card_file(card_path)
    if not path.parent.is_dir():
        raise UsageError(f"cannot write a model card into {path.parent}: not a folder.")
    if path.exists():
        card = load_card(path)
    else:
        data = ModelCardData(library_name="transformers", tags=["aot", "zero-shot-evaluation"])
        card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n# {path.parent.name}\n")
    new = eval_results(report)
    replaced = {_key(result) for result in new}
    kept = [result for result in (card.data.eval_results or []) if _key(result) not in replaced]
    card.data.eval_results = kept + new
    if not card.data.model_name:
        card.data.model_name = path.parent.resolve().name
    note = (
        f"Measured with `aot eval lm` (window {report.settings.get('max_length')}, stride "
        f"{report.settings.get('stride')}); losses are mean token cross-entropy in nats.\n\n"
    )
    card.text = _with_section(card.text, note + table(card.data.model_name))
    atomic_write_text(path, str(card))
    entries = eval_result_entries(report)
    if entries and path.name == "README.md":
        yaml_text = yaml.safe_dump(eval_result_entries_to_yaml(entries), sort_keys=False)
        atomic_write_text(path.parent / EVAL_RESULTS_DIR / EVAL_RESULTS_FILE, yaml_text)
    return path


def eval_result_entries(report: Report) -> list:
    """The report's results on Hub datasets as `huggingface_hub.EvalResultEntry`s, the Hub's `.eval_results/`
    format (one value per entry: the metric is named in `notes`). Results on local files are left out, as the
    format names a Hub benchmark dataset."""
    from huggingface_hub import EvalResultEntry

    window = f"{SOURCE_NAME}, window {report.settings.get('max_length')}"
    return [
        EvalResultEntry(
            dataset_id=source["path"],
            task_id=task_name,
            value=value,
            date=report.date or None,
            notes=f"{metric_type}; {window}"
            + "".join(
                f", {what} {source[key]}" for what, key in (("config", "name"), ("split", "split")) if source.get(key)
            ),
        )
        for task_name, source, metric_type, _, value in _suite_numbers(report)
        if source.get("type") == "hub"
    ]


__all__ = [
    "SECTION_END",
    "SECTION_START",
    "SUITE",
    "add_eval_results",
    "card_file",
    "card_for_folder",
    "card_results",
    "card_template",
    "eval_result_entries",
    "eval_results",
    "load_card",
    "read_results_file",
    "render_model_card",
    "training_results_json",
]
