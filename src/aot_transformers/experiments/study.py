"""What every study shares: its options (a `StudyOptions` dataclass), its record (`Study`) and argument checks.

A study module declares `Options`, a dataclass of typed fields checked when it is built; `HfArgumentParser` turns it
into the `aot experiment NAME` flags, so the Python API and the command read one declaration. Its
`run(out=None, **options)` opens a `Study`, calls one function per figure or claim, each adding claims, figures and
numbers to the record, and returns `study.finish()`, which writes `results.json`, the PNG figures and `summary.md`.
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from numbers import Integral, Real
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_args, get_origin, get_type_hints

import torch

from .. import _io
from .._io import arg as arg  # the studies declare their options with it

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.axes import Axes
    from typing_extensions import Self

DEFAULT_OUTPUT_ROOT = Path("out") / "experiments"


# --- Argument checks: a bad option raises ValueError naming the argument, the value and what is allowed.


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
    return torch.Generator().manual_seed(seed)


# --- Artifacts.


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


def close(measured: float, reference: float, factor: float = 2.0) -> bool:
    """The one rule for "close" / "matches" / "reproduces" (experiments README): within a factor 2, either way."""
    return reference > 0 and reference / factor <= measured <= reference * factor


@dataclass
class Claim:
    """One row of a study's summary: a measured quantity beside what the paper states."""

    quantity: str
    measured: str
    paper: str
    holds: bool | None = None  # None: reported only, no pass/fail criterion


def set_axes(ax: Axes, fontsize: float | None = None, **labels: Any) -> None:
    """`ax.set(**labels)` (title, axis labels, limits) and a legend of the plotted lines in font size `fontsize`."""
    ax.set(**labels)
    ax.legend(fontsize=fontsize)


# --- Options: one dataclass per study, parsed by `HfArgumentParser` on the command line and checked on construction.


@dataclass(frozen=True)
class Range:
    """The interval a number option must lie in, declared in its type: `Annotated[float, Range(0, 1)]`."""

    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False


Count = Annotated[int, Range(1)]  # an int >= 1
Seed = Annotated[int, Range(0)]
NonNegative = Annotated[float, Range(0.0)]
Positive = Annotated[float, Range(0.0, open_low=True)]


def _check_value(name: str, value: Any, kind: Any, choices: Sequence[str] | None) -> Any:
    """`value` checked against the option type `kind` (ValueError naming the option); lists become lists."""
    if type(None) in get_args(kind):  # Optional[...]: None means "derived from the other options"
        if value is None:
            return None
        kind = next(arg for arg in get_args(kind) if arg is not type(None))
    if get_origin(kind) is list:
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            raise ValueError(f"`{name}` must be a list of values, got {value!r}.")
        if not (values := list(value)):
            raise ValueError(f"`{name}` must list at least one value, got an empty list.")
        return [_check_value(name, v, get_args(kind)[0], choices) for v in values]
    if choices is not None:
        return check_choice(name, value, choices)
    kind, bounds = get_args(kind) if get_origin(kind) is Annotated else (kind, Range())
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"`{name}` must be True or False, got {value!r}.")
        return value
    if kind is int:
        low = 0 if bounds.low == -math.inf else int(bounds.low)
        return check_int(name, value, low, None if bounds.high == math.inf else int(bounds.high))
    if kind is float:
        return check_real(name, value, bounds.low, bounds.high, open_min=bounds.open_low, open_max=bounds.open_high)
    if not isinstance(value, (str, Path)):  # folders may be given as paths
        raise ValueError(f"`{name}` must be a {kind.__name__}, got {value!r}.")
    return value


