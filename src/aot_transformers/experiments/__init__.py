"""The papers' theory and small-scale experiments as tested, runnable modules.

One module per study, laid out as `study.py` describes (plain functions, an `Options` dataclass, one function per
figure or claim, `run`), listed in `STUDIES`; `clustering` is split into `clustering` (data, predictors, training
loop), `clustering_theory` (the paper's closed forms) and `clustering_figures` (the figures and claims);
`diagnostics` is `aot inspect MODEL`.

Command line: `aot experiment NAME [--out DIR] [options]` and `aot inspect MODEL`. The repository's
benchmarks/results/experiments/README.md has one section per claim: what the paper says, the command, what was
measured, whether it held.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

# Study name -> (its module, one line of help for `aot experiment --help`).
STUDIES: dict[str, tuple[str, str]] = {
    "denoising": ("denoising", "AoT Theorem 1 / Fig. 4: SNR per layer of unrolled MSSA"),
    "icl": ("icl", "AoT Fig. 6: in-context linear / sparse regression"),
    "clustering": ("clustering_figures", "attention-based clustering: Figs 1-15 and the closed forms"),
    "knn": ("knn", "KVT: noise distillation and training speed of k-NN attention"),
    "knn-evidence": ("knn_evidence", "KVT: slow vs fast definition, Lemmas 1, 3 and 4, Figs 1-4 (k sweep, maps)"),
    "attention-maps": ("attention_maps", "AoT Fig. 7: [CLS]-to-patch attention of each head (penultimate layer)"),
}


def study_module(name: str) -> ModuleType:
    """The module of study `name` (a key of `STUDIES`): its `Options`, its figures and its `run` (ValueError listing
    the known names for an unknown one)."""
    if name not in STUDIES:
        raise ValueError(f"Unknown study {name!r}; choose one of {sorted(STUDIES)}.")
    return importlib.import_module(f"{__name__}.{STUDIES[name][0]}")


def run_experiment(name: str, **options: Any) -> dict[str, Any]:
    """Run study `name` (a key of `STUDIES`) with `options` passed to its `run` function (ValueError: unknown name)."""
    return study_module(name).run(**options)


__all__ = ["STUDIES", "run_experiment", "study_module"]
