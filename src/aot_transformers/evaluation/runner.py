"""`evaluate_model`: load a causal LM and its data, run the requested tasks, return one report.

Everything that can be checked is checked before the first forward pass — task names, data sources and formats,
the tokenizer, the window settings — so a mistake costs seconds, not a partial run.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .data import EvaluationError, EvaluationFailed
from .scoring import LanguageModelScorer
from .tasks import TASKS, TaskResult, load_source, parse_task_names, resolve_sources, run_task

# A Hub repository id: "name" or "owner/name" (anything else is a local path).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


@dataclass
class EvaluationReport:
    """The results of one model on the suite, as written to `results.json`.

    Attributes:
        model: Folder or Hub id of the model (or a name given by the caller).
        results: Task name → metrics, counts, data source and timing (see `TaskResult.to_dict`).
        settings: Window, stride, batch size, precision, device and prefix token used.
        model_info: Model type and parameter count.
        versions: Library versions.
        date: UTC time of the run.
    """

    model: str
    results: dict[str, dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    model_info: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    date: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "model_info": self.model_info,
            "settings": self.settings,
            "results": self.results,
            "versions": self.versions,
            "date": self.date,
        }

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> EvaluationReport:
        """Inverse of `to_dict` (for reading a `results.json` back)."""
        if not isinstance(payload, Mapping) or not isinstance(payload.get("results"), Mapping):
            raise EvaluationError("not an `aot eval` results file: no 'results' mapping.")
        return cls(
            model=str(payload.get("model", "")),
            results={k: dict(v) for k, v in payload["results"].items()},
            settings=dict(payload.get("settings", {})),
            model_info=dict(payload.get("model_info", {})),
            versions=dict(payload.get("versions", {})),
            date=str(payload.get("date", "")),
        )


def load_model_and_tokenizer(
    model: str | os.PathLike, tokenizer: str | os.PathLike | None = None, device: str | torch.device = "cpu"
):
    """A causal LM and its tokenizer through the Auto classes (`trust_remote_code=True`), in eval mode.

    Args:
        model: A folder written by `save_pretrained` or a Hub id.
        tokenizer: Where the tokenizer is, when it is not saved with the model.
        device: Where to put the model.

    Raises:
        EvaluationError: The model folder does not exist, or no tokenizer can be found.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = os.fspath(model)
    local = Path(name).expanduser()
    if not local.exists() and not _HUB_ID.fullmatch(name):
        raise EvaluationError(f"model folder not found: {local} (and it is not a Hub id like 'owner/name')")
    tokenizer_name = os.fspath(tokenizer) if tokenizer is not None else name
    try:
        # Explicitly no remote code: AutoTokenizer reads config.json first, whose auto_map would otherwise make
        # transformers ask interactively (a 15 s prompt) for any folder of an unregistered model type.
        tok = AutoTokenizer.from_pretrained(tokenizer_name, trust_remote_code=False)
    except Exception as error:  # transformers raises OSError, ValueError or KeyError depending on what is missing
        raise EvaluationError(
            f"no tokenizer could be loaded from {tokenizer_name} ({type(error).__name__}: {str(error)[:200]}). Save "
            "the tokenizer next to the model with tokenizer.save_pretrained(MODEL) or pass --tokenizer PATH."
        ) from None
    try:
        lm = AutoModelForCausalLM.from_pretrained(name, trust_remote_code=True)
    except (OSError, ValueError) as error:  # missing files or Hub, an invalid repo id, an unknown model type
        raise EvaluationError(f"could not load a causal LM from {name}: {str(error)[:300]}") from None
    return lm.to(device).eval(), tok


def _versions() -> dict[str, str]:
    import transformers

    from .. import __version__

    return {"aot_transformers": __version__, "transformers": transformers.__version__, "torch": torch.__version__}


def evaluate_model(
    model: str | os.PathLike | torch.nn.Module,
    tasks: str | Sequence[str] | None = None,
    *,
    tokenizer=None,
    data_dir: str | os.PathLike | None = None,
    data: Mapping[str, str | os.PathLike] | None = None,
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    bf16: bool = False,
    device: str | torch.device | None = None,
    limit: int | None = None,
    progress: bool = False,
    model_name: str | None = None,
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
        model_name: Name recorded in the report (default: `model` when it is a path or id).

    Returns:
        The report; write it with `write_results`.

    Raises:
        EvaluationError: Unknown task, missing or malformed data, no tokenizer, bad window settings — before any
            forward pass.
    """
    names = parse_task_names(tasks)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise EvaluationError(f"`limit` must be a positive int, got {limit!r}.")
    sources = resolve_sources(names, data_dir, data)
    datasets = {key: load_source(source) for key, source in sources.items()}
    if limit is not None:
        datasets = {key: values[:limit] for key, values in datasets.items()}

    if isinstance(model, torch.nn.Module):
        if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
            if tokenizer is None:
                raise EvaluationError("a loaded model needs its tokenizer: pass `tokenizer`.")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(os.fspath(tokenizer), trust_remote_code=False)
        lm, tok = model.eval(), tokenizer
        name = model_name or getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
        if device is not None:
            lm = lm.to(device)
    else:
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
            lm, _ = load_model_and_tokenizer(model, None, device)
            tok = tokenizer
        else:
            lm, tok = load_model_and_tokenizer(model, tokenizer, device)
        name = model_name or os.fspath(model)

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
            "num_parameters": sum(p.numel() for p in {id(p): p for p in lm.parameters()}.values()),
        },
        versions=_versions(),
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


__all__ = ["EvaluationReport", "evaluate_model", "load_model_and_tokenizer"]