@dataclass
class StudyOptions:
    """The base of a study's options: each field is checked against its type (ranges via `Range`, allowed values via
    the field's `choices`) when the dataclass is built, from Python or from `aot experiment NAME --option value`."""

    def __post_init__(self) -> None:
        kinds = get_type_hints(type(self), include_extras=True)
        for item in fields(self):
            value = _check_value(item.name, getattr(self, item.name), kinds[item.name], item.metadata.get("choices"))
            setattr(self, item.name, value)

    @classmethod
    def parse(cls, given: dict[str, Any]) -> Self:
        """The options from keyword arguments; ValueError for an unknown name (listing the known ones)."""
        names = [item.name for item in fields(cls)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ValueError(f"Unknown option(s) {unknown}; this study takes {names}.")
        return cls(**given)

    def command(self, study: str) -> str:
        """The `aot experiment ...` command line that reproduces a run with these options.

        A boolean with default True is written `--no-NAME` when False; other booleans `--NAME` when True."""
        parts = ["aot experiment", study]
        for item in fields(self):
            value, flag = getattr(self, item.name), "--" + item.name.replace("_", "-")
            if value is None:
                continue
            if isinstance(value, bool):
                if value != item.default:
                    parts.append(flag if value else "--no-" + flag[2:])
            elif isinstance(value, (list, tuple)):
                parts.append(flag + " " + " ".join(str(v) for v in value))
            else:
                parts.append(f"{flag} {value}")
        return " ".join(parts)


# --- The study record.


@dataclass
class Study:
    """The record a study fills: numbers (`results`), claims, figures and notes; `finish` writes the artifacts.

    `command` is the line written into the summary, by default `options.command(name)`; `aot inspect` has no options.
    """

    name: str
    title: str
    options: StudyOptions | None
    out: str | Path | None = None
    command: str | None = None
    results: dict[str, Any] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # The folder it writes into (created): `out`, or `out/experiments/<name>` under the working directory.
        self.folder = _io.writable_folder(DEFAULT_OUTPUT_ROOT / self.name if self.out is None else self.out, "--out")
        self.start = time.perf_counter()
        self._drawn: list[tuple[Any, str]] = []

    def claim(self, quantity: str, measured: str, paper: str, holds: bool | None = None) -> None:
        """Add a summary row: the measured value beside the paper's statement, and whether it held."""
        self.claims.append(Claim(quantity, measured, paper, None if holds is None else bool(holds)))

    def figure(
        self, filename: str, ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (5.0, 3.6)
    ) -> np.ndarray:
        """The axes of a new matplotlib figure (without pyplot: no global state, no display backend needed), listed in
        the summary and saved as `filename` by `finish`."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
        self._drawn.append((fig, filename))
        self.figures.append(filename)
        return fig.subplots(nrows, ncols, squeeze=False)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def finish(self) -> dict[str, Any]:
        """Write the PNGs, results.json (its provenance as benchmarks/results files record it: the command with its
        `--out`, git revision, versions, host and date; then every number, the options and the claims) and summary.md,
        a table that puts each measured value beside the paper's claim; return the results."""
        for fig, filename in self._drawn:
            fig.savefig(self.folder / filename, dpi=120)
        options = {} if self.options is None else {"options": asdict(self.options)}
        results = {"study": self.name, **options, **self.results, "seconds": time.perf_counter() - self.start}
        results["claims"] = [asdict(claim) for claim in self.claims]
        command = self.command or self.options.command(self.name)
        provenance = _io.provenance(command + ("" if self.out is None else f" --out {shlex.quote(str(self.out))}"))
        _io.write_json(self.folder / "results.json", _jsonable({**provenance, **results}), indent=2, sort_keys=False)
        verdicts = {True: "yes", False: "**no**", None: "—"}
        lines = [f"# {self.title}", "", f"Command: `{command}`", ""]
        lines += ["| quantity | measured | paper | matches |", "|---|---|---|---|"]
        lines += [f"| {c.quantity} | {c.measured} | {c.paper} | {verdicts[c.holds]} |" for c in self.claims]
        if self.figures:
            lines += ["", "Figures: " + ", ".join(f"[{name}]({name})" for name in self.figures)]
        notes = [*self.notes, f"Wall time {results['seconds']:.0f} s."]
        lines += ["", *[f"- {note}" for note in notes]]
        (self.folder / "summary.md").write_text("\n".join(lines) + "\n")
        return results
