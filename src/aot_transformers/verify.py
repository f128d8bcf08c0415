"""Check, before trusting it, that a saved model folder runs only the code of the installed aot-transformers
(`aot verify DIR`).

Loading a folder with `trust_remote_code=True` imports every module an `auto_map` names — in `config.json`, in
`tokenizer_config.json` or any other `*config.json` — and whatever those modules import; loading checks nothing
itself (a check inside the folder's code could not stop a folder made to deceive). `verify_folder` runs outside the
folder's code and passes a folder only when loading it can run nothing but the installed package's own three code
files:

- every `auto_map` entry (of every `*config.json`, at any depth) names one of the three code files, present beside
  it: none names a module of another repository (`other/repo--module.Class`), a fourth module, or a missing one; and
  only `config.json` may have an `auto_map` (an AoT tokenizer or image processor never runs code of its own);
- every `.py` file (at any depth) is one of the three code files and byte for byte the installed package's copy:
  an edit is caught even when `code_sha256` was rewritten to match it, and a folder without `code_sha256` passes
  only when its code matches the installed package;
- no file is a pickle (`.bin`, `.pt`, `.pth`, `.pkl`, `.pickle`, `.ckpt`, any case, any depth): unpickling runs code.
  `training_args.bin` of a `Trainer` / TRL output folder is named for what it is: loading never reads it, `aot push`
  leaves it out, and deleting it makes the folder pass.

A folder saved by another release of aot-transformers fails until that release is installed: its code cannot be
told apart from an edit without the release's own files to compare with.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from ._io import is_pickle_name, load_json, looks_like_path, read_weights
from .errors import UsageError
from .modeling_aot import CODE_FILES


def code_file_hashes(folder: Path) -> dict[str, str | None]:
    """SHA-256 of each remote-code file in `folder` (missing files map to None)."""
    paths = {name: Path(folder) / name for name in CODE_FILES}
    return {name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None for name, p in paths.items()}


def pickle_note(name: str) -> str:
    """Why the pickle `name` fails the check, and for Trainer's own file what to do about it."""
    if Path(name).name == "training_args.bin":
        return (
            "Trainer's pickled TrainingArguments: loading the model never reads it and `aot push` leaves it out; "
            "delete it (or move it out of the folder) to pass"
        )
    return "can run arbitrary code when loaded"


