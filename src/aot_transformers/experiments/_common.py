"""Helpers shared by the studies: argument checks, seeding, and the results.json / PNG / summary.md writers.

Every study writes the same three kinds of artifact into its output folder:
`results.json` (every measured number and the options that produced it), PNG figures, and `summary.md`, a table
that puts each measured value beside the paper's claim.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path
from typing import Any

import torch

DEFAULT_OUTPUT_ROOT = Path("out") / "experiments"


# --------------------------------------------------------------------------------------------------------------------
# Argument checks: a bad option raises ValueError naming the argument, the value and what is allowed.
# --------------------------------------------------------------------------------------------------------------------


def check_int(name: str, value: Any, minimum: int = 1, maximum: int | None = None) -> int:
    """Return `value` if it is an int in [minimum, maximum], else raise ValueError naming `name`."""
    allowed = f"an int >= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]"
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ValueError(f"`{name}` must be {allowed}, got {value!r}.")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"`{name}` must be {allowed}, got {value}.")
    return int(value)


def check_real(
    name: str,
    value: Any,
    minimum: float = 0.0,
    maximum: float = math.inf,
    *,
    open_min: bool = False,
    open_max: bool = False,
) -> float:
    """Return `value` as a float if it lies in the interval, else raise ValueError naming `name`."""
    interval = f"{'(' if open_min else '['}{minimum}, {maximum}{')' if open_max or maximum == math.inf else ']'}"
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"`{name}` must be a number in {interval}, got {value!r}.")
    value = float(value)
    below = value <= minimum if open_min else value < minimum
    above = value >= maximum if open_max else value > maximum
    if math.isnan(value) or below or above:
        raise ValueError(f"`{name}` must be a number in {interval}, got {value}.")
    return value


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """Return `value` if it is one of `choices`, else raise ValueError listing them."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {list(choices)}, got {value!r}.")
    return value


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with `seed`: every random draw of a study goes through one, so runs repeat exactly."""
    check_int("seed", seed, minimum=0)
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


# --------------------------------------------------------------------------------------------------------------------
# Artifacts.
# --------------------------------------------------------------------------------------------------------------------


def output_dir(out: str | Path | None, study: str) -> Path:
    """The folder a study writes into (created): `out`, or `out/experiments/<study>` under the working directory."""
    path = Path(out) if out is not None else DEFAULT_OUTPUT_ROOT / study
    path.mkdir(parents=True, exist_ok=True)
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _jsonable(value.detach().cpu().tolist())
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; null keeps the file loadable everywhere
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _jsonable(value.item())
    return value


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    """Write `payload` as indented JSON, writing to a temporary file first so a crash never leaves half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_jsonable(payload), indent=2) + "\n")
    tmp.replace(path)
    return path


@dataclass
class Claim:
    """One row of a study's summary: a measured quantity beside what the paper states."""

    quantity: str
    measured: str
    paper: str
    holds: bool | None = None  # None: reported only, no pass/fail criterion

    def as_row(self) -> str:
        verdict = {True: "yes", False: "**no**", None: "—"}[self.holds]
        return f"| {self.quantity} | {self.measured} | {self.paper} | {verdict} |"

    def as_dict(self) -> dict[str, Any]:
        return {"quantity": self.quantity, "measured": self.measured, "paper": self.paper, "holds": self.holds}


def write_summary(
    path: Path,
    title: str,
    claims: Iterable[Claim],
    *,
    command: str,
    notes: Sequence[str] = (),
    figures: Sequence[str] = (),
) -> Path:
    """Write the markdown summary: the command, a measured-vs-paper table, figures and notes."""
    lines = [
        f"# {title}",
        "",
        f"Command: `{command}`",
        "",
        "| quantity | measured | paper | matches |",
        "|---|---|---|---|",
    ]
    lines += [claim.as_row() for claim in claims]
    if figures:
        lines += ["", "Figures: " + ", ".join(f"[{name}]({name})" for name in figures)]
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    path.write_text("\n".join(lines) + "\n")
    return path


def new_figure(ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (5.0, 3.6)):
    """A matplotlib Figure and its axes, without pyplot (no global state, no display backend needed)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def save_figure(fig, path: Path) -> str:
    """Save `fig` as PNG and return its file name (for the summary's figure list)."""
    fig.savefig(path, dpi=120)
    return path.name


class Stopwatch:
    """Wall-clock seconds since creation, for the time budgets written into results.json."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.start


def format_command(study: str, options: dict[str, Any]) -> str:
    """The `aot experiment ...` command line that reproduces a run with `options`."""
    parts = ["aot experiment", study]
    for key, value in options.items():
        if value is None or key == "out":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                parts.append(flag)
        elif isinstance(value, (list, tuple)):
            parts.append(flag + " " + " ".join(str(v) for v in value))
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)
