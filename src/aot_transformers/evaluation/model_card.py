"""Model cards of AoT models, in one place: rendering a card for an exported or trained model (the template of
`model_cards/`, metadata through `huggingface_hub.ModelCard`/`ModelCardData`), and adding `aot eval` results to a
card (`model-index` metadata and a table) and to the Hub's `.eval_results/` folder.

Metadata is what the Hub accepts: `base_model` only as a Hub repository id (a local base is described in the text),
a known `license`, `model-index` entries with task, dataset and metrics. When results are added, existing card
content is kept: results of other datasets or metrics stay, results of the same task, dataset and metric are
replaced, and the markdown table lives between two HTML comments so a later run replaces it in place.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import EVAL_RESULTS_DIR, atomic_write_text, is_hub_id
from .data import EvaluationError

if TYPE_CHECKING:
    from .runner import EvaluationReport

CARD_TEMPLATE = "aot_model_card.md"
TEXT_TASK = "text-generation"
IMAGE_TASK = "image-classification"
EVAL_RESULTS_FILE = "aot-eval.yaml"
SECTION_START = "<!-- aot-eval:start -->"
SECTION_END = "<!-- aot-eval:end -->"
SOURCE_NAME = "aot eval (aot-transformers)"


def _base_model_text(base_model: str | None, description: str | None, is_adapter: bool) -> str | None:
    what = "a LoRA adapter for" if is_adapter else "fine-tuned from"
    if base_model:
        return f"This model is {what} [{base_model}](https://huggingface.co/{base_model})."
    if description:
        return (
            f"This model is {what} a local checkpoint (`{Path(description).name}`), not published on the Hub; "
            "load that checkpoint as the base model."
        )
    return None


def _adapter_usage(task: str, repo_id: str, base: str | None) -> str:
    auto = "AutoModelForCausalLM" if task == TEXT_TASK else "AutoModelForImageClassification"
    return (
        f"from peft import PeftModel\nfrom transformers import {auto}\n\n"
        f'base = {auto}.from_pretrained("{base or "<base model folder or id>"}", trust_remote_code=True)\n'
        f'model = PeftModel.from_pretrained(base, "{repo_id}")\n'
        "model = model.merge_and_unload()  # optional: a plain model with the adapters merged in"
    )


def card_template_path() -> Path:
    """The card template of `model_cards/`: shipped in wheels as package data through the symlink
    `aot_transformers/training/model_cards`, read from the repository's `model_cards/` in a source checkout."""
    package = Path(__file__).resolve().parents[1]
    candidates = [
        package / "training" / "model_cards" / CARD_TEMPLATE,
        Path(__file__).parents[1] / "training" / "model_cards" / CARD_TEMPLATE,
        package.parents[1] / "model_cards" / CARD_TEMPLATE,
    ]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"Model card template {CARD_TEMPLATE} not found (looked in {[str(c) for c in candidates]}); reinstall "
        "aot-transformers."
    )


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    return "`None`" if value is None else str(value)


def infer_task(config) -> str:
    """`"image-classification"` for a config saved by an image classifier, else `"text-generation"`."""
    architectures = getattr(config, "architectures", None) or []
    return IMAGE_TASK if any("ImageClassification" in name for name in architectures) else TEXT_TASK


