"""The model of a training run: its config (from a checkpoint, a config file or a preset, with `--config_overrides`),
the pre-check of a checkpoint's weights before fine-tuning, and the attention backend used while training."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import ParallelismConfig
from accelerate.utils import DistributedType
from huggingface_hub.errors import StrictDataclassError

from .._io import adapter_of, is_pickle_name, looks_like_path, read_weights
from ..configuration_aot import AoTConfig
from ..presets import preset_kwargs
from .arguments import ModelArguments, TrainingSetupError

if TYPE_CHECKING:
    from accelerate import Accelerator
    from transformers import PreTrainedConfig, PreTrainedModel, TrainingArguments
    from transformers.distributed.configuration_utils import DistributedConfig


def parse_overrides(text: str | None, known: set[str] | None = None) -> dict[str, Any]:
    """`"hidden_size=128,knn_k=0.5,attention_type=mhsa"` -> a dict with JSON-typed values (strings otherwise).
    Refuses a name that is not in `known` (default: the AoT config fields; it would be stored and silently ignored)."""
    import difflib

    overrides: dict[str, Any] = {}
    for item in (text or "").split(","):
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
    known = config_field_names() if known is None else known
    for name in overrides:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            raise TrainingSetupError(
                "is not a config field"
                + (f"; did you mean {close[0]!r}?" if close else " (`aot info` lists presets)"),
                argument="--config_overrides",
                value=name,
            )
    return overrides


def config_field_names(config: PreTrainedConfig | None = None) -> set[str]:
    """The names `--config_overrides` accepts: every field of `config` (default a new `AoTConfig`), with the
    standard names its `attribute_map` translates (`hidden_size` for GPT-2's `n_embd`)."""
    config = AoTConfig() if config is None else config
    # `knn_k` (with attn_implementation=knn) gives any model k-NN attention (`aot_transformers.knn`).
    return set(config.to_dict()) | set(getattr(config, "attribute_map", {})) | {"attn_implementation", "knn_k"}


# The config fields that set the size of a text model and of a vision model.
TEXT_SIZE_FIELDS = ("vocab_size", "max_position_embeddings", "hidden_size", "num_hidden_layers", "mlp_ratio")
VISION_SIZE_FIELDS = ("image_size", "patch_size", "hidden_size", "num_hidden_layers", "mlp_ratio")
# The baselines `--model_type` builds (transformers' own models), by task, and the fields they take from a preset.
BASELINES = {"text-generation": ("gpt2", "llama"), "image-classification": ("vit",)}
BASELINE_SIZE_FIELDS = {
    "text-generation": (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "max_position_embeddings",
    ),
    "image-classification": (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "image_size",
        "patch_size",
        "num_channels",
    ),
}


def baseline_config(model_type: str, task: str, preset: AoTConfig, overrides: str | None = None) -> PreTrainedConfig:
    """transformers' config of `model_type` (GPT-2, Llama, ViT) with the size of `preset` (width, depth, heads,
    context or image and patch size, vocabulary) after `overrides` (the text of `--config_overrides`, in the
    baseline's own field names or the standard ones), its MLP at the preset's `mlp_ratio` times that width (Llama's
    gated MLP at 2/3 of it, so each layer holds as many weights as GPT-2's), and no dropout."""
    from transformers import AutoConfig

    override_fields = parse_overrides(overrides, config_field_names(AutoConfig.for_model(model_type)))
    fields = {name: getattr(preset, name) for name in BASELINE_SIZE_FIELDS[task]}
    mlp_width = round(preset.mlp_ratio * override_fields.get("hidden_size", preset.hidden_size))
    fields["intermediate_size"] = round(2 * mlp_width / 3) if model_type == "llama" else mlp_width
    if model_type == "gpt2":
        fields.update(n_inner=fields.pop("intermediate_size"), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        fields.update(bos_token_id=None, eos_token_id=None)  # GPT-2's 50256: set from the tokenizer
    elif model_type == "vit":
        fields.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    # Built in one call: derived fields (Llama's key-value heads and head size) follow the sizes given.
    return AutoConfig.for_model(model_type, **{**fields, **override_fields})


def build_config(
    model_args: ModelArguments, default_preset: str, task: str = "text-generation", **fields: Any
) -> PreTrainedConfig:
    """The config of the model to train: from a checkpoint (fine-tuning), a config file, or a preset, with
    `--config_overrides` and then `fields` applied, checked with `AoTConfig.validate()`; with `--model_type` a
    baseline (`baseline_config`) of the preset's size. Raises `TrainingSetupError` for a bad choice."""
    model_name_or_path, preset, config_file = model_args.model_name_or_path, model_args.preset, model_args.config_file
    model_type = model_args.model_type
    sources = [s for s in (model_name_or_path, config_file) if s] + ([preset] if preset else [])
    if len(sources) > 1:
        raise TrainingSetupError(
            "Give at most one of --model_name_or_path, --config_file and --preset, got "
            f"{', '.join(map(repr, sources))}."
        )
    allowed = ("aot", *BASELINES[task])
    if model_type not in allowed:
        raise TrainingSetupError(
            "is not a model this task trains", argument="--model_type", value=model_type, allowed=", ".join(allowed)
        )
    given = {k: v for k, v in fields.items() if v is not None}
    try:
        from transformers import AutoConfig

        if model_name_or_path:
            if looks_like_path(model_name_or_path) and not Path(model_name_or_path).exists():
                raise TrainingSetupError("no such folder", argument="--model_name_or_path", value=model_name_or_path)
            if adapter := adapter_of(model_name_or_path):
                raise TrainingSetupError(f"--model_name_or_path: {adapter}")
            config = AutoConfig.from_pretrained(model_name_or_path)
            _check_model_type(config.model_type, allowed, model_name_or_path)
        elif config_file:
            path = Path(config_file)
            if not path.is_file():
                raise TrainingSetupError("no such file", argument="--config_file", value=config_file)
            config_dict = json.loads(path.read_text())
            file_type = config_dict.pop("model_type", "aot")
            _check_model_type(file_type, allowed, config_file)
            config = AutoConfig.for_model(file_type, **config_dict)
        if model_name_or_path or config_file:  # a given config, in its own field names, then the run's fields
            config.update({**parse_overrides(model_args.config_overrides, config_field_names(config)), **given})
            if config.model_type == "aot":
                config.validate()
            return config
        if model_type != "aot":
            sizes = AoTConfig.from_preset(preset or default_preset, **given)
            return baseline_config(model_type, task, sizes, model_args.config_overrides)
        fields = {**parse_overrides(model_args.config_overrides), **given}
        preset_fields = preset_kwargs(preset or default_preset)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):  # GPT-2's 50256 beyond a smaller vocabulary:
            if (preset_fields.get(name) or 0) >= fields.get("vocab_size", math.inf):  # the tokenizer's ids follow
                fields.setdefault(name, None)
        return AoTConfig.from_preset(preset or default_preset, **fields)
    except TrainingSetupError:
        raise
    except (ValueError, TypeError, StrictDataclassError) as error:  # the last: a typed config's field or check
        raise TrainingSetupError(str(error)) from error  # `errors.one_line` joins its lines for the command
    except OSError as error:
        raise TrainingSetupError(f"Could not load the model config from {model_name_or_path!r}: {error}") from error


def _check_model_type(found: str, allowed: tuple[str, ...], source: str) -> None:
    if found not in allowed:
        raise TrainingSetupError(
            f"{source} is a {found!r} model; this task trains {', '.join(allowed)} (never another model silently)."
        )


def check_fits_in_memory(model: PreTrainedModel) -> None:
    """Refuse, before any data is read, a model (built on the meta device) whose float32 weights alone exceed the
    machine's memory: the allocator, or a tokenizer trained to its vocabulary, would fail later and less clearly."""
    import psutil

    parameters, memory = model.num_parameters(), psutil.virtual_memory().total
    if 4 * parameters > memory:
        fields = VISION_SIZE_FIELDS if model.main_input_name == "pixel_values" else TEXT_SIZE_FIELDS
        sizes = ", ".join(f"{name} {getattr(model.config, name, None)}" for name in fields)
        raise TrainingSetupError(
            f"The model would have {parameters:,} parameters ({4 * parameters / 2**30:,.1f} GiB of float32 weights "
            f"alone), more than this machine's {memory / 2**30:.1f} GiB of memory ({sizes}): choose smaller sizes."
        )


def check_checkpoint_weights(folder: str | None, model: PreTrainedModel, skip_prefixes: tuple[str, ...] = ()) -> None:
    """Before fine-tuning from a local `folder`: its weights must be safetensors (never pickle), readable, and of the
    shapes of `model` (built from the run's config on the meta device). A truncated file or a wrong-shape tensor is
    named in one line, exit code 2, not a traceback from deep inside loading. A Hub id is left to `from_pretrained`."""
    if not folder or not Path(folder).is_dir():
        return

    def refuse(problem: str) -> TrainingSetupError:
        return TrainingSetupError(problem, argument="--model_name_or_path", value=folder)

    root = Path(folder)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in root.iterdir() if is_pickle_name(p.name))
        found = f"only pickle weights ({', '.join(pickles)}), which can run code when loaded" if pickles else ""
        raise refuse(f"holds {found or 'no weights'}; fine-tune from a folder with model.safetensors")
    state = model.state_dict(keep_vars=True)
    expected = {name: list(t.shape) for name, t in state.items()}
    aliases: dict[int, list[str]] = {}  # tied tensors (saved under one of their names)
    for name, tensor in state.items():
        aliases.setdefault(id(tensor), []).append(name)
    present: set[str] = set()
    for file in files:
        try:
            shapes, non_finite = read_weights(file, finite=True)
        except Exception as error:  # SafetensorError and OSError: both mean an unreadable file
            raise refuse(f"{file} cannot be read ({error}); it may be truncated: save or download it again") from None
        if non_finite:  # training would stop at step 1 with "diverged", blaming the learning rate
            shown = ", ".join(non_finite[:3]) + (f" and {len(non_finite) - 3} more" if len(non_finite) > 3 else "")
            raise refuse(f"{file.name}: {shown} already hold NaN or inf; fine-tune from weights that are finite")
        present.update(shapes)
        for name, shape in shapes.items():
            if name in expected and expected[name] != shape and not name.startswith(skip_prefixes):
                raise refuse(f"{file.name}: {name} has shape {shape} but its config.json gives {expected[name]}")
    missing = sorted(
        names[0]
        for names in aliases.values()
        if not present.intersection(names) and not all(name.startswith(skip_prefixes) for name in names)
    )
    if missing:  # from_pretrained would initialise them at random with only a load report
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise refuse(f"its weights lack {shown}, which would be initialised at random; save the complete model again")


