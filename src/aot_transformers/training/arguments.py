"""The arguments of a training run: which model (shared by `aot train lm` and `aot train image`), where the result
goes, parsing of our dataclasses plus every `TrainingArguments` flag, and building the model's config."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..configuration_aot import AoTConfig
from ..errors import UsageError, run_command

CURVES_FILE = "training_curves.png"


class TrainingSetupError(UsageError):
    """Bad input found while setting up a run, before any training step (exit code 2)."""


@dataclass
class ModelArguments:
    """Which model to train: a checkpoint to fine-tune, a preset, or a config file, with overrides. Shared by the
    language-model and image-classification trainers, which add their own fields (tokenizer, image size)."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "An AoT checkpoint (folder or Hub id) to fine-tune."}
    )
    preset: str | None = field(
        default=None, metadata={"help": "A named configuration (`aot info` lists them); default: the task's tiny one."}
    )
    config_file: str | None = field(default=None, metadata={"help": "A config.json to build the model from."})
    config_overrides: str | None = field(
        default=None, metadata={"help": "Config fields to override, e.g. 'hidden_size=128,num_hidden_layers=6'."}
    )

    def build_config(self, default_preset: str, **fields: Any) -> AoTConfig:
        """The config of the model to train (see `build_config`)."""
        return build_config(
            self.model_name_or_path, self.preset, self.config_file, self.config_overrides, default_preset, **fields
        )


@dataclass
class PublishArguments:
    """Where the final model goes and how it is published. Trainer's own `--push_to_hub`, `--hub_model_id`,
    `--hub_token`, `--hub_private_repo`, `--hub_revision` and `--hub_strategy` select the push."""

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
            raise TrainingSetupError(
                "entries must look like name=value", argument="--config_overrides", value=item.strip()
            )
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
    `--config_overrides` and then `fields` applied, checked with `AoTConfig.validate()`. Raises
    `TrainingSetupError` for a bad choice."""
    sources = [s for s in (model_name_or_path, config_file) if s] + ([preset] if preset else [])
    if len(sources) > 1:
        raise TrainingSetupError(
            "Give at most one of --model_name_or_path, --config_file and --preset, got "
            f"{', '.join(map(repr, sources))}."
        )
    overrides = {**parse_overrides(config_overrides), **{k: v for k, v in fields.items() if v is not None}}
    try:
        if model_name_or_path:
            if looks_like_path(model_name_or_path) and not Path(model_name_or_path).exists():
                raise TrainingSetupError("no such folder", argument="--model_name_or_path", value=model_name_or_path)
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
                raise TrainingSetupError("no such file", argument="--config_file", value=config_file)
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


def looks_like_path(name: str) -> bool:
    """Whether `name` is meant as a local path rather than a Hub id (`namespace/name`)."""
    return name.startswith((".", "/", "~")) or os.sep in name and name.count("/") != 1 or name.endswith(os.sep)


def is_hub_id(name: str | None) -> bool:
    """Whether `name` is a Hub repository id (`name` or `namespace/name`) and not a local folder."""
    if not name or looks_like_path(name) or Path(name).exists():
        return False
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def parse_dataclasses(classes: tuple[type, ...], argv: list[str] | None = None) -> tuple[Any, ...]:
    """Parse `(*classes, TrainingArguments)` from `argv` (default `sys.argv[1:]`); a single `.json`, `.yaml` or
    `.yml` argument is read as a file of arguments instead (the recipes' form)."""
    from transformers import HfArgumentParser, TrainingArguments

    parser = HfArgumentParser((*classes, TrainingArguments))
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(argv) == 1 and argv[0].endswith(".json"):
            return parser.parse_json_file(json_file=argv[0])
        if len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
            return parser.parse_yaml_file(yaml_file=argv[0])
        if len(argv) > 1 and argv[0].endswith((".yaml", ".yml", ".json")) and not argv[0].startswith("-"):
            return _parse_file_with_overrides(parser, argv[0], argv[1:])
        return parser.parse_args_into_dataclasses(args=argv)
    except ValueError as error:  # unknown or invalid arguments: say so in one line, before anything runs
        raise TrainingSetupError(str(error)) from error
    except SystemExit as exit_:  # argparse's own error (already printed on one line): keep its code
        if exit_.code not in (0, None):
            raise TrainingSetupError("invalid command-line arguments (see the message above)") from None
        raise


def _parse_file_with_overrides(parser, path: str, argv: list[str]) -> tuple[Any, ...]:
    """A recipe file plus command-line flags that override it (`recipe.yaml --max_steps 10 --output_dir x`)."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise TrainingSetupError("no such arguments file", argument="arguments file", value=path)
    values = json.loads(file.read_text()) if file.suffix == ".json" else yaml.safe_load(file.read_text())
    if not isinstance(values, dict):
        raise TrainingSetupError("must hold a mapping of argument names to values", argument=path)
    # The file's values become the parser's defaults (kept as the YAML typed them: booleans, mappings), so flags on
    # the command line override them; an unknown name is left over and reported like an unknown flag.
    import dataclasses

    known = {f.name for dtype in parser.dataclass_types for f in dataclasses.fields(dtype)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise TrainingSetupError(f"{path}: unknown argument names {unknown} (see `aot train --help`)")
    parser.set_defaults(**values)
    return parser.parse_args_into_dataclasses(args=argv)


def run_with_clear_errors(job: Callable[[], Any], prog: str = "aot train") -> int:
    """Run `job` under the error contract of `aot_transformers.errors` (bad input: one line, exit 2; a failed run:
    one line, exit 1); the return value of `job` is ignored."""

    def wrapped() -> int:
        job()
        return 0

    return run_command(wrapped, prog=prog)


__all__ = [
    "ModelArguments",
    "PublishArguments",
    "TrainingSetupError",
    "build_config",
    "is_hub_id",
    "parse_dataclasses",
    "parse_overrides",
    "run_with_clear_errors",
]


def use_training_attention(model, training_args) -> None:
    """Train MSSA models on CPU with the `"shared_projection"` backend: with query = key = value its backward folds
    into fewer matmuls (`attention_aot._SharedProjectionAttention`; `python -m benchmarks.bench_attention`). It falls
    back to SDPA wherever it does not apply, and the exported folder loads with the default backend (`"sdpa"`)."""
    config = model.config
    on_cpu = training_args.use_cpu or not torch.cuda.is_available()
    if on_cpu and config.attention_type == "mssa" and config.knn_k is None and config._attn_implementation == "sdpa":
        model.set_attn_implementation("shared_projection")