@dataclass
class VerifyReport:
    """What `verify_folder` found. `ok` is True when loading the folder can run only the installed package's code and
    no file is a pickle.

    Attributes:
        folder: The folder checked.
        missing: Code files that are absent (the three files, or a module an `auto_map` names).
        edited: Code files that differ from the hashes recorded in `config.json` (`code_sha256`).
        unrecorded: `config.json` records no `code_sha256` (a failure only when the code differs from the installed
            package's).
        matches_installed: The three code files are byte for byte those of the installed aot-transformers.
        differs_from_installed: Code files (relative paths) that differ from the installed package's copy.
        unknown_code: `.py` files that are not one of the three code files.
        auto_map: `auto_map` entries that run code `verify` cannot vouch for, each described in words.
        pickle_files: Files (relative paths) with a pickle suffix.
        non_finite: Weights (`file: tensor`) that hold NaN or inf: the folder loads, but computes nothing usable.
    """

    folder: Path
    missing: list[str] = field(default_factory=list)
    edited: list[str] = field(default_factory=list)
    unrecorded: bool = False
    malformed_hashes: bool = False  # `code_sha256` is there but not a mapping
    matches_installed: bool = False
    differs_from_installed: list[str] = field(default_factory=list)
    unknown_code: list[str] = field(default_factory=list)
    auto_map: list[str] = field(default_factory=list)
    pickle_files: list[str] = field(default_factory=list)
    non_finite: list[str] = field(default_factory=list)
    adapter_base: str | None = None
    adapter_base_missing: bool = False  # the adapter names a local base model folder that does not exist

    @property
    def code_ok(self) -> bool:
        """Loading the folder runs only the installed package's code (pickles aside)."""
        found = (self.missing, self.edited, self.malformed_hashes, self.differs_from_installed, self.unknown_code)
        return (self.matches_installed or self.adapter_base is not None) and not any((*found, self.auto_map))

    @property
    def ok(self) -> bool:
        return self.code_ok and not self.pickle_files and not self.non_finite and not self.adapter_base_missing

    def problems(self) -> list[str]:
        """Every failed check, one short phrase each (empty when `ok`)."""
        out = [f"missing code file {name}" for name in self.missing]
        out += [f"{name} differs from the hash recorded in config.json" for name in self.edited]
        out += ["config.json's `code_sha256` is not a mapping of code file to hash"] * self.malformed_hashes
        out += [
            f"{name} differs from the installed aot-transformers {__version__}" for name in self.differs_from_installed
        ]
        out += [f"{name} is not an aot-transformers code file" for name in self.unknown_code]
        out += list(self.auto_map)
        out += [f"{name} is a pickle ({pickle_note(name)})" for name in self.pickle_files]
        out += [f"{name} holds NaN or inf" for name in self.non_finite]
        if self.adapter_base_missing:
            out.append(f"its base model {self.adapter_base} (adapter_config.json) does not exist: it cannot load")
        if not self.matches_installed and self.adapter_base is None and not out:
            out.append(f"the code files differ from the installed aot-transformers {__version__}")
        return out

    def lines(self) -> list[str]:
        """A human-readable account, one finding a line."""
        out = [f"{self.folder}:"]
        out += [f"  MISSING  {name}" for name in self.missing]
        out += [f"  EDITED   {name} (differs from the hash recorded in config.json)" for name in self.edited]
        out += [
            f"  DIFFERS  {name} (not the file of the installed aot-transformers {__version__})"
            for name in self.differs_from_installed
        ]
        out += [
            f"  UNKNOWN  {name} (not an aot-transformers code file; nothing to compare it with)"
            for name in self.unknown_code
        ]
        out += [f"  AUTO_MAP {entry}" for entry in self.auto_map]
        out += ["  BAD HASH config.json's `code_sha256` is not a mapping of code file to hash"] * self.malformed_hashes
        if self.unrecorded:
            note = "the code matches the installed package" if self.matches_installed else "cannot be checked"
            out.append(f"  NO HASH  config.json records no `code_sha256` ({note})")
        out += [f"  PICKLE   {name} ({pickle_note(name)})" for name in self.pickle_files]
        out += [
            f"  NAN/INF  {name} (non-finite weights: the model computes nothing usable)" for name in self.non_finite
        ]
        if self.adapter_base_missing:
            out.append(f"  NO BASE  {self.adapter_base} (the base model in adapter_config.json does not exist)")
        elif self.adapter_base is not None:
            base = self.adapter_base or "not named"
            out.append(f"  a LoRA adapter folder: it holds no code; verify its base model ({base}) too")
        elif self.matches_installed:
            out.append(f"  code files are those of aot-transformers {__version__} (installed)")
        elif not self.missing:
            out.append(
                f"  code files differ from the installed aot-transformers {__version__}: edited, or saved by another "
                "release (install that release and verify again)"
            )
        out.append("  OK" if self.ok else "  FAILED")
        return out


def read_config(path: Path, what: str) -> dict:
    """The JSON object in `path`, or a `UsageError` naming the file, what is wrong with it, and then `what`."""
    config = load_json(path, what)
    if not isinstance(config, dict):
        raise UsageError(f"{path} holds a JSON {type(config).__name__}, not an object: not a model config.")
    return config


def _auto_map_entries(auto_map: Any) -> list[tuple[str, Any]]:
    """(key, reference) pairs of an `auto_map` (a tokenizer maps a key to a [slow, fast] pair)."""
    if not isinstance(auto_map, dict):
        return [("auto_map", auto_map)]
    references = {key: value if isinstance(value, (list, tuple)) else [value] for key, value in auto_map.items()}
    return [(key, reference) for key, values in references.items() for reference in values if reference is not None]


