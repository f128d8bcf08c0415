"""Statistics over seeds for the replication report: mean and half-range per row, paired dense / k-NN values."""

from __future__ import annotations

import math
from collections import defaultdict
from statistics import mean


def section_invocations(meta: dict) -> list[dict]:
    """The invocations recorded in a section's meta (records older than the list hold a single one)."""
    return meta.get("invocations", [meta])


def summarise(values: list[float]) -> dict[str, float]:
    """Mean, half-range (our spread for two seeds: half the distance between them), min, max, count."""
    return {
        "mean": mean(values),
        "spread": (max(values) - min(values)) / 2 if len(values) > 1 else math.nan,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def by_row(runs: list[dict]) -> dict[str, list[dict]]:
    """The runs grouped by row name, in the order they were recorded."""
    grouped: dict[str, list[dict]] = defaultdict(list)
    for run in runs:
        grouped[run["row"]].append(run)
    return grouped


def fmt(stats: dict[str, float], digits: int = 3, scale: float = 1.0) -> str:
    """`mean ± spread (n=2)` or `value (1 seed)`."""
    m = stats["mean"] * scale
    if stats["n"] > 1:
        return f"{m:.{digits}f} ± {stats['spread'] * scale:.{digits}f}"
    return f"{m:.{digits}f} (1 seed)"


def noise_level(grouped: dict[str, list[dict]], key: str, rows: list[str]) -> float:
    """The largest half-range between seeds over the multi-seed `rows` (our noise estimate; NaN without seeds)."""
    spreads = [summarise([r[key] for r in grouped[row]])["spread"] for row in rows if len(grouped.get(row, [])) > 1]
    return max(spreads) if spreads else math.nan


def ratio_or_nan(value: float, reference: float) -> float:
    """`value / reference`, NaN when the reference is zero."""
    return value / reference if reference else math.nan


def millions(count: int) -> str:
    """A parameter count as `1.23M`."""
    return f"{count / 1e6:.2f}M"


def paired_means(grouped, row: str, twin: str, key: str) -> tuple[float, float] | None:
    """(dense, k-NN) values of `key` for the seeds both rows ran with."""
    twin_runs = {r["seed"]: r for r in grouped.get(twin, [])}
    pairs = [(r[key], twin_runs[r["seed"]][key]) for r in grouped.get(row, []) if r["seed"] in twin_runs]
    if not pairs:
        return None
    return mean(p[0] for p in pairs), mean(p[1] for p in pairs)


def curve_points(run: dict, curve: str) -> list[tuple[int, float]]:
    """(step, value) pairs of a run's curve, one per step (the last logged value), in step order."""
    return sorted(dict((int(step), value) for step, value in run["curve"][curve]).items())


def paired_curves(grouped, row: str, twin: str, curve: str):
    """Dense and k-NN evaluation curves of the seeds both ran with (first such seed)."""
    twin_runs = {r["seed"]: r for r in grouped.get(twin, [])}
    for run in grouped.get(row, []):
        if run["seed"] in twin_runs:
            return curve_points(run, curve), curve_points(twin_runs[run["seed"]], curve)
    return None


# ---------------------------------------------------------------------------------------------------------------


def verdict_status(held: list[bool]) -> str:
    """The status of a claim tested on several models: held by all, some or none."""
    return "held" if all(held) else "partly held" if any(held) else "did not hold"
