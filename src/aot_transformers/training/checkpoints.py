"""Trainer checkpoints: which are complete, the newest one to resume from, and `--resume_from_checkpoint`."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from .._io import read_json
from .arguments import TrainingSetupError
from .run_state import RUN_RECORD

logger = logging.getLogger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
RESUME_LATEST = ("latest", "last", "true", "True", "auto")


def is_complete_checkpoint(folder: Path) -> bool:
    """Trainer writes `trainer_state.json` last: a checkpoint without it, or with an empty or truncated one (a power
    loss before the file reached the disk), was interrupted while being written; so was one without its readable
    `RUN_RECORD` (written before `trainer_state.json`). The weights are one `*.safetensors` file (or shards) or,
    under FSDP with a sharded state dict, a `pytorch_model_fsdp_0` folder of distributed-checkpoint shards."""
    for name in ("trainer_state.json", RUN_RECORD):
        if not isinstance(read_json(Path(folder) / name), dict):
            return False
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model_fsdp_*"))


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
    if resume_from_checkpoint in RESUME_LATEST:
        found = last_complete_checkpoint(output_dir) if output_dir else None
        if found is None and resume_from_checkpoint != "auto":
            raise TrainingSetupError(
                f"no checkpoint in {output_dir} (use `auto` to start fresh when there is none)",
                argument="--resume_from_checkpoint",
                value=resume_from_checkpoint,
            )
        return found
    path = Path(resume_from_checkpoint)
    if not path.is_dir():
        raise TrainingSetupError("no such folder", argument="--resume_from_checkpoint", value=resume_from_checkpoint)
    if not is_complete_checkpoint(path):
        raise TrainingSetupError(
            f"--resume_from_checkpoint {resume_from_checkpoint} is incomplete (no readable trainer_state.json or "
            f"{RUN_RECORD}: it was interrupted while being written); use an earlier checkpoint or `latest`."
        )
    return str(path)


__all__ = ["is_complete_checkpoint", "last_complete_checkpoint", "resolve_resume"]
