"""Check that a saved model folder runs the code of a released aot-transformers version (`aot verify DIR`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from .modeling_aot import CODE_FILES, PICKLE_SUFFIXES, code_file_hashes


@dataclass
class VerifyReport:
    """What `verify_folder` found. `ok` is True when nothing is missing, edited or unsafe."""

    folder: Path
    missing: list[str] = field(default_factory=list)
    edited: list[str] = field(default_factory=list)
    unrecorded: bool = False
    matches_installed: bool = False
    pickle_files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.edited or self.unrecorded or self.pickle_files)

    def lines(self) -> list[str]:
        """A human-readable account, one finding a line."""
        out = [f"{self.folder}:"]
        out += [f"  MISSING  {name}" for name in self.missing]
        out += [f"  EDITED   {name} (differs from the hash recorded in config.json)" for name in self.edited]
        if self.unrecorded:
            out.append("  UNKNOWN  config.json records no `code_sha256`: saved by an older version or by hand")
        out += [f"  PICKLE   {name} (can run arbitrary code when loaded)" for name in self.pickle_files]
        if self.matches_installed:
            out.append(f"  code files are those of aot-transformers {__version__} (installed)")
        elif not self.missing:
            out.append(f"  code files differ from the installed aot-transformers {__version__}")
        out.append("  OK" if self.ok else "  FAILED")
        return out


def verify_folder(folder: str | Path) -> VerifyReport:
    """Compare a model folder's code files with the hashes in its config.json and with the installed package.

    Args:
        folder: A folder written by `save_pretrained` / `export_model` (or downloaded from the Hub).

    Raises:
        FileNotFoundError: `folder` or its config.json does not exist.
        ValueError: config.json is not valid JSON.
    """
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: `aot verify` needs a saved model folder.")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path} is not valid JSON (line {error.lineno}): {error.msg}.") from error
    report = VerifyReport(folder=folder)
    actual = code_file_hashes(folder)
    report.missing = [name for name in CODE_FILES if actual[name] is None]
    recorded = config.get("code_sha256")
    if not isinstance(recorded, dict):
        report.unrecorded = True
    else:
        report.edited = [n for n in CODE_FILES if actual[n] is not None and recorded.get(n) != actual[n]]
    report.matches_installed = actual == code_file_hashes(Path(__file__).parent)
    report.pickle_files = sorted(p.name for ext in PICKLE_SUFFIXES for p in folder.glob(f"*{ext}"))
    return report


__all__ = ["VerifyReport", "verify_folder"]
