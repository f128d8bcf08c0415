"""Local `evaluate` metric modules, loaded by path (metrics on the Hub cannot be loaded offline).

`evaluate.load(metric_path("accuracy"))` gives the same interface as `evaluate.load("accuracy")`.
"""

from __future__ import annotations

from pathlib import Path

METRICS_DIR = Path(__file__).resolve().parent


def metric_path(name: str) -> str:
    """Path of the local metric module `name` (e.g. `"accuracy"`), for `evaluate.load`."""
    path = METRICS_DIR / f"{name}.py"
    if not path.is_file():
        available = sorted(p.stem for p in METRICS_DIR.glob("*.py") if p.stem != "__init__")
        raise ValueError(f"No local metric {name!r}; available: {available}.")
    return str(path)


def load_metric(name: str):
    """`evaluate.load` of the local metric module `name`."""
    import evaluate

    return evaluate.load(metric_path(name))
