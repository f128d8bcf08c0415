"""Export of AoT models as self-contained folders that load with `trust_remote_code=True` (`export_model`, atomic),
and publishing them to the Hugging Face Hub (`push_to_hub`; `upload_checkpoint` during training, `--hub_strategy`).
Model cards are rendered by `aot_transformers.model_card`. Every Hub call takes an `endpoint`: the Hub, a private
mirror, or a local stand-in server.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._io import EVAL_RESULTS_DIR, LOCK_FILE, PICKLE_SUFFIXES, STAGING_MARKER, atomic_folder, is_pickle_name
from .errors import RunError, UsageError
from .model_card import card_for_folder
from .modeling_aot import CODE_FILES

if TYPE_CHECKING:
    import torch
    from huggingface_hub import CommitInfo, HfApi, RepoUrl
    from peft import PeftModel
    from transformers import BaseImageProcessor, PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# What never leaves the machine in a model push: Trainer checkpoints and logs, caches, pickles (optimizer state and
# `training_args.bin` execute code when unpickled; the model itself is safetensors).
PUSH_IGNORE_PATTERNS = ["checkpoint-*", "checkpoint-*/*", "runs/*", "*/.*", "__pycache__/*", "*/__pycache__/*"]
# Pickles but `.bin`: another `.bin` than Trainer's own is refused by `check_push_contents`, not silently skipped.
PUSH_IGNORE_PATTERNS += ["*.pyc", "training_args.bin"] + [
    f"*{suffix}" for suffix in PICKLE_SUFFIXES if suffix != ".bin"
]


# Written by every export: marks the folder as ours and lists its files. Under `.cache/huggingface/`, which
# `hf upload` / `upload_folder` never publish; exports before it wrote `.aot_export.json`.
EXPORT_MANIFEST = ".cache/huggingface/aot_export.json"
LEGACY_EXPORT_MANIFEST = ".aot_export.json"


def check_replaceable(target: str | os.PathLike, protected: tuple[str | os.PathLike, ...] = ()) -> None:
    """Check that writing an export to `target` destroys nothing but an earlier export.

    `target` may be missing, an empty folder, or a folder an earlier `export_model` / LoRA export wrote (its
    `EXPORT_MANIFEST` lists every file in it, and the folder holds nothing else; the Hub's `.eval_results/` and the
    lock file may be added). A folder in `protected` (the run's `--output_dir`) or any parent of one is refused, and
    so is anything else: a folder of user files, a file.

    Raises:
        UsageError: `target` cannot be replaced without losing files (exit code 2); nothing is touched.
    """
    target = Path(target)

    def refused(message: str) -> UsageError:
        return UsageError(message, argument="final model folder", value=str(target))

    resolved = target.resolve()
    for folder in protected:
        folder = Path(folder).resolve()
        if resolved == folder or resolved in folder.parents:
            what = "the run's output folder" if resolved == folder else f"a parent of the run's output folder {folder}"
            raise refused(f"is {what}; exporting there would delete it")
    if not target.exists():
        return
    if not target.is_dir():
        raise refused("is a file, not a folder")
    present = {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file() or p.is_symlink()}
    if not present:
        return
    manifest = target / (EXPORT_MANIFEST if (target / EXPORT_MANIFEST).is_file() else LEGACY_EXPORT_MANIFEST)
    try:
        written = set(json.loads(manifest.read_text(encoding="utf-8"))["files"])
    except (OSError, ValueError, KeyError, TypeError):
        raise refused(
            f"holds files that no earlier aot export wrote (no readable {EXPORT_MANIFEST}); refusing to replace it. "
            "Choose an empty or new folder, or move the files away"
        ) from None
    extra = sorted(
        name
        for name in present - written - {EXPORT_MANIFEST, LEGACY_EXPORT_MANIFEST, LOCK_FILE}
        if not name.startswith(EVAL_RESULTS_DIR + "/")
    )
    if extra:
        shown = ", ".join(extra[:5]) + (", ..." if len(extra) > 5 else "")
        raise refused(
            f"is an earlier export with files added since ({shown}); refusing to replace it. Move them away or choose "
            "another folder"
        )


def check_finite_weights(model: torch.nn.Module, refuse: Callable[[str], Exception]) -> None:
    """Raise `refuse(names)` when floating-point tensors of `model` (parameters and buffers) hold a NaN or an
    infinity (`names`: the first three of them): a model that must not be exported as if it worked."""
    import torch

    bad = [name for name, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise refuse(", ".join(bad[:3]) + (", …" if len(bad) > 3 else ""))


def write_extra_files(folder: Path, files: dict[str, str | bytes | os.PathLike]) -> None:
    """Write `files` (name -> text, bytes, or the path of a file to copy) into `folder`. A name that would land
    outside `folder` (absolute, or with `..`) is refused with `UsageError` before anything is written."""
    root = folder.resolve()
    for name in files:
        destination = (folder / name).resolve()
        if Path(name).is_absolute() or root not in destination.parents:
            raise UsageError("lands outside the export folder", argument="extra_files name", value=str(name))
    for name, content in files.items():
        destination = folder / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            destination.write_bytes(content)
        elif isinstance(content, os.PathLike):
            shutil.copyfile(content, destination)
        else:
            destination.write_text(content, encoding="utf-8")


def export_model(
    model: PreTrainedModel,
    save_directory: str | os.PathLike,
    tokenizer: PreTrainedTokenizerBase | None = None,
    image_processor: BaseImageProcessor | None = None,
    overwrite: bool = True,
    model_card: Any = None,
    extra_files: dict[str, str | bytes | os.PathLike] | None = None,
    protected: tuple[str | os.PathLike, ...] = (),
) -> Path:
    """Write `model` (safetensors, config with a complete `auto_map`, code files) and its tokenizer or image
    processor to `save_directory`, atomically (`_io.atomic_folder`: an interrupted export leaves no half-written
    folder, and an existing folder survives a failed export).

    Args:
        model: Any AoT model (its code files go with it), or a transformers baseline trained by `aot train`.
        save_directory: Destination folder.
        tokenizer: Saved with the model when given.
        image_processor: Saved with the model when given.
        overwrite: Replace an existing folder, if it is an earlier export (`check_replaceable`); otherwise raise
            `FileExistsError`.
        model_card: A `huggingface_hub.ModelCard` (or its text), written as `README.md`.
        extra_files: More files for the folder: name -> text, bytes, or the path of a file to copy.
        protected: Folders that must survive (a training run's output folder): `save_directory` may be neither one
            of them nor a parent of one.

    Raises:
        UsageError: `save_directory` holds files an earlier export did not write, or is protected.

    Returns:
        The destination path.
    """
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"`model` must be a transformers model, got {type(model).__name__}.")
    files = dict(extra_files or {})
    if model_card is not None:
        files["README.md"] = str(model_card)
    return write_export(model, save_directory, (tokenizer, image_processor), files, overwrite, protected)


def write_export(
    model: PreTrainedModel | PeftModel,
    save_directory: str | os.PathLike,
    processors: Sequence[PreTrainedTokenizerBase | BaseImageProcessor | None],
    files: dict,
    overwrite: bool = True,
    protected: tuple[str | os.PathLike, ...] = (),
) -> Path:
    """Write `model` (safetensors), the `processors` that are not None and `files` (see `write_extra_files`) into
    `save_directory` atomically, with the `EXPORT_MANIFEST` listing them; with `overwrite`, only over an earlier
    export (`check_replaceable`). Serves `export_model` and LoRA adapters."""
    if overwrite:
        check_replaceable(save_directory, protected)
    with atomic_folder(save_directory, overwrite) as staging:
        model.save_pretrained(staging)
        for processor in processors:
            if processor is not None:
                processor.save_pretrained(staging)
        write_extra_files(staging, files)
        written = [p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file()]
        manifest = {"files": sorted(name for name in written if Path(name).name != STAGING_MARKER)}
        (staging / EXPORT_MANIFEST).parent.mkdir(parents=True, exist_ok=True)
        (staging / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return Path(save_directory)


class HubPushError(RunError):
    """A push to the Hub failed; the local folder is unchanged (exit code 1)."""


@dataclass
class PushResult:
    """What a successful push created."""

    repo_url: str
    commit_url: str
    commit_oid: str | None
    files: list[str]


def check_export_folder(folder: str | os.PathLike) -> Path:
    """Check that `folder` is a complete AoT export (config with `auto_map`, safetensors weights, code files) or a
    LoRA adapter folder (`adapter_config.json` + safetensors adapter weights).

    Raises:
        UsageError: It is neither (bad input: `aot push` exits with 2).
    """
    from .verify import read_config

    folder = Path(folder)
    if not folder.exists():
        raise UsageError("no such folder", argument="folder", value=str(folder))
    if not folder.is_dir():
        raise UsageError("not a folder", argument="folder", value=str(folder))
    if (folder / "adapter_config.json").is_file():
        read_config(folder / "adapter_config.json", "`aot push` needs a saved adapter")
        if not any(folder.glob("adapter_model*.safetensors")):
            raise UsageError(f"{folder} is a LoRA adapter folder without adapter_model.safetensors.")
        return folder
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise UsageError(f"{folder} has no config.json: it is not a saved model folder.")
    config = read_config(config_file, "`aot push` needs the config.json of a saved model")
    missing = [name for name in CODE_FILES if not (folder / name).is_file()]
    if "auto_map" not in config or missing:
        raise UsageError(
            f"{folder} does not load with trust_remote_code=True: "
            + (f"missing code files {missing}" if missing else "config.json has no auto_map")
            + ". Save it with aot_transformers.export_model."
        )
    if not any(folder.glob("*.safetensors")):
        raise UsageError(f"{folder} has no .safetensors weights.")
    return folder


def _walk(folder: Path) -> tuple[list[str], list[str]]:
    """Every file below `folder` as the upload sees it (relative POSIX paths), and the symbolic links whose target
    lies outside `folder` (or is missing): their content is not the folder's to publish."""
    root = folder.resolve()
    files, escaping = [], []
    for directory, subfolders, names in os.walk(folder, followlinks=False):
        for name in sorted(subfolders) + sorted(names):
            path = Path(directory) / name
            relative = path.relative_to(folder).as_posix()
            if path.is_symlink():
                target = path.resolve()
                # out of the folder, to nothing, or to a folder (walked by some uploads and not others): refused
                if not target.exists() or target.is_dir() or not target.is_relative_to(root):
                    escaping.append(relative)
                    continue
            if name in names:
                files.append(relative)
    return files, escaping


def check_push_contents(folder: Path, names: list[str], escaping: list[str]) -> None:
    """Refuse (`UsageError`, one line naming every offending file) a push of `folder` that would publish what its
    owner did not mean to: links leaving the folder (`escaping`), pickles among the files to upload (`names`), or
    code that `aot verify` does not pass."""
    from .verify import pickle_note, verify_folder

    problems = [f"{name} is a link to a folder or out of {folder}" for name in escaping]
    problems += [f"{name} is a pickle ({pickle_note(name)})" for name in names if is_pickle_name(name)]
    # The code checks of `aot verify` (a LoRA adapter folder must hold no code); its pickle check is the one above,
    # on the files that would be uploaded: Trainer state that stays local is no reason to refuse.
    problems += [problem for problem in verify_folder(folder).problems() if "is a pickle" not in problem]
    if problems:
        raise UsageError(
            f"refusing to push {folder}: {'; '.join(problems)}. Nothing was uploaded; remove or replace these files "
            "(re-export the model with aot_transformers.export_model) and push again."
        )


def push_to_hub(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    token: str | bool | None = None,
    endpoint: str | None = None,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    create_pr: bool = False,
) -> PushResult:
    """Upload an exported model folder to a Hub repository (created if needed) with `HfApi.upload_folder`.

    The folder is read, never written: Trainer checkpoints and `training_args.bin` stay local (with a logged notice),
    and when it has no `README.md`, a model card rendered from its config is uploaded from memory in a second commit.

    Args:
        folder: A folder written by `export_model` or by `aot train`.
        repo_id: `namespace/name` of the model repository.
        token: Hub token (default: the logged-in token or `HF_TOKEN`).
        endpoint: Hub URL (default: `HF_ENDPOINT` or https://huggingface.co).
        private: Create the repository as private.
        revision: Branch to commit to (default: the main branch; created from it when missing).
        commit_message: Commit message.
        create_pr: Open a pull request instead of committing to the branch.

    Returns:
        The repository URL, commit URL and commit id, and the uploaded files.

    Raises:
        UsageError: Bad input (not an export, a bad repo id, a link out of the folder, a pickle that would be uploaded
            (`*.bin`, `*.pt`, … in any case), or code that `aot verify` does not pass); nothing uploaded.
        HubPushError: The push itself failed (network, authentication, a card the Hub refuses, server error); the
            local folder is unchanged.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.utils import HFValidationError, filter_repo_objects, validate_repo_id

    folder = check_export_folder(folder)
    if endpoint is not None and not (isinstance(endpoint, str) and endpoint.startswith(("http://", "https://"))):
        raise UsageError("not a URL", argument="--endpoint", value=endpoint, allowed="http://… or https://…")
    try:
        validate_repo_id(repo_id)
    except (HFValidationError, TypeError, ValueError) as error:
        raise UsageError(f"not a Hub repository id: {error}", argument="--repo-id", value=repo_id) from None
    # The folder's hidden top-level entries stay local, except the Hub's own `.eval_results/`.
    hidden = [path.name for path in folder.iterdir() if path.name.startswith(".") and path.name != EVAL_RESULTS_DIR]
    ignore = PUSH_IGNORE_PATTERNS + [pattern for name in hidden for pattern in (name, f"{name}/*")]
    try:
        relative, escaping = _walk(folder)
    except OSError as error:
        raise UsageError(f"{folder} cannot be read ({type(error).__name__}: {error}).") from None
    names = list(filter_repo_objects(relative, ignore_patterns=ignore))
    check_push_contents(folder, names, list(filter_repo_objects(escaping, ignore_patterns=ignore)))
    if "training_args.bin" in relative:  # a Trainer / TRL output folder
        logger.warning(
            "Leaving training_args.bin out of the push: it is Trainer's pickled TrainingArguments, which loading the "
            "model never reads (you may delete it)."
        )
    card = None
    if not (folder / "README.md").is_file() and not (folder / "adapter_config.json").is_file():
        try:
            card = str(card_for_folder(folder, repo_id))
        except (OSError, ValueError, TypeError, KeyError) as error:  # a config or results.json it cannot read
            raise UsageError(f"no model card can be made for {folder}: {type(error).__name__}: {error}") from None
        names.append("README.md")
    api = HfApi(endpoint=endpoint, token=token)
    target = f"{repo_id} on {api.endpoint}"
    message = commit_message or f"Upload {folder.name} with aot-transformers"
    try:
        upload = {"commit_message": message, "create_pr": create_pr, "ignore_patterns": ignore}
        repo_url, info = _upload_folder(api, repo_id, private, revision, folder, **upload)
        if card is not None:
            info = api.upload_file(
                path_or_fileobj=card.encode(),
                path_in_repo="README.md",
                repo_id=repo_id,
                revision=revision,
                create_pr=create_pr,
                commit_message="Add the model card",
            )
    except Exception as error:  # every failure is reported the same way: what, where, and that nothing changed
        raise HubPushError(
            f"Push of {folder} to {target} failed: {type(error).__name__}: {error}. The local folder is "
            "unchanged; fix the cause (token, network, repo id, card metadata) and run the push again."
        ) from error
    return PushResult(repo_url=str(repo_url), commit_url=info.commit_url, commit_oid=info.oid, files=names)


def _upload_folder(
    api: HfApi, repo_id: str, private: bool | None, revision: str | None, folder: str | os.PathLike, **upload: Any
) -> tuple[RepoUrl, CommitInfo]:
    """Create the repo (and branch) if missing, then upload a folder; returns `(repo url, commit info)`."""
    repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    if revision:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    return repo_url, api.upload_folder(repo_id=repo_id, folder_path=folder, revision=revision, **upload)


def upload_checkpoint(
    folder: str | os.PathLike, repo_id: str, *, token: str | bool | None = None, endpoint: str | None = None, **upload
) -> CommitInfo:
    """Push a Trainer checkpoint folder during training (`--hub_strategy every_save|checkpoint|all_checkpoints`):
    `private` and `revision` as for `push_to_hub`, the rest of `upload` to `HfApi.upload_folder` (`path_in_repo`,
    `ignore_patterns`, `delete_patterns`, `commit_message`). Raises `HubPushError` (the checkpoint is untouched)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint, token=token)
    private, revision = upload.pop("private", None), upload.pop("revision", None)
    try:
        return _upload_folder(api, repo_id, private, revision, folder, **upload)[1]
    except Exception as error:
        raise HubPushError(
            f"Push of checkpoint {folder} to {repo_id} on {api.endpoint} failed: {type(error).__name__}: {error}. "
            "The checkpoint on disk is unchanged; fix the cause and resume with --resume_from_checkpoint latest."
        ) from error


__all__ = [
    "HubPushError",
    "PushResult",
    "check_export_folder",
    "export_model",
    "check_finite_weights",
    "push_to_hub",
    "upload_checkpoint",
]
