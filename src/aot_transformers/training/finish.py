"""Finishing a training run, shared by the language-model and image trainers: the Hub options Trainer would apply
(taken over, see below), the training-curve figure, the card's training summary, the final atomic export (merged or
LoRA adapter), `results.json`, and the push.

Trainer's hub options are honoured as Trainer documents them (`--hub_strategy`):
- `end`: the final folder only;
- `every_save`: at every save, the checkpoint's model files to the repository root, then the final folder;
- `checkpoint`: at every save, the whole checkpoint (optimizer included, to resume from) to `last-checkpoint/`;
- `all_checkpoints`: at every save, the whole checkpoint to `checkpoint-<step>/`;
with `--hub_private_repo` (repository visibility), `--hub_revision` (the branch committed to) and `--hub_token`.

Why not Trainer's own push (transformers 5.24): it uploads `--output_dir`, not the final folder (the run's lock and
record, the tokenizer cache, the pickled `training_args.bin`, and at every save a root without the code files that
`trust_remote_code` needs); it has no endpoint argument, commits to `--hub_revision` without creating the branch, and
pushes in the background, so a failed checkpoint push neither stops the run nor is reported before the end.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._io import is_hub_id
from .arguments import CURVES_FILE, PublishArguments, TrainingSetupError

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel, Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

    from .run import TrainingRun

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
# Files of a Trainer checkpoint that are optimizer state, not the model (pushed only by the checkpoint strategies).
TRAINER_STATE_PATTERNS = ["optimizer*", "scheduler*", "rng_state*", "scaler*", "trainer_state.json", "training_args*"]


@dataclass
class HubPlan:
    """Where and how the run publishes; `push` False means nothing leaves the machine. The token, visibility and
    branch are Trainer's `--hub_token`, `--hub_private_repo` and `--hub_revision`."""

    push: bool
    repo_id: str | None = None
    strategy: str = "end"
    endpoint: str | None = None


def take_over_hub_options(training_args: TrainingArguments, publish_args: PublishArguments) -> HubPlan:
    """Take the push out of Trainer's hands (see the module docstring) and return the plan that `finish_run` and
    `HubCheckpointCallback` carry out. Raises `TrainingSetupError` for options that cannot be honoured."""
    # `TrainingArguments` has already refused an unknown `--hub_strategy` (its `HubStrategy` enum).
    strategy = str(getattr(training_args.hub_strategy, "value", training_args.hub_strategy))
    push = bool(training_args.push_to_hub)
    training_args.push_to_hub = False
    repo_id = training_args.hub_model_id
    if push:
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        repo_id = repo_id or publish_args.final_dir(training_args).resolve().parent.name
        try:
            validate_repo_id(repo_id)
        except HFValidationError:
            raise TrainingSetupError(
                "not a Hub repository id", argument="--hub_model_id", value=repo_id, allowed="namespace/name"
            ) from None
    return HubPlan(push=push, repo_id=repo_id, strategy=strategy, endpoint=publish_args.hub_endpoint)


def _push_options(training_args: TrainingArguments, plan: HubPlan) -> dict[str, Any]:
    """Trainer's `--hub_token`, `--hub_private_repo` and `--hub_revision`, and the plan's endpoint."""
    private, revision = training_args.hub_private_repo, training_args.hub_revision
    return {"token": training_args.hub_token, "endpoint": plan.endpoint, "private": private, "revision": revision}


def hub_checkpoint_callback(plan: HubPlan) -> TrainerCallback | None:
    """A `TrainerCallback` that pushes checkpoints as `plan.strategy` says (None for `end` or no push)."""
    if not plan.push or plan.strategy == "end":
        return None
    from transformers import TrainerCallback

    from ..hub import upload_checkpoint

    class HubCheckpointCallback(TrainerCallback):
        """Pushes each saved checkpoint from the main process, synchronously (a failed push stops the run: the
        checkpoint is on disk, and `--resume_from_checkpoint latest` continues after the cause is fixed)."""

        def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if not state.is_world_process_zero or not folder.is_dir():
                return
            path_in_repo, ignore, delete = {
                "every_save": (None, TRAINER_STATE_PATTERNS, None),
                "checkpoint": ("last-checkpoint", None, "*"),
            }.get(plan.strategy, (folder.name, None, None))
            upload = {"path_in_repo": path_in_repo, "ignore_patterns": ignore, "delete_patterns": delete}
            message = f"Training in progress, step {state.global_step}"
            upload_checkpoint(folder, plan.repo_id, **_push_options(args, plan), commit_message=message, **upload)

    return HubCheckpointCallback()


