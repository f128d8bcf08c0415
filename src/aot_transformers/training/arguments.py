"""The arguments of a training run: which model (shared by `aot train lm` and `aot train image`), where the result
goes, parsing of our dataclasses plus every `TrainingArguments` flag, and building the model's config."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._io import looks_like_path
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


def config_field_names() -> set[str]:
    """The names `--config_overrides` accepts: every field of an `AoTConfig`."""
    return set(AoTConfig().to_dict()) | {"attn_implementation"}


def check_override_names(overrides: dict[str, Any]) -> None:
    """Refuse a `--config_overrides` name that is no config field (it would be stored and silently ignored)."""
    import difflib

    known = config_field_names()
    for name in overrides:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise TrainingSetupError(
                "is not a config field"
                + (f"; did you mean {close[0]!r}?" if close else " (`aot info` lists presets)"),
                argument="--config_overrides",
                value=name,
            )


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
    check_override_names(parse_overrides(config_overrides))
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


def check_checkpoint_weights(folder: str | None, model_cls, config, skip_prefixes: tuple[str, ...] = ()) -> None:
    """Before fine-tuning from a local `folder`: its weights must be safetensors (never pickle), readable, and of the
    shapes `config` gives `model_cls` (a truncated file or a wrong-shape tensor is named in one line, exit code 2,
    not a traceback from deep inside loading). A Hub id is left to `from_pretrained`."""
    if not folder or not Path(folder).is_dir():
        return
    import torch
    from safetensors import safe_open

    root = Path(folder)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        pickles = sorted(
            p.name for p in root.iterdir() if p.suffix.lower() in (".bin", ".pt", ".pth", ".pkl", ".ckpt")
        )
        found = (
            f"only pickle weights ({', '.join(pickles)}), which can run code when loaded" if pickles else "no weights"
        )
        raise TrainingSetupError(
            f"holds {found}; fine-tune from a folder with model.safetensors",
            argument="--model_name_or_path",
            value=folder,
        )
    with torch.device("meta"):
        state = model_cls(config).state_dict(keep_vars=True)
    expected = {name: tuple(t.shape) for name, t in state.items()}
    aliases: dict[int, list[str]] = {}  # tied tensors (saved under one of their names)
    for name, tensor in state.items():
        aliases.setdefault(id(tensor), []).append(name)
    present: set[str] = set()
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as weights:
                shapes = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
        except Exception as error:  # noqa: BLE001 - SafetensorError and OSError: both mean an unreadable file
            raise TrainingSetupError(
                f"{file} cannot be read ({error}); it may be truncated: save or download it again",
                argument="--model_name_or_path",
                value=folder,
            ) from None
        present.update(shapes)
        for name, shape in shapes.items():
            if name in expected and expected[name] != shape and not name.startswith(skip_prefixes):
                raise TrainingSetupError(
                    f"{file.name}: {name} has shape {list(shape)} but its config.json gives {list(expected[name])}",
                    argument="--model_name_or_path",
                    value=folder,
                )
    missing = sorted(
        names[0]
        for names in aliases.values()
        if not present.intersection(names) and not all(name.startswith(skip_prefixes) for name in names)
    )
    if missing:  # from_pretrained would initialise them at random with only a load report
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise TrainingSetupError(
            f"its weights lack {shown}, which would be initialised at random; save the complete model again",
            argument="--model_name_or_path",
            value=folder,
        )


def parse_dataclasses(classes: tuple[type, ...], argv: list[str] | None = None) -> tuple[Any, ...]:
    """Parse `(*classes, TrainingArguments)` from `argv` (default `sys.argv[1:]`); a single `.json`, `.yaml` or
    `.yml` argument is read as a file of arguments instead (the recipes' form)."""
    from transformers import HfArgumentParser, TrainingArguments

    parser = HfArgumentParser((*classes, TrainingArguments))

    def one_line_error(message: str):  # argparse would print the whole usage block (a hundred lines) first
        raise TrainingSetupError(f"{message} (see `aot train --help`)")

    parser.error = one_line_error
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
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
    "tokenizer_vocab_size",
    "block_size",
    "max_train_samples",
    "max_eval_samples",
    "preprocessing_num_workers",
    "streaming_validation_examples",
    "image_size",
)


