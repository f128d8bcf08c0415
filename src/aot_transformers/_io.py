"""The plumbing every wing shares: atomic writes, the folder lock, the fields of command-line options, what names a
Hub repository, a pickle or a code file, and the provenance a results file records. Defined once here; `training/`,
`evaluation/`, `experiments/` and `hub.py` import it and nothing of each other (and benchmarks/ its provenance).

Atomic means a kill or a power loss leaves the old file (folder) or the new one, never a mix: write beside the target,
fsync, rename over it, fsync the folder. Temporary names carry their writer's host and pid, so whatever a killed writer
(SIGKILL runs no cleanup) left behind is removed by the next write.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UsageError

if TYPE_CHECKING:
    from filelock import BaseFileLock
    from transformers import PreTrainedModel
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")  # files that may hold a pickle, in any case
EVAL_RESULTS_DIR = ".eval_results"  # the Hub's folder of evaluation results, the one hidden folder a push uploads
LOCK_FILE = ".aot.lock"
STAGING_MARKER = ".aot_staging"  # inside a staging folder while it is written: the pid and host writing it
# The keys a results file starts with (`provenance`); `provenance_note` says what an older file does not record.
PROVENANCE_KEYS = ("command", "git_revision", "versions", "host", "date", "provenance_note")
LIBRARIES = ("torch", "transformers", "accelerate", "datasets", "tokenizers", "aot-transformers")


def arg(default: Any, help: str, choices: Sequence[str] | None = None) -> Any:
    """A dataclass field with its help text (and allowed values) for `HfArgumentParser`; lists are copied."""
    metadata = {"help": help} if choices is None else {"help": help, "choices": list(choices)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def load_pretrained(
    model_cls: type[PreTrainedModel | _BaseAutoModelClass], source: str | os.PathLike, *args: Any, **kwargs: Any
) -> PreTrainedModel | tuple[PreTrainedModel, dict[str, Any]]:
    """`model_cls.from_pretrained(source, ...)` as every `aot` command loads a model: transformers' own loading
    (safetensors first, pickles only through `weights_only`), with damaged weights named in one error."""
    from safetensors import SafetensorError

    try:
        return model_cls.from_pretrained(source, *args, **kwargs)
    except SafetensorError as error:
        message = f"corrupted or truncated ({error}); download or save them again"
        raise OSError(f"The safetensors weights of {source} are {message}.") from error
    except RuntimeError as error:  # transformers' "set `ignore_mismatched_sizes`", which would load random weights
        if "ignore_mismatched_sizes" not in str(error) or not Path(source).is_dir():
            raise
        shown = ", ".join(_mismatched_shapes(model_cls, Path(source), kwargs)[:3])
        raise OSError(f"The weights of {source} do not have the shapes its config.json gives: {shown}.") from None


def _mismatched_shapes(
    model_cls: type[PreTrainedModel | _BaseAutoModelClass], folder: Path, kwargs: dict[str, Any]
) -> list[str]:
    """`name [saved shape] vs config [shape]` for every tensor of the safetensors in `folder` whose shape is not the
    one the model built from its config (on the meta device) has."""
    import torch
    from transformers import AutoConfig

    config = kwargs.get("config") or AutoConfig.from_pretrained(
        folder, trust_remote_code=kwargs.get("trust_remote_code")
    )
    with torch.device("meta"):
        model = model_cls.from_config(config) if hasattr(model_cls, "from_config") else model_cls(config)
    expected = {name: list(tensor.shape) for name, tensor in model.state_dict().items()}
    saved = {
        name: shape for file in sorted(folder.glob("*.safetensors")) for name, shape in read_weights(file)[0].items()
    }
    return [
        f"{name} {shape} vs config {expected[name]}"
        for name, shape in saved.items()
        if expected.get(name, shape) != shape
    ]


def read_weights(file: str | os.PathLike, finite: bool = False) -> tuple[dict[str, list[int]], list[str]]:
    """The shape of every tensor in the safetensors `file` (read from its header) and, with `finite`, the names of the
    tensors that hold NaN or inf (every tensor read). Raises what safetensors raises for a damaged file."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as weights:
        shapes = {name: list(weights.get_slice(name).get_shape()) for name in weights.keys()}
        non_finite = [name for name in shapes if finite and not weights.get_tensor(name).isfinite().all()]
    return shapes, non_finite