def perplexity(loss: float) -> float:
    """exp(loss), infinite when it overflows."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def plot_training_curves(log_history: list[dict[str, Any]], path: str | os.PathLike, title: str = "") -> Path | None:
    """Training (and evaluation) loss against the step, and the evaluation metric when there is one, as a PNG.

    Returns the path, or None when matplotlib is missing or there is nothing to plot.
    """
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state, no display backend
    except ImportError:  # pragma: no cover - matplotlib is part of the `train` extra
        logger.warning("matplotlib is not installed: no training-curve figure.")
        return None
    train = [(e["step"], e["loss"]) for e in log_history if "loss" in e and "step" in e]
    evals = [(e["step"], e["eval_loss"]) for e in log_history if "eval_loss" in e]
    metric_name, metric = "accuracy", [(e["step"], e["eval_accuracy"]) for e in log_history if "eval_accuracy" in e]
    if not metric:  # language models: the perplexity of each evaluation
        metric_name, metric = "perplexity", [(step, perplexity(loss)) for step, loss in evals]
    if not train and not evals:
        return None
    columns = 2 if metric else 1
    figure = Figure(figsize=(5.5 * columns, 4))
    axes = figure.subplots(1, columns, squeeze=False)
    if train:
        axes[0][0].plot(*zip(*train, strict=True), label="train loss")
    if evals:
        axes[0][0].plot(*zip(*evals, strict=True), "o-", label="validation loss")
    axes[0][0].legend()
    if metric:
        axes[0][1].plot(*zip(*metric, strict=True), "o-", color="tab:green")
    for ax, ylabel in zip(axes[0], ("cross-entropy", metric_name), strict=False):
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=110)
    return path


def training_summary(
    training_args: TrainingArguments, trainer: Trainer, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The training settings shown in the model card."""
    world = max(1, training_args.world_size)
    batch = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps * world
    steps, block = trainer.state.global_step, (extra or {}).get("block size (tokens)")
    summary = {
        "steps": steps,
        "epochs": float(f"{trainer.state.epoch or 0.0:.3g}"),  # a short run's 0.0039, not 0
        "global batch size": batch,
        **(
            {"training tokens": f"{steps * batch * block:,}"} if block else {"training examples": f"{steps * batch:,}"}
        ),
        "processes": world,
        "learning rate": training_args.learning_rate,
        "schedule": str(getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)),
        "warmup": training_args.warmup_steps or 0,
        "weight decay": training_args.weight_decay,
        "optimizer": str(getattr(training_args.optim, "value", training_args.optim)),
        "seed": training_args.seed,
    }
    if getattr(trainer, "optimizer_cls_and_kwargs", None):  # ours (Lion), not Trainer's --optim
        cls, kwargs = trainer.optimizer_cls_and_kwargs
        betas = f", betas {tuple(kwargs['betas'])}" if kwargs.get("betas") else ""
        summary["optimizer"] = f"{cls.__name__} ({cls.__module__.split('.')[0]}{betas})"
    if getattr(training_args, "fsdp", None):
        config = getattr(training_args, "fsdp_config", None) or {}
        version = config.get("version", config.get("fsdp_version", 2))
        summary["parallelism"] = f"FSDP{version} (sharded by AoTLayer)"
    elif world > 1:
        summary["parallelism"] = "DDP"
    summary.update(extra or {})
    return summary


def _full_state_model(trainer: Trainer) -> tuple[PreTrainedModel | PeftModel, bool]:
    """The trained model with full (unsharded) weights, and whether it was gathered. Under FSDP every rank must call
    this (the shards are gathered on the main process, a collective); the main process then loads them into a fresh,
    unsharded copy of the model, since the trained one holds only its shard of each parameter (DTensors)."""
    accelerator = trainer.accelerator
    model = accelerator.unwrap_model(trainer.model)
    if not (getattr(trainer, "is_fsdp_enabled", False) or getattr(model, "is_distributed_loading_by_transformers", 0)):
        return model, False
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # Full tensors whatever the checkpoints' state_dict_type (a collective; with cpu_offload only rank 0 keeps them).
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state_dict = get_model_state_dict(trainer.model, options=options)
    if not trainer.is_world_process_zero():
        return model, True
    from ..modeling_aot import AoTPreTrainedModel

    # FSDP2 swaps the class for a generated subclass (FSDPAoTForCausalLM): build the AoT class it came from.
    cls = next(
        c for c in type(model).__mro__ if issubclass(c, AoTPreTrainedModel) and not c.__name__.startswith("FSDP")
    )
    config = copy.copy(model.config)
    config.distributed_config = None  # a tensor-parallel run's sharding (transformers' DistributedConfig): not kept
    full = cls(config)
    missing, unexpected = full.load_state_dict(state_dict, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"gathered FSDP weights do not fit the model: missing {missing}, unexpected {unexpected}")
    full.tie_weights()
    return full.eval(), True