def tensor_parallel_config(training_args: TrainingArguments, config: PreTrainedConfig) -> DistributedConfig | None:
    """transformers' `DistributedConfig` for a run whose `parallelism_config` (`{"tp_size": T, "dp_shard_size": S}`)
    asks for tensor parallelism, combined with FSDP2 over `dp_shard_size` ranks: `from_pretrained(...,
    distributed_config=...)` shards the model when it loads, and Trainer trains it as it is. None without
    `parallelism_config`. Refuses what cannot work, before any data is read."""
    sizes = training_args.parallelism_config
    if sizes is None:
        return None
    from transformers.distributed.configuration_utils import DistributedConfig

    def refuse(problem: str, allowed: str | None = None) -> TrainingSetupError:
        return TrainingSetupError(problem, argument="--parallelism_config", value=sizes, allowed=allowed)

    if isinstance(sizes, ParallelismConfig):
        sizes = {"tp_size": sizes.tp_size, "dp_shard_size": sizes.dp_shard_size}
    if not isinstance(sizes, dict) or set(sizes) - {"tp_size", "dp_shard_size"}:
        raise refuse("is not supported", allowed='{"tp_size": T, "dp_shard_size": S} (in the arguments file)')
    tp, shards = sizes.get("tp_size") or 1, sizes.get("dp_shard_size") or 1
    if tp < 2:
        raise refuse("needs tp_size >= 2 (FSDP alone: --fsdp with --fsdp_config)")
    if config.num_attention_heads % tp:
        raise refuse(f"tp_size must divide the {config.num_attention_heads} attention heads")
    if getattr(config, "tie_output_projection", False):
        raise refuse("cannot train a tied MSSA output projection (tie_output_projection=True) tensor-parallel")
    if training_args.fsdp:
        raise refuse("shards with FSDP2 over dp_shard_size itself; drop --fsdp and --fsdp_config")
    if training_args.resume_from_checkpoint or (
        training_args.save_strategy != "no" and not training_args.save_only_model
    ):
        raise refuse(
            "cannot checkpoint the optimizer of a model sharded as it loads (transformers), so cannot resume",
            allowed="with --save_only_model true (or --save_strategy no) and no --resume_from_checkpoint",
        )
    if tp * shards != training_args.world_size:
        raise refuse(f"tp_size x dp_shard_size must equal the {training_args.world_size} processes")
    training_args.parallelism_config = ParallelismOnAnyDevice(tp_size=tp, dp_shard_size=shards)
    # Each process reads its own batches: accelerate's batch dispatcher (its default for streamed data) does not
    # see its own "dp_shard" mesh dimension and would give every FSDP group the same batch.
    training_args.accelerator_config.dispatch_batches = False
    return DistributedConfig(tp_size=tp, fsdp_size=shards)


class ParallelismOnAnyDevice(ParallelismConfig):
    """accelerate's `ParallelismConfig`, accepted on CPU processes (gloo) too: accelerate refuses `MULTI_CPU` by its
    type, though the model sharded by transformers (DTensor, FSDP2) trains there; the CPU dry runs need it."""

    def _validate_accelerator(self, accelerator: Accelerator) -> None:
        if accelerator.distributed_type != DistributedType.MULTI_CPU:
            super()._validate_accelerator(accelerator)


def use_training_attention(model: PreTrainedModel, training_args: TrainingArguments) -> None:
    """Train MSSA models on CPU with the `"shared_projection"` backend (`aot_transformers.shared_projection`, which
    falls back to SDPA wherever it does not apply); the exported folder loads with the default backend (`"sdpa"`)."""
    config = model.config
    on_cpu = training_args.use_cpu or not torch.cuda.is_available()
    mssa = getattr(config, "attention_type", None) == "mssa"
    if on_cpu and mssa and config.knn_k is None and config._attn_implementation == "sdpa":
        model.set_attn_implementation("shared_projection")


__all__ = [
    "build_config",
    "check_checkpoint_weights",
    "config_field_names",
    "parse_overrides",
    "tensor_parallel_config",
    "use_training_attention",
]