def adapter_of(folder: str | os.PathLike) -> str | None:
    """For a LoRA adapter folder (`adapter_config.json`, no `config.json`), one line saying what it is, which base it
    names and how to load it; None for any other path. The commands that take a model folder refuse it with this."""
    folder = Path(folder)
    if not (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file():
        return None
    base = (read_json(folder / "adapter_config.json") or {}).get("base_model_name_or_path") or "an unnamed base"
    return (
        f"{folder} is a LoRA adapter of {base} (adapter_config.json), not a whole model: load it on its base with "
        f"PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({str(base)!r}, trust_remote_code=True), "
        f"{str(folder)!r}), or train with --merge_lora to write a model folder with the adapter merged in"
    )


def git_revision(folder: str | os.PathLike | None = None) -> str | None:
    """The commit checked out at `folder` (default: this package's source), with `+dirty` when tracked files differ
    from it; None when `folder` holds no file a git checkout tracks (an installed package) or git is missing."""

    def git(*args: str) -> str:
        try:
            found = subprocess.run(["git", *args], cwd=folder or Path(__file__).parent, capture_output=True, text=True)
        except OSError:
            return ""
        return found.stdout.strip() if found.returncode == 0 else ""

    if not git("ls-files", "--", ".") or not (revision := git("rev-parse", "HEAD")):
        return None
    return revision + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def library_versions() -> dict[str, str]:
    """Python's and the libraries' (`LIBRARIES`) versions, as installed."""
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "missing"
    return found


def provenance(command: str, folder: str | os.PathLike | None = None) -> dict[str, Any]:
    """What a results file records about how it was made (`PROVENANCE_KEYS`): the `command` that regenerates it,
    the git revision of `folder` (`git_revision`), the library versions, the host (CPU, the cores this process may
    use, torch's threads, the platform, the load averages) and the date (UTC)."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    host = {"cpu": platform.processor() or platform.machine(), "cpus": cores, "threads": torch.get_num_threads()}
    host |= {"platform": platform.platform(), "load_average": [round(load, 2) for load in os.getloadavg()]}
    return {
        "command": command,
        "git_revision": git_revision(folder),
        "versions": library_versions(),
        "host": host,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def is_pickle_name(name: str) -> bool:
    """Whether a file name is a pickle format (loading one can run arbitrary code)."""
    return name.lower().endswith(PICKLE_SUFFIXES)


def looks_like_path(name: str) -> bool:
    """Whether `name` is meant as a local path rather than a Hub id (`namespace/name`)."""
    return name.startswith((".", "/", "~")) or os.sep in name and name.count("/") != 1 or name.endswith(os.sep)


def is_hub_id(name: str | None) -> bool:
    """Whether `name` is a Hub repository id (`name` or `namespace/name`, as `huggingface_hub` validates it) and not
    a local path."""
    if not name or looks_like_path(name) or Path(name).exists():
        return False
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def writable_folder(path: str | os.PathLike, argument: str, error: type[UsageError] = UsageError) -> Path:
    """Create the folder `path` if needed; refuse a file, or a folder this process cannot write (`error` naming
    `argument` and the path)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise error("is a file, not a folder", argument=argument, value=str(path))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as problem:
        raise error(f"cannot be created ({problem.strerror or problem})", argument=argument, value=str(path)) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise error("is not writable", argument=argument, value=str(path))
    return folder


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def fsync_directory(folder: Path) -> None:
    with suppress(OSError):  # a platform without directory handles (Windows): the rename itself is still atomic
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def temporary_prefix(path: Path) -> str:
    """The name prefix of this process's temporary files and folders for `path`: `.<name>.<host>-<pid>.`."""
    return f".{path.name}.{socket.gethostname()}-{os.getpid()}."


def remove_stale_temporaries(path: str | os.PathLike) -> None:
    """Remove the temporary files and folders of `path` (`.<name>.<host>-<pid>.*` beside it) that a writer killed
    mid-write left behind: those naming this host and a process that no longer runs."""
    path = Path(path)
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.(?P<host>.+)-(?P<pid>\d+)\.[^.]+$")
    host = socket.gethostname()
    for candidate in path.parent.glob(f".{glob.escape(path.name)}.*") if path.parent.is_dir() else []:
        match = pattern.match(candidate.name)
        if match and match["host"] == host and not process_alive(int(match["pid"])):
            shutil.rmtree(candidate, ignore_errors=True) if candidate.is_dir() else candidate.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically (see the module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    handle, temporary = tempfile.mkstemp(prefix=temporary_prefix(path), dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_json(path: str | os.PathLike, data: Any, indent: int = 1, sort_keys: bool = True) -> None:
    """Write `data` as JSON (with a final newline) to `path` atomically."""
    atomic_write_text(path, json.dumps(data, indent=indent, sort_keys=sort_keys) + "\n")


def load_json(path: str | os.PathLike, what: str = "") -> Any:
    """The JSON in `path`, or a `UsageError` naming the file (and the line) and then `what`."""
    what = f"; {what}" if what else ""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UsageError(f"{path}, line {error.lineno}: not JSON ({error.msg}){what}.") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{path} cannot be read ({type(error).__name__}: {error}){what}.") from None


def read_json(path: str | os.PathLike) -> Any | None:
    """The JSON in `path`, or None when it is missing, empty, truncated or not JSON (treated as absent)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


@contextmanager
def atomic_folder(target: str | os.PathLike, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary folder beside `target`; when the block ends without error, it replaces `target` in one
    rename (an existing folder is kept until then, and survives any failure); on error it is removed.

    Staging folders that an earlier, killed writer left beside `target` are removed first (those whose
    `STAGING_MARKER` names a process of this host that no longer runs)."""
    target = Path(target)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists; pass overwrite=True to replace it.")
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        (staging / STAGING_MARKER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        yield staging
        (staging / STAGING_MARKER).unlink()
        for path in staging.rglob("*"):
            if path.is_file():
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        fsync_directory(staging)
        backup = None
        if target.exists():
            backup = target.with_name(f".{target.name}.old")
            shutil.rmtree(backup, ignore_errors=True)
            target.rename(backup)
        staging.rename(target)
        fsync_directory(target.parent)
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def remove_stale_staging(target: str | os.PathLike) -> None:
    """Remove the staging folders of `target` (`.<name>.*` beside it) left by a writer that was killed: those whose
    marker names a dead process of this host, and the `.<name>.old` backup of a rename interrupted after the new
    folder was in place."""
    target = Path(target)
    for path in target.parent.glob(f".{glob.escape(target.name)}.*") if target.parent.is_dir() else []:
        if not path.is_dir():
            continue
        stale = path.name == f".{target.name}.old" and target.is_dir()
        marker = path / STAGING_MARKER
        if marker.is_file():
            try:
                owner = json.loads(marker.read_text())
                stale = owner.get("host") == socket.gethostname() and not process_alive(int(owner["pid"]))
            except (OSError, ValueError, KeyError, TypeError):
                stale = False  # unreadable: possibly being written right now; left alone
        if stale:
            shutil.rmtree(path, ignore_errors=True)


class FolderLockedError(RuntimeError):
    """Another process holds the lock; `path` is the lock file."""

    def __init__(self, path: Path, cause: OSError | None = None):
        self.path, self.cause = path, cause
        what = f"cannot lock {path} ({type(cause).__name__}: {cause})" if cause else f"another aot run holds {path}"
        super().__init__(what)


def lock_folder(lock_path: str | os.PathLike) -> BaseFileLock:
    """Take the exclusive `filelock.FileLock` at `lock_path` without waiting; returns the held lock (released when
    dropped). Raises `FolderLockedError` when another process holds it or the lock file cannot be made."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise FolderLockedError(Path(lock_path)) from None
    except OSError as error:
        raise FolderLockedError(Path(lock_path), error) from None
    return lock
