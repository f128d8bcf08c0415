"""Export of AoT models as self-contained folders that load with `trust_remote_code=True`, their model cards, and
publishing to the Hugging Face Hub.

- `export_model` writes a folder atomically (temporary folder, then rename);
- `render_model_card` fills the card template of `model_cards/` with `huggingface_hub.ModelCard`/`ModelCardData`
  (library, pipeline tag, `custom_code` tag, datasets, architecture table, loading with a pinned `revision`,
  training settings, evaluation results as `model-index`);
- `push_to_hub` uploads a folder with `create_repo` + one commit. It never writes into the folder, so a failed push
  leaves it exactly as it was and raises `HubPushError` naming the cause.

Every Hub call takes an `endpoint`, so the same code talks to the Hub, a private mirror, or a local stand-in server.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .modeling_aot import AoTPreTrainedModel

CODE_FILES = ("configuration_aot.py", "attention_aot.py", "modeling_aot.py")
CARD_TEMPLATE = "aot_model_card.md"
TEXT_TASK = "text-generation"
IMAGE_TASK = "image-classification"


def export_model(
    model: AoTPreTrainedModel,
    save_directory: str | os.PathLike,
    tokenizer=None,
    image_processor=None,
    overwrite: bool = True,
    model_card: Any = None,
    extra_files: dict[str, str | bytes | os.PathLike] | None = None,
) -> Path:
    """Write `model` (safetensors, config with a complete `auto_map`, code files) and its tokenizer or image
    processor to `save_directory`, atomically.

    Everything is written to a temporary folder beside the target and renamed into place only once complete, so
    an interrupted export never leaves a half-written folder, and an existing folder survives a failed export.

    Args:
        model: Any AoT model.
        save_directory: Destination folder.
        tokenizer: Saved with the model when given.
        image_processor: Saved with the model when given.
        overwrite: Replace an existing folder; otherwise raise `FileExistsError`.
        model_card: A `huggingface_hub.ModelCard` (or its text), written as `README.md`.
        extra_files: More files for the folder: name -> text, bytes, or the path of a file to copy.

    Returns:
        The destination path.
    """
    if not isinstance(model, AoTPreTrainedModel):
        raise TypeError(f"`model` must be an AoT model, got {type(model).__name__}.")
    target = Path(save_directory)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True to replace it.")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        for extra in (tokenizer, image_processor):
            if extra is not None:
                extra.save_pretrained(staging)
        files = dict(extra_files or {})
        if model_card is not None:
            files["README.md"] = str(model_card)
        for name, content in files.items():
            destination = staging / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                destination.write_bytes(content)
            elif isinstance(content, os.PathLike):
                shutil.copyfile(content, destination)
            else:
                destination.write_text(content, encoding="utf-8")
        backup = None
        if target.exists():
            backup = target.with_name(f".{target.name}.old")
            shutil.rmtree(backup, ignore_errors=True)
            target.rename(backup)
        staging.rename(target)
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


# ---------------------------------------------------------------------------------------------------------------
# Model cards
# ---------------------------------------------------------------------------------------------------------------


def card_template_path() -> Path:
    """The card template of `model_cards/`: shipped in wheels as package data through the symlink
    `aot_transformers/training/model_cards`, read from the repository's `model_cards/` in a source checkout."""
    package = Path(__file__).resolve().parent
    candidates = [
        package / "training" / "model_cards" / CARD_TEMPLATE,
        Path(__file__).parent / "training" / "model_cards" / CARD_TEMPLATE,
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
        base_model: The checkpoint this model was fine-tuned from.
        license: SPDX-style license id of the weights.
        summary: A paragraph under the title.
        limitations: The limitations paragraph.
        tags: More tags (`aot`, `attention-only`, `custom_code` and the task are always present).

    Returns:
        A `huggingface_hub.ModelCard`.
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    from . import __version__

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
        library_name="transformers",
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
        usage=_usage(task, repo_id, is_text),
        training=[(name, _format(value)) for name, value in (training or {}).items()],
        datasets_text=dataset_description or (", ".join(datasets) if datasets else None),
        results=[(r.get("split") or "", r["metric"], _format(float(r["value"]))) for r in results or []],
        curves_file=curves_file,
        limitations=limitations
        or "A research model: small, trained briefly, and not evaluated for safety or bias. Use it to study "
        "attention-only architectures, not in products.",
        library_version=__version__,
    )