def finish_run(
    run: TrainingRun, metrics: dict[str, Any], results: list[dict[str, Any]], training: dict[str, Any]
) -> dict[str, Any]:
    """Write the final hub-ready folder of `run` (a `run.TrainingRun`) atomically (model or LoRA adapter, tokenizer
    or image processor, code files, model card with `results` and the `training` summary, `results.json`, training
    curves), push it if asked, and save the metrics. Every process must call it (FSDP gathers its shards here); only
    the main process writes. Returns `metrics` with `final_model_dir` (None off the main process)."""
    from ..errors import RunError
    from ..hub import check_finite_weights, export_model, push_to_hub
    from ..model_card import render_model_card, training_results_json

    trainer, training_args, publish_args, plan = run.trainer, run.training_args, run.publish_args, run.hub
    task, processor, lora, base_model = run.task, run.processor, run.lora, run.model_args.model_name_or_path
    final_dir = publish_args.final_dir(training_args)
    model, _ = _full_state_model(trainer)
    if not trainer.is_world_process_zero():
        metrics["final_model_dir"] = None
        return metrics
    # a diverged run that the step checks did not see
    check_finite_weights(
        model, lambda bad: RunError(f"the trained weights are not finite ({bad}): nothing was exported")
    )
    model_name = publish_args.model_name or training_args.hub_model_id or final_dir.name
    model.config.architectures = model.config.architectures or [
        type(model).__name__
    ]  # as saving sets it; the card names it
    num_parameters = sum(p.numel() for p in model.parameters())
    files: dict[str, Any] = {
        RESULTS_FILE: training_results_json(
            model_name, task=task, results=results, training=training, metrics=metrics, num_parameters=num_parameters
        )
    }
    curves = None
    if publish_args.make_plots:
        curves = plot_training_curves(
            trainer.state.log_history, Path(training_args.output_dir) / CURVES_FILE, title=final_dir.name
        )
        if curves is not None:
            files[CURVES_FILE] = curves
    hub_base = base_model if is_hub_id(base_model) else None
    card_kwargs = dict(
        model_name=model_name.split("/")[-1],
        repo_id=plan.repo_id or model_name,
        task=task,
        datasets=run.source.hub_ids,
        dataset_description=run.source.description,
        results=results,
        training=training,
        num_parameters=num_parameters,
        curves_file=CURVES_FILE if curves is not None else None,
        base_model=hub_base,
        base_model_description=base_model if base_model and hub_base is None else None,
    )
    protected = (training_args.output_dir,)
    if lora is not None and not lora.merge_lora:
        from .lora import export_adapter

        export_adapter(
            model, final_dir, processor=processor, card_kwargs=card_kwargs, files=files, protected=protected
        )
    else:
        if lora is not None:  # the base model with the adapters merged in: no PEFT needed to load it
            model = model.merge_and_unload()
            card_kwargs["tags"] = ["lora-merged"]
        export_model(
            model,
            final_dir,
            tokenizer=processor if task == "text-generation" else None,
            image_processor=processor if task != "text-generation" else None,
            model_card=render_model_card(model.config, **card_kwargs),
            extra_files=files,
            protected=protected,
        )
    logger.info("Final model written to %s", final_dir)
    if plan.push:
        options = _push_options(training_args, plan)
        result = push_to_hub(final_dir, plan.repo_id, **options, commit_message="End of training")
        print(f"Pushed {final_dir} to {result.repo_url} (commit {result.commit_oid}).")
    metrics["final_model_dir"] = str(final_dir)
    trainer.save_metrics("all", {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    return metrics


__all__ = [
    "HubPlan",
    "finish_run",
    "hub_checkpoint_callback",
    "perplexity",
    "plot_training_curves",
    "take_over_hub_options",
    "training_summary",
]
