"""What every study shares: its options (declared once, as `Option`s), its record (`Study`) and argument checks.

A study module declares `OPTIONS`, a tuple of `Option`; `resolve_options` fills the defaults and checks the values
(the Python API and the `aot experiment` command read the same declaration). Its `run(out=None, **options)` opens a
`Study`, calls one function per figure or claim, each adding claims, figures and numbers to the record, and returns
`study.finish()`, which writes the same three kinds of artifact into the output folder: `results.json` (every
measured number and the options that produced it), PNG figures, and `summary.md`, a table that puts each measured
value beside the paper's claim.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
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
    from ..errors import UsageError

    path = Path(out) if out is not None else DEFAULT_OUTPUT_ROOT / study
    if path.exists() and not path.is_dir():
        raise UsageError("is a file, not a folder", argument="--out", value=str(path))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot be created ({error.strerror or error})", argument="--out", value=str(path)) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError("is not writable", argument="--out", value=str(path))
    return path


def require_matplotlib(command: str) -> None:
    """Say which extra to install when matplotlib is missing, before any work (every study writes figures)."""
    import importlib.util

    from ..errors import UsageError

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            f"{command} draws its figures with matplotlib, which is not installed: "
            "pip install 'aot-transformers[experiments]'"
        )


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


def format_command(study: str, options: dict[str, Any], spec: Sequence[Option] = ()) -> str:
    """The `aot experiment ...` command line that reproduces a run with `options`.

    A boolean option declared in `spec` with default True is written `--no-NAME` when False (as `Option.add_to`
    declares it); other booleans are written `--NAME` when True.
    """
    true_by_default = {option.name for option in spec if option.type is bool and option.default}
    parts = ["aot experiment", study]
    for key, value in options.items():
        if value is None or key == "out":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if key in true_by_default:
                if not value:
                    parts.append("--no-" + key.replace("_", "-"))
            elif value:
                parts.append(flag)
        elif isinstance(value, (list, tuple)):
            parts.append(flag + " " + " ".join(str(v) for v in value))
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------------------------------
# Options, declared once per study.
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One option of a study: its name, default, help text and allowed values.

    `kind` is the type of one value (int, float, str or bool; default: the type of `default`); `many` makes it a
    non-empty list of such values; `optional` allows None (the default then means "derived from other options").
    Numbers must lie in [`minimum`, `maximum`] (`open_min`: excluding the minimum); strings in `choices`.
    """

    name: str
    default: Any
    help: str
    kind: type | None = None
    many: bool = False
    optional: bool = False
    minimum: float | None = None
    maximum: float | None = None
    open_min: bool = False
    open_max: bool = False
    choices: Sequence[str] | None = None

    @property
    def type(self) -> type:
        if self.kind is not None:
            return self.kind
        sample = self.default[0] if self.many else self.default
        return type(sample)

    def check(self, value: Any) -> Any:
        """The checked value (lists become lists, ints are accepted for floats); ValueError naming the option."""
        if value is None and self.optional:
            return None
        if self.many:
            if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                raise ValueError(f"`{self.name}` must be a list of values, got {value!r}.")
            values = list(value)
            if not values:
                raise ValueError(f"`{self.name}` must list at least one value, got an empty list.")
            return [self._check_one(v) for v in values]
        return self._check_one(value)

    def _check_one(self, value: Any) -> Any:
        kind = self.type
        if self.choices is not None:
            return check_choice(self.name, value, self.choices)
        if kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"`{self.name}` must be True or False, got {value!r}.")
            return value
        if kind is int:
            return check_int(self.name, value, int(self.minimum if self.minimum is not None else 0), self.maximum)
        if kind is float:
            low = -math.inf if self.minimum is None else self.minimum
            high = math.inf if self.maximum is None else self.maximum
            return check_real(self.name, value, low, high, open_min=self.open_min, open_max=self.open_max)
        if kind is str and isinstance(value, Path):
            return value  # folders may be given as paths
        if not isinstance(value, kind):
            raise ValueError(f"`{self.name}` must be a {kind.__name__}, got {value!r}.")
        return value

    def add_to(self, parser) -> None:
        """Add `--name` to an argparse parser; left out, the option keeps its default (argparse.SUPPRESS)."""
        import argparse

        flag = "--" + self.name.replace("_", "-")
        default_text = "derived" if self.default is None else self.default
        if self.type is bool:
            if self.default:
                parser.add_argument(
                    "--no-" + self.name.replace("_", "-"),
                    dest=self.name,
                    action="store_false",
                    default=argparse.SUPPRESS,
                    help=self.help,
                )
            else:
                parser.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=self.help)
            return
        kind = str if self.choices is not None else self.type
        parser.add_argument(
            flag,
            type=kind,
            nargs="+" if self.many else None,
            choices=self.choices,
            default=argparse.SUPPRESS,
            help=f"{self.help} (default: {default_text})",
        )


def resolve_options(spec: Sequence[Option], given: dict[str, Any]) -> dict[str, Any]:
    """Every option of `spec`, from `given` or its default, checked; ValueError for unknown names or bad values."""
    names = [option.name for option in spec]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"Unknown option(s) {unknown}; this study takes {names}.")
    return {option.name: option.check(given.get(option.name, option.default)) for option in spec}


# --------------------------------------------------------------------------------------------------------------------
# The study record.
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Study:
    """The record a study fills: numbers (`results`), claims, figures and notes; `finish` writes the artifacts."""

    name: str
    title: str
    options: dict[str, Any]
    out: str | Path | None = None
    spec: Sequence[Option] = ()
    results: dict[str, Any] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.folder = output_dir(self.out, self.name)
        self.clock = Stopwatch()

    def claim(self, quantity: str, measured: str, paper: str, holds: bool | None = None) -> Claim:
        """Add a summary row: the measured value beside the paper's statement, and whether it held."""
        claim = Claim(quantity, measured, paper, None if holds is None else bool(holds))
        self.claims.append(claim)
        return claim

    def save(self, fig, filename: str) -> str:
        """Save a figure into the study's folder and list it in the summary."""
        name = save_figure(fig, self.folder / filename)
        self.figures.append(name)
        return name

    def note(self, text: str) -> None:
        self.notes.append(text)

    def finish(self, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write results.json and summary.md; return the results (options, numbers, claims, seconds)."""
        options = self.options if options is None else options
        results = {
            "study": self.name,
            "options": options,
            **self.results,
            "seconds": self.clock.seconds(),
            "claims": [claim.as_dict() for claim in self.claims],
        }
        write_json(self.folder / "results.json", results)
        write_summary(
            self.folder / "summary.md",
            self.title,
            self.claims,
            command=format_command(self.name, self.options, self.spec),
            figures=self.figures,
            notes=[*self.notes, f"Wall time {results['seconds']:.0f} s."],
        )
        return results