def card_for_folder(folder: str | os.PathLike, repo_id: str | None = None):
    """A model card for an exported folder that has none, from its `config.json` (and `results.json` if present)."""
    from .configuration_aot import AoTConfig

    folder = Path(folder)
    config = AoTConfig.from_pretrained(folder)
    results = []
    results_file = folder / "results.json"
    if results_file.is_file():
        results = json.loads(results_file.read_text()).get("model_index", [])
    return render_model_card(
        config,
        model_name=(repo_id or folder.name).split("/")[-1],
        repo_id=repo_id,
        task=infer_task(config),
        results=results,
        curves_file="training_curves.png" if (folder / "training_curves.png").is_file() else None,
    )


# ---------------------------------------------------------------------------------------------------------------
# Push
# ---------------------------------------------------------------------------------------------------------------


class HubPushError(RuntimeError):
    """A push to the Hub failed; the local folder is unchanged."""


@dataclass
class PushResult:
    """What a successful push created."""

    repo_url: str
    commit_url: str
    commit_oid: str | None
    files: list[str]


def check_export_folder(folder: str | os.PathLike) -> Path:
    """Check that `folder` is a complete AoT export (config with `auto_map`, safetensors weights, code files)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"No such folder: {folder}.")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{folder} has no config.json: it is not a saved model folder.")
    config = json.loads(config_file.read_text())
    missing = [name for name in CODE_FILES if not (folder / name).is_file()]
    if "auto_map" not in config or missing:
        raise ValueError(
            f"{folder} does not load with trust_remote_code=True: "
            + (f"missing code files {missing}" if missing else "config.json has no auto_map")
            + ". Save it with aot_transformers.export_model."
        )
    if not any(folder.glob("*.safetensors")):
        raise ValueError(f"{folder} has no .safetensors weights.")
    return folder


def push_to_hub(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    token: str | bool | None = None,
    endpoint: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    create_pr: bool = False,
) -> PushResult:
    """Upload an exported model folder to a Hub repository (created if needed) in one commit.

    The folder is read, never written: when it has no `README.md`, a model card rendered from its config is
    uploaded from memory. Whatever fails (network, authentication, server error), the local folder is left as it
    was and `HubPushError` says what went wrong.

    Args:
        folder: A folder written by `export_model` or by `aot train`.
        repo_id: `namespace/name` of the model repository.
        token: Hub token (default: the logged-in token or `HF_TOKEN`).
        endpoint: Hub URL (default: `HF_ENDPOINT` or https://huggingface.co).
        private: Create the repository as private.
        revision: Branch to commit to (default: the main branch).
        commit_message: Commit message.
        create_pr: Open a pull request instead of committing to the branch.

    Returns:
        The repository URL, commit URL and commit id, and the uploaded files.
    """
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    folder = check_export_folder(folder)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"Invalid repo id {repo_id!r}: {error}") from None
    # Hidden files, caches and Trainer checkpoints stay local.
    files = [
        path
        for path in sorted(folder.rglob("*"))
        if path.is_file()
        and not any(
            part.startswith((".", "checkpoint-")) or part == "__pycache__" for part in path.relative_to(folder).parts
        )
    ]
    operations = [CommitOperationAdd(str(path.relative_to(folder)), str(path)) for path in files]
    if not (folder / "README.md").is_file():
        card = card_for_folder(folder, repo_id)
        operations.append(CommitOperationAdd("README.md", str(card).encode()))
    names = [op.path_in_repo for op in operations]
    api = HfApi(endpoint=endpoint, token=token)
    target = f"{repo_id} on {api.endpoint}"
    try:
        repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.create_commit(
            repo_id,
            operations,
            commit_message=commit_message or f"Upload {folder.name} with aot-transformers",
            revision=revision,
            create_pr=create_pr,
        )
    except Exception as error:  # every failure is reported the same way: what, where, and that nothing changed
        raise HubPushError(
            f"Push of {folder} to {target} failed: {type(error).__name__}: {error}. The local folder is "
            "unchanged; fix the cause (token, network, repo id) and run the push again."
        ) from error
    return PushResult(repo_url=str(repo_url), commit_url=info.commit_url, commit_oid=info.oid, files=names)


__all__ = [
    "HubPushError",
    "PushResult",
    "card_for_folder",
    "check_export_folder",
    "export_model",
    "push_to_hub",
    "render_model_card",
]
