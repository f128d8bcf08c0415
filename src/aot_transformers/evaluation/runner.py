"""`evaluate_model`: load a causal LM and its data, run the requested tasks, return one report.

Everything that can be checked is checked before the first forward pass — task names, data sources and formats,
the tokenizer, the window settings — so a mistake costs seconds, not a partial run.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from huggingface_hub.errors import StrictDataclassError

from .. import __version__
from .._io import adapter_of, is_hub_id, load_pretrained, read_json
from .data import EvaluationError, EvaluationFailed
from .scoring import LanguageModelScorer
from .tasks import TASKS, TaskResult, load_source, parse_task_names, resolve_sources, run_task

# Result fields that tables and cards read as numbers.
_NUMERIC_FIELDS = "loss perplexity bits_per_byte acc acc_norm last_word_perplexity seconds tokens".split()


@dataclass
class EvaluationReport:
    """The results of one model on the suite, as written to `results.json`.

    Attributes:
        model: Folder or Hub id of the model (or a name given by the caller).
        model_info: Model type and parameter count.
        settings: Window, stride, batch size, precision, device and prefix token used.
        results: Task name → metrics, counts, data source and timing (see `TaskResult.to_dict`).
        versions: Library versions.
        date: UTC time of the run.
    """

    model: str  # the fields in the order `results.json` lists them
    model_info: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    date: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> EvaluationReport:
        """Inverse of `to_dict`, for a payload that `model_card.read_results_file` accepted (its results, their
        sources and its settings are mappings).

        Raises:
            EvaluationError: `payload` is not in the layout of `to_dict` (naming the first key that is not).
        """
        for key in ("model_info", "versions"):
            if not isinstance(payload.get(key, {}), Mapping):
                raise EvaluationError(f"not an `aot eval` results file: {key!r} is not a mapping.")
        for task, result in payload["results"].items():
            for metric in _NUMERIC_FIELDS:
                value = result.get(metric)
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                    raise EvaluationError(
                        f"not an `aot eval` results file: results[{task!r}][{metric!r}] is {value!r}, not a number."
                    )
        mappings = {key: dict(payload.get(key, {})) for key in ("settings", "model_info", "versions")}
        results = {str(k): dict(v) for k, v in payload["results"].items()}
        return cls(str(payload.get("model", "")), results=results, date=str(payload.get("date", "")), **mappings)


def remote_code_allowed(model: str | os.PathLike, trust_remote_code: bool = False) -> bool:
    """Whether `model` may be loaded with `trust_remote_code=True`.

    A local folder that loads with its own code (an `auto_map`) is trusted when `aot verify` passes it (its code is
    byte for byte the installed aot-transformers', which `load_model_and_tokenizer` then uses instead of the folder's
    copy); any other folder or Hub id runs its own code only when the caller says so (`trust_remote_code=True`,
    `--trust-remote-code`), as in transformers and lm-evaluation-harness.

    Raises:
        EvaluationError: A local folder with its own code that does not verify, and `trust_remote_code` is False.
    """
    if trust_remote_code:
        return True
    local = Path(os.fspath(model)).expanduser()
    if not local.is_dir():
        return False  # a Hub id: transformers refuses its code (clear error below) unless the caller trusts it
    # The top-level `*config.json` files whose `auto_map` imports code from the folder (an unreadable one is left to
    # the loader to report).
    configs = {path.name: read_json(path) for path in sorted(local.glob("*config.json"))}
    mapped = [name for name, config in configs.items() if isinstance(config, dict) and config.get("auto_map")]
    if not mapped:
        return False  # nothing of the folder's would run
    from ..verify import verify_folder

    report = verify_folder(local)
    if report.code_ok and not report.pickle_files:  # what it runs; its weights' values are the evaluation's to judge
        return True
    raise EvaluationError(
        f"{model} runs its own code when loaded (auto_map in {', '.join(mapped)}) and `aot verify` does not pass it "
        f"({'; '.join(report.problems())}). Run `aot verify {model}` for the details, or pass --trust-remote-code "
        "(trust_remote_code=True) if you trust the folder's code."
    )


def load_model_and_tokenizer(
    model: str | os.PathLike,
    tokenizer: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
) -> tuple[transformers.PreTrainedModel, transformers.PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer through the Auto classes, in eval mode.

    Args:
        model: A folder written by `save_pretrained` or a Hub id.
        tokenizer: Where the tokenizer is, when it is not saved with the model.
        device: Where to put the model.
        trust_remote_code: Run the model's (and tokenizer's) own code even when `aot verify` cannot vouch for it.
            Without it, only a local AoT folder that verifies runs its code (see `remote_code_allowed`).

    Raises:
        EvaluationError: The model folder does not exist, its code is not trusted, or no tokenizer can be found.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = os.fspath(model)
    local = Path(name).expanduser()
    if not local.exists() and not is_hub_id(name):
        raise EvaluationError(f"model folder not found: {local} (and it is not a Hub id like 'owner/name')")
    if adapter := adapter_of(name):
        raise EvaluationError(adapter)
    remote_code = remote_code_allowed(name, trust_remote_code)
    tokenizer_name = os.fspath(tokenizer) if tokenizer is not None else name
    try:
        # No remote code unless the caller asked for it: AoT tokenizers are plain `PreTrainedTokenizerFast`, and an
        # explicit False keeps transformers from prompting about the auto_map of an unregistered model type.
        tok = AutoTokenizer.from_pretrained(tokenizer_name, trust_remote_code=bool(trust_remote_code))
    except Exception as error:  # transformers raises OSError, ValueError or KeyError depending on what is missing
        raise EvaluationError(
            f"no tokenizer could be loaded from {tokenizer_name} ({type(error).__name__}: {str(error)[:200]}). Save "
            "the tokenizer next to the model with tokenizer.save_pretrained(MODEL) or pass --tokenizer PATH"
            + ("" if trust_remote_code else " (or --trust-remote-code if it needs its own code)")
            + "."
        ) from None
    try:
        try:
            # A verified AoT folder's code is the installed package's, byte for byte: the installed classes
            # (registered with the Auto classes) load it, so nothing is imported from the folder, which could change
            # between the check and the import. Its own code runs only when these cannot load it.
            lm, info = load_pretrained(
                AutoModelForCausalLM, name, trust_remote_code=bool(trust_remote_code), output_loading_info=True
            )
        except ValueError as error:
            if not remote_code or trust_remote_code or "trust_remote_code" not in str(error):
                raise
            lm, info = load_pretrained(AutoModelForCausalLM, name, trust_remote_code=True, output_loading_info=True)
    except (OSError, ValueError, StrictDataclassError) as error:  # missing files or Hub, a bad id, type or config
        if not remote_code and "trust_remote_code" in str(error):
            raise EvaluationError(
                f"{name} runs its own code when loaded, which is not run unasked: download it and check it with "
                "`aot verify FOLDER` (an AoT folder that verifies is trusted), or pass --trust-remote-code "
                "(trust_remote_code=True) if you trust it."
            ) from None
        raise EvaluationError(f"could not load a causal LM from {name}: {str(error)[:300]}") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing:  # initialised at random by from_pretrained: the numbers would describe a model nobody trained
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise EvaluationError(
            f"the weights of {name} lack {shown}, which loading would initialise at random; save the complete "
            "model again"
        )
    return lm.to(device).eval(), tok


def check_device(device: str | torch.device | None) -> torch.device | None:
    """`device` as a `torch.device`, or a clear error naming the argument when it is not one or is not available."""
    if device is None or isinstance(device, torch.device):
        return device
    try:
        parsed = torch.device(str(device))
    except (RuntimeError, TypeError, ValueError):
        raise EvaluationError(
            "not a device", argument="--device", value=device, allowed="cpu, cuda, cuda:N, mps, ..."
        ) from None
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available}
    if parsed.type in available and not available[parsed.type]():
        raise EvaluationError(
            f"{parsed.type.upper()} is not available on this machine", argument="--device", value=device
        )
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise EvaluationError(
            f"this machine has {torch.cuda.device_count()} CUDA device(s)", argument="--device", value=device
        )
    if parsed.type not in ("cpu", "cuda", "mps", "xpu"):
        raise EvaluationError("cannot evaluate there", argument="--device", value=device, allowed="cpu, cuda, mps")
    return parsed


def evaluate_model(
    model: str | os.PathLike | torch.nn.Module,
    tasks: str | Sequence[str] | None = None,
    *,
    tokenizer: str | os.PathLike | transformers.PreTrainedTokenizerBase | None = None,
    data_dir: str | os.PathLike | None = None,
    data: Mapping[str, str | os.PathLike] | None = None,
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    bf16: bool = False,
    device: str | torch.device | None = None,
    limit: int | None = None,
    progress: bool = False,
    trust_remote_code: bool = False,
) -> EvaluationReport:
    """Run the zero-shot suite (or some of its tasks) on a causal LM.

    Args:
        model: A model folder, a Hub id, or a loaded causal LM (then pass `tokenizer` too).
        tasks: Task names (a list or comma-separated string; None or "all" for the suite). See `TASKS`.
        tokenizer: A tokenizer object or where to load it from; by default the model's own.
        data_dir: Folder searched (recursively) for the published data files.
        data: Per-task or per-dataset source: a file path or `hub:REPO_ID[:CONFIG[:SPLIT]]`.
        max_length: Context window used; defaults to the model's. Longer texts use a sliding window.
        stride: New tokens per sliding window; defaults to `max_length` (as lm-evaluation-harness).
        batch_size: Windows per forward pass.
        bf16: bfloat16 autocast for the forward pass.
        device: Defaults to CUDA when available, else CPU (for a loaded model: where it already is).
        limit: Evaluate only the first `limit` documents / passages / questions of each dataset.
        progress: Show progress bars.
        trust_remote_code: Run the model's own code even when `aot verify` does not pass it (a local AoT folder
            that verifies is trusted without it; any other folder or Hub id with code of its own needs it).

    Returns:
        The report; write it with `write_results`.

    Raises:
        EvaluationError: Unknown task, bad device, missing or malformed data, no tokenizer, bad window settings,
            code that is not trusted — before any forward pass.
    """
    names = parse_task_names(tasks)
    device = check_device(device)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise EvaluationError(f"`limit` must be a positive int, got {limit!r}.")
    sources = resolve_sources(names, data_dir, data)
    datasets = {key: load_source(source)[:limit] for key, source in sources.items()}  # limit None: all

    tokenizer_given = tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike))
    if isinstance(model, torch.nn.Module):
        if tokenizer is None:
            raise EvaluationError("a loaded model needs its tokenizer: pass `tokenizer`.")
        if not tokenizer_given:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer), trust_remote_code=False)
        lm, tok = (model.eval() if device is None else model.eval().to(device)), tokenizer
        name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
    else:
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        lm, tok = load_model_and_tokenizer(model, None if tokenizer_given else tokenizer, device, trust_remote_code)
        tok = tokenizer if tokenizer_given else tok
        name = os.fspath(model)

    scorer = LanguageModelScorer(
        lm, tok, max_length=max_length, stride=stride, batch_size=batch_size, bf16=bf16, progress=progress
    )
    results: dict[str, TaskResult] = {}
    for task in names:
        key = TASKS[task].dataset
        try:
            results[task] = run_task(scorer, task, datasets[key], sources[key])
        except EvaluationError:
            raise
        except Exception as error:
            raise EvaluationFailed(task, list(results), error) from error

    return EvaluationReport(
        model=name,
        results={task: result.to_dict() for task, result in results.items()},
        settings={
            "max_length": scorer.max_length,
            "stride": scorer.stride,
            "batch_size": batch_size,
            "bf16": bf16,
            "device": str(next(lm.parameters()).device),
            "prefix_token_id": scorer.prefix_token_id,
            "limit": limit,
        },
        model_info={
            "model_type": getattr(getattr(lm, "config", None), "model_type", None),
            "class": type(lm).__name__,
            "num_parameters": sum(p.numel() for p in lm.parameters()),  # a tied weight is listed once
        },
        versions={
            "aot_transformers": __version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