def check_positive_fields(values: Any) -> None:
    """Refuse 0 or a negative count in one of our argument dataclasses (0 used to mean "default" silently)."""
    for name in POSITIVE_FIELDS:
        value = getattr(values, name, None)
        if value is not None and (isinstance(value, bool) or value < 1):
            raise TrainingSetupError(
                "must be at least 1 (leave it out for the default)", argument=f"--{name}", value=value
            )


def check_training_arguments(args) -> None:
    """Refuse `TrainingArguments` values that transformers accepts but that train nothing, crash later or
    silently mean something else: one line naming the flag, exit code 2."""
    import math

    def bad(name: str, allowed: str) -> TrainingSetupError:
        return TrainingSetupError("is not allowed", argument=f"--{name}", value=getattr(args, name), allowed=allowed)

    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        if getattr(args, name) < 1:
            raise bad(name, "an integer >= 1")
    if args.max_steps == 0 or args.max_steps < -1:
        raise bad("max_steps", "an integer >= 1, or -1 to train --num_train_epochs")
    epochs = args.num_train_epochs
    if not math.isfinite(epochs) or epochs < 0 or (epochs == 0 and args.max_steps == -1):
        raise bad("num_train_epochs", "a finite number > 0")
    for name in ("learning_rate", "weight_decay", "adam_epsilon"):
        value = getattr(args, name)
        if not math.isfinite(value) or value < 0:
            raise bad(name, "a finite number >= 0")
    if not (math.isfinite(args.max_grad_norm) and args.max_grad_norm >= 0):
        raise bad("max_grad_norm", "a finite number >= 0 (0: no clipping)")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(args, name) < 1:
            raise bad(name, "a number in [0, 1)")
    if not 0 <= args.seed < 2**32:
        raise bad("seed", "an integer in [0, 2**32 - 1]")
    if args.data_seed is not None and not 0 <= args.data_seed < 2**32:
        raise bad("data_seed", "an integer in [0, 2**32 - 1]")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        raise bad("warmup_steps", "a number >= 0")
    for name in ("save_steps", "logging_steps", "eval_steps"):
        value = getattr(args, name, None)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise bad(name, "a number > 0 (steps, or a fraction of the run below 1)")
    if args.save_total_limit is not None and args.save_total_limit < 1:
        raise bad("save_total_limit", "an integer >= 1, or leave it out to keep every checkpoint")
    if args.fsdp_config and not args.fsdp:
        raise TrainingSetupError(
            "is ignored without --fsdp", argument="--fsdp_config", allowed="with --fsdp, e.g. --fsdp full_shard"
        )


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


def _parse_file_with_overrides(parser, path: str, argv: list[str]) -> tuple[Any, ...]:
    """A recipe file plus command-line flags that override it (`recipe.yaml --max_steps 10 --output_dir x`)."""
    values = read_arguments_file(path)
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
    "check_checkpoint_weights",
    "check_training_arguments",
    "parse_dataclasses",
    "parse_overrides",
    "run_with_clear_errors",
]


def use_training_attention(model, training_args) -> None:
    """Train MSSA models on CPU with the `"shared_projection"` backend: with query = key = value its backward folds
    into fewer matmuls (`aot_transformers.shared_projection`; `python -m benchmarks.bench_attention`). It falls
    back to SDPA wherever it does not apply, and the exported folder loads with the default backend (`"sdpa"`)."""
    config = model.config
    on_cpu = training_args.use_cpu or not torch.cuda.is_available()
    if on_cpu and config.attention_type == "mssa" and config.knn_k is None and config._attn_implementation == "sdpa":
        model.set_attn_implementation("shared_projection")