def _check_auto_map(folder: Path, path: Path, report: VerifyReport) -> None:
    """Add to `report` every `auto_map` entry of the JSON file `path` that runs code other than the three files."""
    relative = path.relative_to(folder).as_posix()
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        report.auto_map.append(f"{relative} cannot be read as JSON: its auto_map (if any) cannot be checked")
        return
    if not isinstance(payload, dict) or "auto_map" not in payload:
        return
    for key, reference in _auto_map_entries(payload["auto_map"]):
        where = f"{relative}: {key} -> {reference!r}"
        if path.name != "config.json":
            report.auto_map.append(f"{where} runs code when the folder loads (an AoT folder maps only config.json)")
        elif not isinstance(reference, str) or "." not in reference:
            report.auto_map.append(f"{where} is not a `module.Class` reference")
        elif "--" in reference:
            report.auto_map.append(f"{where} runs code from another repository")
        else:
            module = reference.rsplit(".", 1)[0]
            file_name = module.replace(".", "/") + ".py"
            if file_name not in CODE_FILES:
                report.auto_map.append(f"{where} names {file_name}, not one of {', '.join(CODE_FILES)}")
            elif not (path.parent / file_name).is_file():
                missing = (path.parent / file_name).relative_to(folder).as_posix()
                if missing not in report.missing:
                    report.missing.append(missing)


def verify_folder(folder: str | Path) -> VerifyReport:
    """Check that loading `folder` with `trust_remote_code=True` runs only the installed package's code, and that it
    holds no pickle (see the module docstring for every check).

    A LoRA adapter folder (`adapter_config.json`, no `config.json`) must hold no code at all; its base model is a
    folder of its own to verify.

    Args:
        folder: A folder written by `save_pretrained` / `export_model` (or downloaded from the Hub).

    Raises:
        UsageError: `folder` does not exist or is not a folder, or its config.json is missing, unreadable, not valid
            JSON or not a JSON object (bad input: `aot verify` exits with 2, not with the 1 of a failed check).
    """
    folder = Path(folder)
    if not folder.exists():
        raise UsageError("no such folder", argument="folder", value=str(folder))
    if not folder.is_dir():
        raise UsageError("not a folder", argument="folder", value=str(folder))
    config_path = folder / "config.json"
    adapter_path = folder / "adapter_config.json"
    adapter = not config_path.is_file() and adapter_path.is_file()
    if adapter:  # a LoRA adapter folder (PEFT): no code of its own may be in it
        config_path = adapter_path
    if not config_path.is_file():
        raise UsageError(f"{config_path} not found: `aot verify` needs a saved model folder.")
    config = read_config(config_path, "`aot verify` needs the config.json of a saved model")

    report = VerifyReport(folder=folder)
    if adapter:
        report.adapter_base = str(config.get("base_model_name_or_path") or "")
        report.adapter_base_missing = looks_like_path(report.adapter_base) and not Path(report.adapter_base).exists()
    try:
        files = sorted(path for path in folder.rglob("*") if path.is_file())
    except OSError as error:
        raise UsageError(f"{folder} cannot be listed ({type(error).__name__}: {error}).") from None
    installed = code_file_hashes(Path(__file__).parent)  # what a trustworthy folder must hold
    for path in files:
        relative = path.relative_to(folder).as_posix()
        if is_pickle_name(path.name):
            report.pickle_files.append(relative)
        if path.name.endswith("config.json"):
            _check_auto_map(folder, path, report)
        if path.suffix == ".safetensors":  # its tensors that hold NaN or inf, as `relative: name`
            with suppress(Exception):  # SafetensorError, OSError: damaged, which loading names (not this check's job)
                report.non_finite += [f"{relative}: {name}" for name in read_weights(path, finite=True)[1]]
        if path.suffix.lower() == ".py":
            if path.name not in CODE_FILES or adapter:
                report.unknown_code.append(relative)
            elif path.parent != folder and hashlib.sha256(path.read_bytes()).hexdigest() != installed[path.name]:
                report.differs_from_installed.append(relative)  # a copy below the top level: must be exact too

    if adapter:
        return report
    actual = code_file_hashes(folder)
    report.missing = sorted({name for name in CODE_FILES if actual[name] is None} | set(report.missing))
    recorded = config.get("code_sha256")
    if not isinstance(recorded, dict):
        report.unrecorded = recorded is None
        report.malformed_hashes = recorded is not None
    else:
        report.edited = [n for n in CODE_FILES if actual[n] is not None and recorded.get(n) != actual[n]]
    report.matches_installed = actual == installed
    report.differs_from_installed = [
        n for n in CODE_FILES if actual[n] is not None and actual[n] != installed[n]
    ] + report.differs_from_installed
    return report


__all__ = ["VerifyReport", "verify_folder"]
