"""Where the training benchmarks keep their numbers: run folders under `runs/` (not versioned), summaries in
`benchmarks/training/results/` (versioned, quoted in its README.md)."""

from __future__ import annotations

from pathlib import Path

from .._common import write_results

RESULTS = Path(__file__).resolve().parent / "results"


def write_summary(summary: dict, run_file: Path, name: str, command: str | None = None) -> Path:
    """Write `summary` beside the run and as `results/<name>`, each with its provenance (`write_results`: the
    command, default this process's, the git revision, the library versions and the host)."""
    write_results(run_file, summary, command)
    return write_results(RESULTS / name, summary, command)
