"""The arguments of a training run as the user gives them: which model (shared by `aot train lm` and `aot train
image`) and where the result goes; parsing of our dataclasses plus every `TrainingArguments` flag from the command
line or a `.json` / `.yaml` file; and the checks of values that parse but cannot be trained with. Building the config
from them is `model_setup.py`."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .._io import arg
from ..errors import UsageError

if TYPE_CHECKING:  # never in the fields of the dataclasses below: HfArgumentParser evaluates those
    from datasets import DatasetDict, IterableDatasetDict
    from transformers import HfArgumentParser, TrainingArguments

    from .text_data import TextDataArguments
    from .vision_data import ImageDataArguments

CURVES_FILE = "training_curves.png"


class TrainingSetupError(UsageError):
    """Bad input found while setting up a run, before any training step (exit code 2)."""


def check_dataset_name(name: str | None, allowed: str) -> None:
    """A `--dataset_name` given but blank is refused, naming what it may be (`allowed`)."""
    if name is not None and not name.strip():
        raise TrainingSetupError("is empty", argument="--dataset_name", value=name, allowed=allowed)


def load_hub_dataset(
    name: str, args: TextDataArguments | ImageDataArguments, local_hint: str, **options: Any
) -> DatasetDict | IterableDatasetDict:
    """Hub dataset `name` (config `args.dataset_config_name`), which must have the split `args.train_split`; a
    `TrainingSetupError` when it cannot be loaded (offline, unknown id, gated), saying what to pass for local data."""
    import datasets

    try:
        loaded = datasets.load_dataset(name, args.dataset_config_name, **options)
    except Exception as error:  # say so before anything else happens
        where = (
            "" if Path(name).is_dir() else f" from the Hub: {type(error).__name__}: {error}. For local {local_hint}"
        )
        if not where:
            where = f": {type(error).__name__}: {error}"
        raise TrainingSetupError(f"Could not load dataset {name!r}{where}.") from error
    if args.train_split not in loaded:
        raise TrainingSetupError(f"Dataset {name!r} has no split {args.train_split!r} (splits: {list(loaded)}).")
    return loaded


@dataclass
class ModelArguments:
    """Which model to train: a checkpoint to fine-tune, a preset, or a config file, with overrides. Shared by the
    language-model and image-classification trainers, which add their own fields (tokenizer, image size)."""

    model_name_or_path: str | None = arg(None, "A checkpoint (folder or Hub id) to fine-tune.")
    model_type: str = arg(
        "aot",
        "The architecture of a new model: 'aot', or a baseline built from the same size fields (--preset, "
        "--config_overrides hidden_size=...): 'gpt2' or 'llama' (aot train lm), 'vit' (aot train image).",
    )
    preset: str | None = arg(None, "A named configuration (`aot info` lists them); default: the task's tiny one.")
    config_file: str | None = arg(None, "A config.json to build the model from.")
    config_overrides: str | None = arg(None, "Config fields to override, e.g. 'hidden_size=128,num_hidden_layers=6'.")


@dataclass
class PublishArguments:
    """Where the final model goes and how it is published. Trainer's own `--push_to_hub`, `--hub_model_id`,
    `--hub_token`, `--hub_private_repo`, `--hub_revision` and `--hub_strategy` select the push."""

    final_model_dir: str | None = arg(
        None, "Hub-ready folder for the final model (default: <output_dir>/model). Written atomically."
    )
    hub_endpoint: str | None = arg(None, "Hub URL for --push_to_hub (default: HF_ENDPOINT or https://huggingface.co).")
    model_name: str | None = arg(None, "Name in the model card (default: folder name).")
    make_plots: bool = arg(True, f"Write {CURVES_FILE} into the final folder.")

    def final_dir(self, training_args: TrainingArguments) -> Path:
        """The final folder: `--final_model_dir`, default `<output_dir>/model`."""
        return Path(self.final_model_dir or Path(training_args.output_dir) / "model")


def parse_dataclasses(classes: tuple[type, ...], argv: list[str] | None = None) -> tuple[Any, ...]:
    """Parse `(*classes, TrainingArguments)` from `argv` (default `sys.argv[1:]`); a single `.json`, `.yaml` or
    `.yml` argument is read as a file of arguments instead (the recipes' form)."""
    from transformers import HfArgumentParser, TrainingArguments

    parser = HfArgumentParser((*classes, TrainingArguments))

    def one_line_error(message: str) -> NoReturn:  # argparse would print the whole usage block (a hundred lines) first
        raise TrainingSetupError(f"{message} (see `aot train --help`)")

    parser.error = one_line_error
    for action in parser._actions:  # TrainingArguments types it as accelerate's ParallelismConfig: read JSON instead
        action.type = json.loads if action.dest == "parallelism_config" else action.type
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        check_fsdp_config(argv)
        if len(argv) == 1 and argv[0].endswith((".json", ".yaml", ".yml")):
            parsed = parser.parse_dict(read_arguments_file(argv[0]))
        elif len(argv) > 1 and argv[0].endswith((".yaml", ".yml", ".json")) and not argv[0].startswith("-"):
            parsed = _parse_file_with_overrides(parser, argv[0], argv[1:])
        else:
            parsed = parser.parse_args_into_dataclasses(args=argv)
        for values in parsed[:-1]:
            check_positive_fields(values)
        check_training_arguments(parsed[-1])
        return parsed
    except TrainingSetupError:
        raise
    except ValueError as error:  # unknown or invalid arguments: say so in one line, before anything runs
        raise TrainingSetupError(str(error)) from error
    except SystemExit as exit_:  # argparse's own error (already printed on one line): keep its code
        if exit_.code not in (0, None):
            raise TrainingSetupError("invalid command-line arguments (see the message above)") from None
        raise


# Our own fields that count something: None means "the default", any given value must be at least 1.
POSITIVE_FIELDS = (
    "tokenizer_vocab_size block_size max_train_samples max_eval_samples preprocessing_num_workers "
    "streaming_validation_examples image_size"
).split()


def check_positive_fields(values: Any) -> None:
    """Refuse 0 or a negative count in one of our argument dataclasses (0 used to mean "default" silently)."""
    for name in POSITIVE_FIELDS:
        value = getattr(values, name, None)
        if value is not None and (isinstance(value, bool) or value < 1):
            raise TrainingSetupError(
                "must be at least 1 (leave it out for the default)", argument=f"--{name}", value=value
            )


def check_training_arguments(args: TrainingArguments) -> None:
    """Refuse `TrainingArguments` values that transformers accepts but that train nothing, crash later or
    silently mean something else: one line naming the flag, exit code 2."""
    import math

    def finite(low: float) -> Callable[[float], bool]:
        return lambda value: math.isfinite(value) and value >= low

    steps, seeds = "a number > 0 (steps, or a fraction of the run below 1)", "an integer in [0, 2**32 - 1]"
    at_least_1 = (lambda value: value >= 1, "an integer >= 1")
    rules = {  # flag: (test of a given value, what is allowed), checked in this order
        "per_device_train_batch_size": at_least_1,
        "per_device_eval_batch_size": at_least_1,
        "gradient_accumulation_steps": at_least_1,
        "max_steps": (lambda value: value >= 1 or value == -1, "an integer >= 1, or -1 to train --num_train_epochs"),
        "num_train_epochs": (
            lambda value: finite(0)(value) and (value > 0 or args.max_steps != -1),
            "a finite number > 0",
        ),
        "learning_rate": (finite(0), "a finite number >= 0"),
        "weight_decay": (finite(0), "a finite number >= 0"),
        "adam_epsilon": (finite(0), "a finite number >= 0"),
        "max_grad_norm": (finite(0), "a finite number >= 0 (0: no clipping)"),
        "adam_beta1": (lambda value: 0 <= value < 1, "a number in [0, 1)"),
        "adam_beta2": (lambda value: 0 <= value < 1, "a number in [0, 1)"),
        "seed": (lambda value: 0 <= value < 2**32, seeds),
        "data_seed": (lambda value: 0 <= value < 2**32, seeds),  # None: the seed
        "save_steps": (lambda value: math.isfinite(value) and value > 0, steps),
        "logging_steps": (lambda value: math.isfinite(value) and value > 0, steps),
        "eval_steps": (lambda value: math.isfinite(value) and value > 0, steps),
        "save_total_limit": (lambda value: value >= 1, "an integer >= 1, or leave it out to keep every checkpoint"),
    }
    for name, (test, allowed) in rules.items():
        value = getattr(args, name, None)
        if value is not None and not test(value):
            raise TrainingSetupError("is not allowed", argument=f"--{name}", value=value, allowed=allowed)
    if args.fsdp_config and not args.fsdp:
        raise TrainingSetupError(
            "is ignored without --fsdp", argument="--fsdp_config", allowed="with --fsdp, e.g. --fsdp full_shard"
        )


def check_fsdp_config(argv: list[str]) -> None:
    """`--fsdp_config` (on the command line or in an arguments file) must be a JSON object or the path of a JSON file
    holding one, as `TrainingArguments` reads it; else a `TrainingSetupError` naming the flag, before parsing."""
    import argparse

    reader = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    reader.add_argument("--fsdp_config")
    value = reader.parse_known_args(argv)[0].fsdp_config
    if argv and argv[0].endswith((".json", ".yaml", ".yml")) and not argv[0].startswith("-") and value is None:
        value = read_arguments_file(argv[0]).get("fsdp_config")
    if value is None or isinstance(value, dict):
        return
    allowed, text = "a JSON object, or the path of a JSON file holding one", str(value)
    if not text.lstrip().startswith("{"):
        if not Path(text).is_file():
            raise TrainingSetupError("no such file", argument="--fsdp_config", value=text, allowed=allowed)
        text = Path(text).read_text(encoding="utf-8", errors="replace")
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as error:
        raise TrainingSetupError(f"is not valid JSON ({error})", argument="--fsdp_config", value=value) from None
    if not isinstance(loaded, dict):
        raise TrainingSetupError("is not a JSON object", argument="--fsdp_config", value=value, allowed=allowed)


def read_arguments_file(path: str) -> dict[str, Any]:
    """The mapping of argument names to values in a `.json` / `.yaml` arguments file. A missing or unreadable file,
    malformed JSON or YAML, or anything but a mapping is a `TrainingSetupError` naming the file (and the line)."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise TrainingSetupError("no such arguments file", argument="arguments file", value=path)
    kind = "JSON" if file.suffix == ".json" else "YAML"
    try:
        text = file.read_text(encoding="utf-8")
        values = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as error:
        raise TrainingSetupError(
            f"cannot be read ({type(error).__name__}: {error})", argument="arguments file", value=path
        ) from None
    except json.JSONDecodeError as error:
        raise TrainingSetupError(
            f"line {error.lineno}: not valid JSON ({error.msg})", argument="arguments file", value=path
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise TrainingSetupError(f"{where}not valid YAML ({problem})", argument="arguments file", value=path) from None
    if not isinstance(values, dict):
        raise TrainingSetupError(
            "must hold a mapping of argument names to values", argument="arguments file", value=path
        )
    return values


def _parse_file_with_overrides(parser: HfArgumentParser, path: str, argv: list[str]) -> tuple[Any, ...]:
    """A recipe file plus command-line flags that override it (`recipe.yaml --max_steps 10 --output_dir x`)."""
    values = read_arguments_file(path)
    # The file's values become the parser's defaults (kept as the YAML typed them: booleans, mappings), so flags on
    # the command line override them; an unknown name is left over and reported like an unknown flag.
    known = {f.name for dtype in parser.dataclass_types for f in fields(dtype)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TrainingSetupError(f"{path}: unknown argument names {unknown} (see `aot train --help`)")
    parser.set_defaults(**values)
    return parser.parse_args_into_dataclasses(args=argv)


__all__ = [
    "ModelArguments",
    "PublishArguments",
    "TrainingSetupError",
    "check_training_arguments",
    "parse_dataclasses",
]
