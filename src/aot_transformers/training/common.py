"""Pieces shared by the causal-LM and image-classification entry points: the argument dataclasses common to both,
building a model from a preset / config file / checkpoint, finding the checkpoint to resume, the training-curve
figure, and the final atomic export with model card and optional push."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..configuration_aot import AoTConfig

logger = logging.getLogger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
CURVES_FILE = "training_curves.png"
RESULTS_FILE = "results.json"


class TrainingSetupError(ValueError):
    """Bad input found while setting up a run, before any training step."""


@dataclass
class PublishArguments:
    """Where the final model goes and how it is published (Trainer's own `--push_to_hub`, `--hub_model_id`,
    `--hub_token`, `--hub_private_repo` and `--hub_revision` select the push)."""

    final_model_dir: str | None = field(
        default=None,
        metadata={"help": "Hub-ready folder for the final model (default: <output_dir>/model). Written atomically."},
    )
    hub_endpoint: str | None = field(
        default=None, metadata={"help": "Hub URL for --push_to_hub (default: HF_ENDPOINT or https://huggingface.co)."}
    )
    model_name: str | None = field(default=None, metadata={"help": "Name in the model card (default: folder name)."})
    make_plots: bool = field(default=True, metadata={"help": f"Write {CURVES_FILE} into the final folder."})


def parse_overrides(text: str | None) -> dict[str, Any]:
    """`"hidden_size=128,knn_k=0.5,attention_type=mhsa"` -> a dict with JSON-typed values (strings otherwise)."""
    overrides: dict[str, Any] = {}
    if not text:
        return overrides
    for item in text.split(","):
        if not item.strip():
            continue
        if "=" not in item:
            raise TrainingSetupError(f"--config_overrides entries must look like name=value, got {item!r}.")
        name, value = (part.strip() for part in item.split("=", 1))
        try:
            overrides[name] = json.loads(value)
        except json.JSONDecodeError:
            overrides[name] = {"None": None, "True": True, "False": False}.get(value, value)
    return overrides


def build_config(
    model_name_or_path: str | None,
    preset: str | None,
    config_file: str | None,
    config_overrides: str | None,
    default_preset: str,
    **fields: Any,
) -> AoTConfig:
    """The config of the model to train: from a checkpoint (fine-tuning), a config file, or a preset, with
    `--config_overrides` and then `fields` applied. Raises `TrainingSetupError` for a bad choice."""
    sources = [s for s in (model_name_or_path, config_file) if s] + ([preset] if preset else [])
    if len(sources) > 1:
        raise TrainingSetupError(
            "Give at most one of --model_name_or_path, --config_file and --preset, got "
            f"{', '.join(map(repr, sources))}."
        )
    overrides = {**parse_overrides(config_overrides), **{k: v for k, v in fields.items() if v is not None}}
    try:
        if model_name_or_path:
            if _looks_like_path(model_name_or_path) and not Path(model_name_or_path).exists():
                raise TrainingSetupError(f"--model_name_or_path {model_name_or_path}: no such folder.")
            config = AoTConfig.from_pretrained(model_name_or_path)
            if config.model_type != "aot":
                raise TrainingSetupError(f"{model_name_or_path} is a {config.model_type!r} model, not an AoT model.")
            for name, value in overrides.items():
                setattr(config, name, value)
            config.validate()
            return config
        if config_file:
            path = Path(config_file)
            if not path.is_file():
                raise TrainingSetupError(f"--config_file {config_file}: no such file.")
            config_dict = json.loads(path.read_text())
            config_dict.pop("model_type", None)
            return AoTConfig(**{**config_dict, **overrides})
        return AoTConfig.from_preset(preset or default_preset, **overrides)
    except TrainingSetupError:
        raise
    except (ValueError, TypeError) as error:
        raise TrainingSetupError(str(error)) from error
    except OSError as error:
        raise TrainingSetupError(f"Could not load the model config from {model_name_or_path!r}: {error}") from error


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.sep in name and name.count("/") != 1 or name.endswith(os.sep)


def is_complete_checkpoint(folder: Path) -> bool:
    """Trainer writes `trainer_state.json` last: a checkpoint without it was interrupted while being written."""
    return (folder / "trainer_state.json").is_file() and any(folder.glob("*.safetensors"))


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest complete `checkpoint-N` folder of a run, skipping one a kill interrupted mid-write."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    found = sorted(
        (int(match.group(1)), path)
        for path in root.iterdir()
        if path.is_dir() and (match := CHECKPOINT_PATTERN.match(path.name))
    )
    for _step, path in reversed(found):
        if is_complete_checkpoint(path):
            return str(path)
        logger.warning("Skipping incomplete checkpoint %s (interrupted while being written).", path)
    return None


def resolve_resume(resume_from_checkpoint: str | None, output_dir: str | None) -> str | None:
    """`--resume_from_checkpoint`: a checkpoint folder, or `latest`/`true`/`auto` for the newest complete one in
    `output_dir` (`auto` starts fresh when there is none). Raises `TrainingSetupError` for a missing checkpoint."""
    if resume_from_checkpoint in (None, "", "false", "False", "no"):
        return None
    if resume_from_checkpoint in ("latest", "last", "true", "True", "auto"):
        found = last_complete_checkpoint(output_dir) if output_dir else None
        if found is None and resume_from_checkpoint != "auto":
            raise TrainingSetupError(
                f"--resume_from_checkpoint {resume_from_checkpoint}: no checkpoint in {output_dir}."
            )
        return found
    path = Path(resume_from_checkpoint)
    if not path.is_dir():
        raise TrainingSetupError(f"--resume_from_checkpoint {resume_from_checkpoint}: no such folder.")
    if not is_complete_checkpoint(path):
        raise TrainingSetupError(
            f"--resume_from_checkpoint {resume_from_checkpoint} is incomplete (no trainer_state.json: it was "
            "interrupted while being written); use an earlier checkpoint or `latest`."
        )
    return str(path)


def prepare_training_arguments(training_args) -> tuple[bool, str]:
    """Take the push out of Trainer's hands (it would push its own card, at every save) and return
    `(push, final_dir)` decisions to apply after the atomic export."""
    push = bool(training_args.push_to_hub)
    training_args.push_to_hub = False
    if training_args.output_dir is None:
        raise TrainingSetupError("--output_dir is required.")
    return push, training_args.output_dir


def plot_training_curves(log_history: list[dict[str, Any]], path: str | os.PathLike, title: str = "") -> Path | None:
    """Training (and evaluation) loss against the step, and the evaluation metric when there is one, as a PNG.

    Returns the path, or None when matplotlib is missing or there is nothing to plot.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is part of the `train` extra
        logger.warning("matplotlib is not installed: no training-curve figure.")
        return None
    train = [(e["step"], e["loss"]) for e in log_history if "loss" in e and "step" in e]
    evals = [(e["step"], e["eval_loss"]) for e in log_history if "eval_loss" in e]
    metric_name = "eval_accuracy" if any("eval_accuracy" in e for e in log_history) else None
    metric = [(e["step"], e[metric_name]) for e in log_history if metric_name and metric_name in e]
    if metric_name is None and evals:  # language models: the perplexity of each evaluation
        metric_name, metric = "eval_perplexity", [(step, perplexity(loss)) for step, loss in evals]
    if not train and not evals:
        return None
    columns = 2 if metric else 1
    figure, axes = plt.subplots(1, columns, figsize=(5.5 * columns, 4), squeeze=False)
    ax = axes[0][0]
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss")
    if evals:
        ax.plot(*zip(*evals, strict=True), "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.legend()
    ax.grid(alpha=0.3)
    if metric:
        ax = axes[0][1]
        ax.plot(*zip(*metric, strict=True), "o-", color="tab:green")
        ax.set_xlabel("step")
        ax.set_ylabel(metric_name.removeprefix("eval_"))
        ax.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def training_summary(training_args, trainer, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The training settings shown in the model card."""
    world = max(1, training_args.world_size)
    summary = {
        "steps": trainer.state.global_step,
        "epochs": round(trainer.state.epoch or 0.0, 2),
        "global batch size": training_args.per_device_train_batch_size
        * training_args.gradient_accumulation_steps
        * world,
        "processes": world,
        "learning rate": training_args.learning_rate,
        "schedule": str(getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)),
        "warmup": training_args.warmup_steps or 0,
        "weight decay": training_args.weight_decay,
        "optimizer": str(getattr(training_args.optim, "value", training_args.optim)),
        "seed": training_args.seed,
    }
    summary.update(extra or {})
    return summary


def finalize_run(
    trainer,
    training_args,
    publish_args: PublishArguments,
    *,
    task: str,
    processor,
    metrics: dict[str, Any],
    results: list[dict[str, Any]],
    datasets: list[str] | None,
    dataset_description: str,
    training: dict[str, Any],
    push: bool,
    tags: list[str] | None = None,
    base_model: str | None = None,
) -> Path | None:
    """Write the final hub-ready folder atomically (model, tokenizer or image processor, code files, model card,
    `results.json`, training curves), then push it if asked. Only the main process writes; returns the folder."""
    from ..hub import export_model, push_to_hub, render_model_card

    final_dir = Path(publish_args.final_model_dir or Path(training_args.output_dir) / "model")
    if not trainer.is_world_process_zero():
        return None
    model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
    extra_files: dict[str, Any] = {
        RESULTS_FILE: json.dumps({"metrics": metrics, "model_index": results, "training": training}, indent=2)
    }
    curves = None
    if publish_args.make_plots:
        staging_plot = Path(training_args.output_dir) / CURVES_FILE
        curves = plot_training_curves(trainer.state.log_history, staging_plot, title=final_dir.name)
        if curves is not None:
            extra_files[CURVES_FILE] = curves
    model_name = publish_args.model_name or training_args.hub_model_id or final_dir.name
    card = render_model_card(
        model.config,
        model_name=model_name.split("/")[-1],
        repo_id=training_args.hub_model_id or model_name,
        task=task,
        datasets=datasets,
        dataset_description=dataset_description,
        results=results,
        training=training,
        num_parameters=sum(p.numel() for p in model.parameters()),
        curves_file=CURVES_FILE if curves is not None else None,
        base_model=base_model,
        tags=tags,
    )
    tokenizer = processor if task == "text-generation" else None
    image_processor = processor if task != "text-generation" else None
    export_model(
        model,
        final_dir,
        tokenizer=tokenizer,
        image_processor=image_processor,
        model_card=card,
        extra_files=extra_files,
    )
    logger.info("Final model written to %s", final_dir)
    if push:
        repo_id = training_args.hub_model_id or final_dir.resolve().parent.name
        result = push_to_hub(
            final_dir,
            repo_id,
            token=training_args.hub_token,
            endpoint=publish_args.hub_endpoint,
            private=training_args.hub_private_repo,
            revision=training_args.hub_revision,
        )
        print(f"Pushed {final_dir} to {result.repo_url} (commit {result.commit_oid}).")
    return final_dir


def perplexity(loss: float) -> float:
    """exp(loss), infinite when it overflows."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf
