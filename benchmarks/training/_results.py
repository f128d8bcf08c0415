"""Where the training benchmarks keep their numbers: run folders under `runs/` (not versioned), summaries in
`benchmarks/training/results/` (versioned, quoted in README.md)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_summary(summary: dict, run_file: Path, name: str) -> Path:
    """Write `summary` beside the run and, with the machine and date, as `results/<name>`."""
    import torch

    run_file.parent.mkdir(parents=True, exist_ok=True)
    run_file.write_text(json.dumps(summary, indent=2))
    record = {
        **summary,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores (shared), torch {torch.__version__}",
    }
    RESULTS.mkdir(exist_ok=True)
    target = RESULTS / name
    target.write_text(json.dumps(record, indent=2) + "\n")
    return target
