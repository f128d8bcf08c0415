"""The skeleton of a training run, shared by `aot train lm` (`lm.py`) and `aot train image` (`image.py`), which add
only their own data and model preparation between its steps:

    run = TrainingRun.begin(task, metric, model_args, data_args, training_args, publish_args, callbacks, lora, optim)
    config = run.build_config(AutoClass, DEFAULT_PRESET)   # the config, the checkpoint's weights, LoRA's targets
    run.start(config, data_fingerprint, **settings)       # output folder, lock, resume, seed: nothing read before
    ...                                                   # the task's data, tokenizer or image processor
    model = run.load_model(config)                        # weights, training attention, LoRA adapters
    run.make_trainer(TrainerClass, model, train, validation, processor, ...)
    run_training(run)                                     # train, evaluate, write (and push) the final folder

Every input is checked before the first training step; the output folder's lock is held until the run ends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._io import load_pretrained
from ..errors import is_refusal, run_command
from .arguments import ModelArguments, PublishArguments, TrainingSetupError, parse_dataclasses
from .finish import HubPlan, finish_run, hub_checkpoint_callback, take_over_hub_options, training_summary
from .lora import LoraArguments, apply_lora, check_lora_targets
from .model_setup import (
    build_config,
    check_checkpoint_weights,
    check_fits_in_memory,
    tensor_parallel_config,
    use_training_attention,
)
from .optim import OptimizerArguments, optimizer_cls_and_kwargs
from .run_state import run_identity, run_state_callbacks, start_run, train_unless_finished

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset
    from peft import PeftModel
    from transformers import (
        BaseImageProcessor,
        PreTrainedConfig,
        PreTrainedModel,
        PreTrainedTokenizerBase,
        Trainer,
        TrainingArguments,
    )
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    from .text_data import TextDataArguments
    from .vision_data import ImageDataArguments

logger = logging.getLogger(__name__)


@dataclass
class TrainingRun:
    """One run, filled in step by step (see the module docstring); `run_training(run)` trains it."""

    task: str  # the pipeline task: "text-generation" or "image-classification"
    metric: str  # the evaluation metric the model card reports: `eval_<metric>`, `test_<metric>`
    model_args: ModelArguments
    data_args: Any
    training_args: Any
    publish_args: PublishArguments
    hub: HubPlan
    callbacks: list = field(default_factory=list)
    lora: LoraArguments | None = None
    optimizer: tuple[type, dict] | None = None  # `Trainer(optimizer_cls_and_kwargs=...)`
    identity: dict[str, Any] | None = None  # what the run's checkpoints are made from (`run_state.run_identity`)
    distributed: Any = None  # transformers' `DistributedConfig` of a tensor-parallel run
    lock: Any = None  # the output folder's lock, held until the run ends
    claim: Any = None  # what the run found in its output folder (`run_state.OutputFolderClaim`), main process only
    resume: str | None = None  # the checkpoint training resumes from
    trainer: Any = None
    model_cls: type | None = None  # the class of the model trained: AoT's, or a baseline's (`--model_type`)
    processor: Any = None  # the tokenizer or image processor saved with the model
    source: Any = None  # the task's loaded data (`TextSource`, `ImageSource`): its name and Hub ids go in the card
    test: Callable[[], Any] | None = None  # the prepared test split, evaluated after training
    summary: dict[str, Any] = field(default_factory=dict)  # the task's lines of the card's training summary
    extra_metrics: dict[str, Any] = field(default_factory=dict)  # added to the metrics after evaluation

    @classmethod
    def begin(
        cls,
        task: str,
        metric: str,
        model_args: ModelArguments,
        data_args: TextDataArguments | ImageDataArguments,
        training_args: TrainingArguments,
        publish_args: PublishArguments | None = None,
        callbacks: list | None = None,
        lora: LoraArguments | None = None,
        optim: OptimizerArguments | None = None,
    ) -> TrainingRun:
        """The checks every run makes first (LoRA, optimizer, Hub options); nothing is read or written yet."""
        publish_args = publish_args or PublishArguments()
        if lora is not None:
            lora.check()
            lora = lora if lora.enabled else None
        optimizer = optimizer_cls_and_kwargs(optim, training_args)
        if lora is not None and training_args.fsdp:
            raise TrainingSetupError("LoRA adapters are trained without FSDP here; drop --fsdp", argument="--lora_r")
        version = (training_args.fsdp_config or {}).get("version", 2) if training_args.fsdp else 2
        if version != 2:  # accelerate's FSDP1 would fail later with "no available devices" on CPU
            message = 'FSDP2 is the supported version ("version": 2, the default)'
            raise TrainingSetupError(message, argument="--fsdp_config version", value=version)
        hub = take_over_hub_options(training_args, publish_args)
        callbacks = list(callbacks or [])
        return cls(task, metric, model_args, data_args, training_args, publish_args, hub, callbacks, lora, optimizer)

    def build_config(
        self,
        auto_cls: type[_BaseAutoModelClass],
        default_preset: str,
        skip_prefixes: tuple[str, ...] = (),
        **fields: Any,
    ) -> PreTrainedConfig:
        """The model's config (`model_setup.build_config`) and class (the one `auto_cls`, a transformers Auto class,
        maps it to), checked against the checkpoint's weights (tensors under `skip_prefixes` may differ) and LoRA's
        target modules, before any data is read."""
        import torch

        config = build_config(self.model_args, default_preset, self.task, **fields)
        self.model_cls = model_cls = auto_cls._model_mapping[type(config)]
        self.distributed = tensor_parallel_config(self.training_args, config)
        if self.distributed is not None and self.lora is not None:
            raise TrainingSetupError("LoRA adapters are trained without tensor parallelism here", argument="--lora_r")
        with torch.device("meta"):  # shapes only, nothing allocated
            model = model_cls(config)
        check_fits_in_memory(model)
        check_checkpoint_weights(self.model_args.model_name_or_path, model, skip_prefixes)
        if self.lora is not None:
            check_lora_targets(model, self.lora)
            self.lora.check_base(self.model_args.model_name_or_path)
        return config

    def start(self, config: PreTrainedConfig, data: list[str], **settings: Any) -> None:
        """Record what the run is made from (`config`, the `data` fingerprint, the task's `settings`), check and
        lock the output folder, find the checkpoint to resume from (`run_state.start_run`), and seed."""
        from transformers import set_seed

        if self.data_args.streaming and self.training_args.max_steps <= 0:
            message = "a stream has no length to plan epochs with: give --max_steps"
            raise TrainingSetupError(message, argument="--streaming")
        settings.update(base_model=self.model_args.model_name_or_path, lora=self.lora.lora_r if self.lora else None)
        self.identity = run_identity(self.training_args, config, data, **settings)
        self.lock, self.resume, self.claim = start_run(self.training_args, self.publish_args, self.identity)
        set_seed(self.training_args.seed)

    @contextmanager
    def refusals_undone(self) -> Iterator[None]:
        """A block of the run's preparation: if it raises, the output folder's lock is released, and a refusal (bad
        input, exit code 2) leaves the folder as the run found it (`run_state.OutputFolderClaim`)."""
        try:
            yield
        except BaseException as error:
            self.end(error)
            raise

    def end(self, error: BaseException | None = None) -> None:
        """Release the output folder's lock; before that, after a refusal `error` that came before the first training
        step, undo what the run wrote there."""
        if error is not None and is_refusal(error) and self.claim is not None:
            self.claim.undo()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def load_model(
        self, config: PreTrainedConfig, note: str = "", **from_pretrained: Any
    ) -> PreTrainedModel | PeftModel:
        """The checkpoint's model (fine-tuning) or a new one, with the training attention backend and, with LoRA,
        its adapters."""
        name, model_cls = self.model_args.model_name_or_path, self.model_cls
        if self.distributed is not None:
            model = self._load_sharded(model_cls, config, name, **from_pretrained)
        elif name:
            model = load_pretrained(model_cls, name, config=config, **from_pretrained)
        else:
            model = model_cls(config)
        if self.task == "text-generation":
            model.config.use_cache = False  # no cache while training; generation turns it back on
        use_training_attention(model, self.training_args)
        if self.lora is not None:
            model = apply_lora(model, self.lora, self.task)
        logger.info("Model: %s parameters%s", f"{sum(p.numel() for p in model.parameters()):,}", note)
        return model

    def _load_sharded(
        self, model_cls: type[PreTrainedModel], config: PreTrainedConfig, name: str | None, **from_pretrained: Any
    ) -> PreTrainedModel:
        """The model sharded by `self.distributed` as it loads: a new model is built and saved by the main process
        (every rank builds the same one from the seed), loaded by all, and removed."""
        import shutil
        from pathlib import Path

        import torch.distributed as dist

        folder = name or Path(self.training_args.output_dir) / "tensor-parallel-init"
        if not name:
            with self.training_args.main_process_first(desc="the new model, saved to shard it as it loads"):
                if self.training_args.process_index == 0:
                    model_cls(config).save_pretrained(folder)
        model = model_cls.from_pretrained(
            folder, config=config, distributed_config=self.distributed, **from_pretrained
        )
        if not name:
            dist.barrier()
            if self.training_args.process_index == 0:
                shutil.rmtree(folder)
        tp, shards, args = self.distributed.tp_size, self.distributed.fsdp_size, self.training_args
        self.summary["parallelism"] = f"tensor parallel {tp} x FSDP2 {shards} (transformers' DistributedConfig)"
        self.summary["global batch size"] = (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * shards
        )
        return model

    def make_trainer(
        self,
        trainer_cls: type[Trainer],
        model: PreTrainedModel | PeftModel,
        train: Dataset | IterableDataset,
        validation: Dataset | IterableDataset | None,
        processor: PreTrainedTokenizerBase | BaseImageProcessor,
        **kwargs: Any,
    ) -> Trainer:
        """The run's `Trainer` (a subclass of `run_state.RecordRunTrainerMixin`): no evaluation without validation
        data, the run-state callbacks and the Hub checkpoint push (`finish.hub_checkpoint_callback`)."""
        if validation is None and self.training_args.eval_strategy != "no":
            self.training_args.eval_strategy = "no"
        hub_callback = hub_checkpoint_callback(self.hub)
        self.processor = processor
        self.trainer = trainer_cls(
            model=model,
            args=self.training_args,
            train_dataset=train,
            eval_dataset=validation,
            processing_class=processor,
            optimizer_cls_and_kwargs=self.optimizer,
            callbacks=[*self.callbacks, *run_state_callbacks(self.claim), *([hub_callback] if hub_callback else [])],
            **kwargs,
        )
        self.trainer.run_record = self.identity
        enable_fsdp_on_cpu(self.trainer)
        return self.trainer


def enable_fsdp_on_cpu(trainer: Trainer) -> bool:
    """Make `trainer` use the FSDP plugin of its `TrainingArguments` when its processes run on the CPU (gloo); returns
    whether it changed anything. Call it after building the Trainer and before training.

    Accelerate switches to FSDP only for GPU-like processes, so on `MULTI_CPU` the plugin Trainer builds from
    `--fsdp`/`--fsdp_config` would be silently dropped (plain DDP); FSDP2 itself works on CPU tensors with gloo, so
    the CPU dry runs exercise the cluster code path."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    plugin_args = getattr(trainer.args, "fsdp_plugin_args", None)
    state = trainer.accelerator.state
    if plugin_args is None or trainer.is_fsdp_enabled or state.distributed_type != DistributedType.MULTI_CPU:
        return False
    plugin = FullyShardedDataParallelPlugin(**plugin_args)
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    trainer.is_fsdp_enabled = True
    logger.info("FSDP%s on %d CPU processes (gloo).", plugin.fsdp_version, state.num_processes)
    return True


def run_training(run: TrainingRun) -> dict[str, Any]:
    """Train, evaluate (validation, and the test split when there is one), write the final hub-ready folder and
    push it if asked. Returns the metrics. The output folder's lock is released at the end, whatever happens; a run
    refused before its first step leaves the folder as it found it."""
    with run.refusals_undone():
        trainer = run.trainer
        with trackers_open_until_evaluated(trainer):
            metrics = train_unless_finished(trainer, run.resume)
            if run.claim is not None:  # trained (or already had): the folder's files are the run's
                run.claim.keep()
            trainer.save_state()  # <output_dir>/trainer_state.json: the whole log history, as transformers' examples
            results, name = [], run.source.name
            evaluations = [("validation", "eval", None)] if trainer.eval_dataset is not None else []
            evaluations += [("test", "test", run.test)] if run.test is not None else []
            for split, prefix, prepare in evaluations:
                metrics.update(trainer.evaluate(prepare() if prepare else None, metric_key_prefix=prefix))
                value = metrics[f"{prefix}_{run.metric}"]
                results.append(
                    {"metric": run.metric, "value": value, "split": split, "dataset": name, "dataset_type": name}
                )
        metrics.update(run.extra_metrics)
        if run.task == "text-generation":
            trainer.accelerator.unwrap_model(trainer.model).config.use_cache = True
        metrics = finish_run(run, metrics, results, training_summary(run.training_args, trainer, run.summary))
    run.end()
    return metrics


@contextmanager
def trackers_open_until_evaluated(trainer: Trainer) -> Iterator[None]:
    """Hold back the experiment trackers' `on_train_end` (the `--report_to` callbacks) until the block ends, so the
    final evaluations are logged to the run that logged the training.

    `on_train_end` closes TensorBoard's writer and ends trackio's and MLflow's run; the first log after it, the
    final evaluation's, would open a new writer or a new run, which the trackers show as a second run. The held call
    is made once, with the arguments `Trainer` gave it, whatever happens in the block.
    """
    from transformers.integrations import INTEGRATION_TO_CALLBACK

    trackers = [
        c for c in trainer.callback_handler.callbacks if isinstance(c, tuple(INTEGRATION_TO_CALLBACK.values()))
    ]
    held: list[tuple[Any, tuple, dict]] = []
    for tracker in trackers:  # this Trainer's own callback objects; the classes are untouched
        tracker.on_train_end = lambda *args, _tracker=tracker, **kwargs: held.append((_tracker, args, kwargs))
    try:
        yield
    finally:
        for tracker in trackers:
            del tracker.on_train_end
        for tracker, args, kwargs in held:
            tracker.on_train_end(*args, **kwargs)


def dataset_length(dataset: Dataset | IterableDataset) -> int | None:
    """The number of examples, or None for a stream."""
    try:
        return len(dataset)
    except TypeError:
        return None


def run_main(
    prepare: Callable[..., TrainingRun], argument_classes: tuple[type, ...], argv: list[str] | None, prog: str
) -> int:
    """A command-line entry point: parse `(*argument_classes, TrainingArguments)` (model, data, publish, LoRA and
    optimizer arguments), prepare and train, under the error contract of `aot_transformers.errors`."""

    def job() -> int:
        model_args, data_args, publish_args, lora, optim, training_args = parse_dataclasses(argument_classes, argv)
        run_training(prepare(model_args, data_args, training_args, publish_args, lora=lora, optim=optim))
        return 0

    return run_command(job, prog=prog)


__all__ = ["TrainingRun", "dataset_length", "enable_fsdp_on_cpu", "run_main", "run_training"]