def architecture_rows(config, num_parameters: int | None = None, is_text: bool = True) -> list[tuple[str, str]]:
    """The rows of the card's architecture table for an `AoTConfig`."""
    rows = [
        ("attention_type", config.attention_type),
        ("num_hidden_layers", config.num_hidden_layers),
        ("hidden_size", config.hidden_size),
        ("num_attention_heads", config.num_attention_heads),
        ("head_dim", config.hidden_size // config.num_attention_heads),
        ("knn_k (k-NN attention)", config.knn_k),
        ("normalize_query", config.normalize_query),
        ("step_size (η)", config.step_size),
        ("layer_norm", config.layer_norm),
        ("mlp_layers", config.mlp_layers),
    ]
    if is_text:
        rows += [("vocab_size", config.vocab_size), ("max_position_embeddings", config.max_position_embeddings)]
    else:
        rows += [
            ("image_size / patch_size", f"{config.image_size} / {config.patch_size}"),
            ("num_channels", config.num_channels),
            ("num_labels", config.num_labels),
            ("pooling", config.pooling),
        ]
    if num_parameters is not None:
        rows.append(("parameters", num_parameters))
    return [(name, _format(value)) for name, value in rows]


def _usage(task: str, repo_id: str, is_text: bool) -> str:
    if is_text:
        return (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'repo_id = "{repo_id}"\n'
            'revision = "main"  # replace with the commit hash you reviewed\n'
            "tokenizer = AutoTokenizer.from_pretrained(repo_id, revision=revision, trust_remote_code=True)\n"
            "model = AutoModelForCausalLM.from_pretrained(repo_id, revision=revision, trust_remote_code=True)\n"
            'inputs = tokenizer("The ", return_tensors="pt")\n'
            "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=40, do_sample=True)[0]))"
        )
    return (
        "from transformers import pipeline\n\n"
        f'repo_id = "{repo_id}"\n'
        'revision = "main"  # replace with the commit hash you reviewed\n'
        f'classifier = pipeline("{task}", model=repo_id, revision=revision, trust_remote_code=True)\n'
        'print(classifier("image.png"))'
    )


def render_model_card(
    config,
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
    license: str | None = "apache-2.0",
    summary: str | None = None,
    limitations: str | None = None,
    tags: list[str] | None = None,
):
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
        license: SPDX-style license id of the weights.
        summary: A paragraph under the title.
        limitations: The limitations paragraph.
        tags: More tags (`aot`, `attention-only`, `custom_code` and the task are always present).

    Returns:
        A `huggingface_hub.ModelCard`.
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    from .. import __version__
    from ..configuration_aot import REQUIRED_TRANSFORMERS

    if base_model is not None and not is_hub_id(base_model):
        raise ValueError(
            f"base_model {base_model!r} is not a Hub repository id (namespace/name); the Hub rejects such metadata. "
            "Pass a local base as base_model_description instead."
        )
    task = task or infer_task(config)
    is_text = task == TEXT_TASK
    repo_id = repo_id or model_name
    eval_results = []
    for result in results or []:
        eval_results.append(
            EvalResult(
                task_type=task,
                dataset_type=result.get("dataset_type") or result.get("dataset") or "custom",
                dataset_name=result.get("dataset") or "custom",
                dataset_split=result.get("split"),
                metric_type=result["metric"],
                metric_value=float(result["value"]),
            )
        )
    all_tags = ["aot", "attention-only", "custom_code", task]
    all_tags += [tag for tag in tags or [] if tag not in all_tags]
    card_data = ModelCardData(
        library_name=library_name,
        pipeline_tag=task,
        license=license,
        tags=all_tags,
        datasets=datasets or None,
        base_model=base_model,
        model_name=model_name,
        eval_results=eval_results or None,
    )
    knn_note = None
    if config.knn_k is not None:
        knn_note = (
            f"Attention is k-NN attention (knn_k={config.knn_k}): each query keeps only its highest-scoring keys "
            "(Wang et al., KVT, https://arxiv.org/abs/2106.00515)."
        )
    default_summary = (
        f"A causal language model ({config.num_hidden_layers} layers, width {config.hidden_size})."
        if is_text
        else f"An image classifier ({config.num_hidden_layers} layers, width {config.hidden_size}, "
        f"{config.num_labels} classes)."
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(card_template_path()),
        model_name=model_name,
        summary=summary or default_summary,
        knn_note=knn_note,
        architecture=architecture_rows(config, num_parameters, is_text),
        usage=_adapter_usage(task, repo_id, base_model or base_model_description)
        if adapter
        else _usage(task, repo_id, is_text),
        training=[(name, _format(value)) for name, value in (training or {}).items()],
        datasets_text=dataset_description or (", ".join(datasets) if datasets else None),
        results=[(r.get("split") or "", r["metric"], _format(float(r["value"]))) for r in results or []],
        curves_file=curves_file,
        base_model_text=_base_model_text(base_model, base_model_description, adapter is not None),
        adapter=[(name, _format(value)) for name, value in (adapter or {}).items()],
        limitations=limitations
        or "A research model: small, trained briefly, and not evaluated for safety or bias. Use it to study "
        "attention-only architectures, not in products.",
        library_version=__version__,
        required_transformers=REQUIRED_TRANSFORMERS,
    )


def card_for_folder(folder: str | os.PathLike, repo_id: str | None = None):
    """A model card for an exported folder that has none, from its `config.json` (and `results.json` if present)."""
    from ..configuration_aot import AoTConfig
    from .results import card_results, read_results

    folder = Path(folder)
    config = AoTConfig.from_pretrained(folder)
    results = []
    if (folder / "results.json").is_file():
        results = card_results(read_results(folder / "results.json"))
    card = render_model_card(
        config,
        model_name=(repo_id or folder.name).split("/")[-1],
        repo_id=repo_id,
        task=infer_task(config),
        results=results,
        curves_file="training_curves.png" if (folder / "training_curves.png").is_file() else None,
    )
    if (folder / "results.json").is_file():
        evaluated = eval_results(read_results(folder / "results.json"))
        if evaluated:
            card.data.eval_results = (card.data.eval_results or []) + evaluated
    return card


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

    from .tasks import DATASETS, TASKS

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
            if not _finite(result.get(key)):
                continue  # absent, or non-finite: a NaN is never written into a card (update_model_card refuses)
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


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_card(path: Path):
    """The `huggingface_hub.ModelCard` at `path`, or an `EvaluationError` naming the file when it cannot be read
    (not UTF-8, malformed YAML metadata, metadata that is not a mapping, …)."""
    from huggingface_hub import ModelCard

    try:
        return ModelCard.load(path)
    except Exception as error:  # huggingface_hub raises ValueError, yaml errors, OSError, … depending on the damage
        message = " ".join(str(error).split())[:200]
        raise EvaluationError(
            f"the model card {path} cannot be read ({type(error).__name__}: {message}); fix or move it, or pass "
            "another card with --update-card PATH."
        ) from None


def card_file(target: str | os.PathLike) -> Path:
    """The card file `update_model_card` writes for `target` (a `README.md`, any `.md` file, or a folder)."""
    path = Path(target)
    return path / "README.md" if path.is_dir() or path.suffix.lower() != ".md" else path


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

    Raises:
        NonFiniteMetricError: A metric of `report` is NaN or infinite; the card is not touched.
        EvaluationError: The card cannot be read, or its folder does not exist.
    """
    from huggingface_hub import ModelCard, ModelCardData

    from .results import check_finite, markdown_table

    check_finite(report)
    path = card_file(card_path)
    if not path.parent.is_dir():
        raise EvaluationError(f"cannot write a model card into {path.parent}: not a folder.")
    if path.exists():
        card = load_card(path)
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
    atomic_write_text(path, str(card))
    entries = eval_result_entries(report)
    if entries and path.name == "README.md":
        atomic_write_text(path.parent / EVAL_RESULTS_DIR / EVAL_RESULTS_FILE, eval_results_yaml(entries))
    return path


def eval_result_entries(report: EvaluationReport) -> list:
    """The report's results on Hub datasets as `huggingface_hub.EvalResultEntry`s, the Hub's `.eval_results/`
    format (one value per entry: the metric is named in `notes`). Results on local files are left out, as the
    format names a Hub benchmark dataset."""
    from huggingface_hub import EvalResultEntry

    from .tasks import TASKS

    entries = []
    for task_name, result in report.results.items():
        source = result.get("source", {})
        if task_name not in TASKS or source.get("type") != "hub":
            continue
        for key, metric_type, _ in _CARD_METRICS[TASKS[task_name].kind]:
            if not _finite(result.get(key)):
                continue
            notes = f"{metric_type}; {SOURCE_NAME}, window {report.settings.get('max_length')}"
            if source.get("name"):
                notes += f", config {source['name']}"
            if source.get("split"):
                notes += f", split {source['split']}"
            entries.append(
                EvalResultEntry(
                    dataset_id=source["path"],
                    task_id=task_name,
                    value=round(float(result[key]), 6),
                    date=report.date or None,
                    notes=notes,
                )
            )
    return entries


def eval_results_yaml(entries: list) -> str:
    """`.eval_results/*.yaml` text of `EvalResultEntry`s."""
    import yaml
    from huggingface_hub import eval_result_entries_to_yaml

    return yaml.safe_dump(eval_result_entries_to_yaml(entries), sort_keys=False)


__all__ = [
    "SECTION_END",
    "SECTION_START",
    "card_file",
    "card_for_folder",
    "card_template_path",
    "eval_result_entries",
    "eval_results",
    "eval_results_yaml",
    "infer_task",
    "load_card",
    "render_model_card",
    "update_model_card",
]
