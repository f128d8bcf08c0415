"""Export of AoT models as self-contained folders that load with `trust_remote_code=True`."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .modeling_aot import AoTPreTrainedModel


def export_model(
    model: AoTPreTrainedModel,
    save_directory: str | os.PathLike,
    tokenizer=None,
    image_processor=None,
    overwrite: bool = True,
) -> Path:
    """Write `model` (safetensors, config with a complete `auto_map`, code files) and its tokenizer or image
    processor to `save_directory`, atomically.

    Everything is written to a temporary folder beside the target and renamed into place only once complete, so
    an interrupted export never leaves a half-written folder, and an existing folder survives a failed export.

    Args:
        model: Any AoT model.
        save_directory: Destination folder.
        tokenizer: Saved with the model when given.
        image_processor: Saved with the model when given.
        overwrite: Replace an existing folder; otherwise raise `FileExistsError`.

    Returns:
        The destination path.
    """
    if not isinstance(model, AoTPreTrainedModel):
        raise TypeError(f"`model` must be an AoT model, got {type(model).__name__}.")
    target = Path(save_directory)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True to replace it.")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        for extra in (tokenizer, image_processor):
            if extra is not None:
                extra.save_pretrained(staging)
        backup = None
        if target.exists():
            backup = target.with_name(f".{target.name}.old")
            shutil.rmtree(backup, ignore_errors=True)
            target.rename(backup)
        staging.rename(target)
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


__all__ = ["export_model"]
