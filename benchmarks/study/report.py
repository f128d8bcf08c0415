"""REPORT.md and its figures, rendered from the study's records alone (`python -m benchmarks.study --only report`).

Every number in the report is read from a record; the verdicts follow the rules stated beside them, each quoting
the paper's sentence it tests. A row without a record is listed as not finished (where a started one stands, from
its committed checkpoint), never estimated.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from . import plan as study_plan
from .runner import PROGRESS, RECORDS, WALL_FILE

LABELS = {
    "gpt2": "GPT-2",
    "llama": "Llama",
    "aot-mssa": "AoT-MSSA",
    "aot-mhsa": "AoT-MHSA",
    "aot-mssa-hybrid": "AoT-MSSA Hybrid",
    "aot-mssa-full": "AoT-MSSA Full MLP",
    "aot-mssa+knn": "AoT-MSSA + k-NN",
    "gpt2+knn": "GPT-2 + k-NN",
    "vit": "ViT",
    "crate": "CRATE",
    "vit+knn": "ViT + k-NN",
}
# The ICML paper's vision gaps (Tables 1-2, ImageNet top-1): AoT-MSSA-V 71.7% vs CRATE 79.5%, AoT-MHSA-V 69.5% vs
# ViT 72.4%: "comparable" there means at most these many points behind.
PAPER_VISION_GAP = {"aot-mssa": ("crate", 7.8), "aot-mhsa": ("vit", 2.9)}
# The sentences each verdict tests, quoted from ../shared/papers (file:line).
CLAIMS = {
    "close": (
        "aot-icml2025.txt:226",
        "We observe that the AoT models with medium and large parameter sizes can achieve comparable performance to "
        "the GPT-2 base model.",
    ),
    "mhsa": (
        "aot-icml2025.txt:222",
        "compared to the GPT-2 base model, the AoT-MHSA-L model is identical to the GPT-2 base model, except for the "
        "absence of MLP layers in the architecture.",
    ),
    "mlp": (
        "aot-icml2025.txt:222, 226",
        "As shown in Figure 5, incorporating MLP layers can accelerate the training process. ... Moreover, we found "
        "that adding MLP layers to AoT does not improve the zero-shot performance.",
    ),
    "vision": (
        "aot-icml2025.txt:208",
        "Due to the absence of MLP layers in AoT, AoT-based models achieve slightly worse performance comparable to "
        "CRATE and ViT while using only nearly half the number of parameters.",
    ),
    "knn": (
        "kvt-knn-attention.txt:194, 122",
        "the training speed of k-NN attention is faster than full-connected attention, especially in the early stage "
        "of training ... k-NN attention reports 0.8% improvements on DeiT-Tiny",
    ),
}
# How close "close" is: the largest gap to GPT-2 Base among the models the paper's Table 3 sets beside it (AoT-MSSA-L
# Base: +0.38, +0.28, +0.52 nats on LAMBADA, PTB and WikiText; mean 0.39).
PAPER_GAP = (0.38 + 0.28 + 0.52) / 3


def load_records(records: Path, section: str = "language") -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((records / section).glob("*.json"))]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _half_range(values: list[float]) -> float:
    return (max(values) - min(values)) / 2 if len(values) > 1 else 0.0


def _grouped(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records:
        groups[(record["size"], record["arch"])].append(record)
    return groups


def _by_arch(images: list[dict]) -> dict[str, list[dict]]:
    """Vision records by architecture, in the order given."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for record in images:
        groups[record["arch"]].append(record)
    return groups


def _label(arch: str, runs: list[dict]) -> str:
    """A table's model cell: the architecture, and its seeds when there are several."""
    return LABELS.get(arch, arch) + (f" ({len(runs)} seeds)" if len(runs) > 1 else "")


def seed_noise(groups, key=lambda r: r["final"]["eval_loss"]) -> float | None:
    """Half the range of `key` over seeds, averaged over the rows that have more than one seed."""
    spreads = [_half_range([key(r) for r in runs]) for runs in groups.values() if len(runs) > 1]
    return _mean(spreads) if spreads else None


def power_law(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares fit of loss = a · C^(−b) in log-log space; (a, b), or None with fewer than two distinct
    compute values (the seeds of one size share theirs)."""
    if len({c for c, _ in points}) < 2:
        return None
    xs, ys = [math.log(c) for c, _ in points], [math.log(loss) for _, loss in points]
    mx, my = _mean(xs), _mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return math.exp(my - slope * mx), -slope


def _colour(arch: str) -> str:
    """One colour per architecture in every figure: matplotlib's default cycle (tab10) in the order of `LABELS`."""
    return f"C{list(LABELS).index(arch) % 10}" if arch in LABELS else "black"


def plot_compute(groups, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for arch in study_plan.MAIN_ARCHS:
        points = sorted(
            (r["flops"], r["final"]["eval_loss"]) for (size, a), runs in groups.items() if a == arch for r in runs
        )
        if not points:
            continue
        axis.plot(*zip(*points, strict=True), "o", color=_colour(arch), label=LABELS[arch])
        fit = power_law(points)
        if fit:
            a, b = fit
            xs = [points[0][0], points[-1][0]]
            axis.plot(xs, [a * x**-b for x in xs], "-", color=_colour(arch), alpha=0.7)
    axis.set(xscale="log", yscale="log", xlabel="training FLOPs", ylabel="validation loss (nats)")
    for ticks in (axis.yaxis.set_major_formatter, axis.yaxis.set_minor_formatter):  # 4.5, not 4.5 x 10^0
        ticks(FormatStrFormatter("%.1f"))
    axis.set_title("Validation loss against training compute (lines: fitted power laws)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_curves(groups, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({size for size, _ in groups}, key=lambda s: [z.name for z in study_plan.STUDY.sizes].index(s))
    figure, axes = plt.subplots(1, max(1, len(sizes)), figsize=(5 * max(1, len(sizes)), 4), squeeze=False)
    for axis, size in zip(axes[0], sizes, strict=False):
        for (s, arch), runs in sorted(groups.items()):
            if s != size:
                continue
            run = runs[0]
            tokens_per_step = run["tokens"] / run["steps"]
            xs = [step * tokens_per_step / 1e6 for step, _ in run["curves"]["eval"]]
            losses = [loss for _, loss in run["curves"]["eval"]]
            style = "--" if arch.endswith("+knn") else "-"  # a k-NN twin dashed
            axis.plot(xs, losses, style, color=_colour(arch), label=LABELS.get(arch, arch))
        axis.set(title=f"size {size}", xlabel="training tokens (M)", ylabel="validation loss (nats)")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_vision_curves(images: list[dict], vision: study_plan.VisionStudy, path: Path) -> None:
    """Validation accuracy against training epochs, one line per architecture (its first seed), k-NN twins dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for arch, (run, *_) in _by_arch(images).items():
        epochs_per_step = run["tokens"] / run["steps"] / vision.train_images
        points = [(step * epochs_per_step, 100 * accuracy) for step, accuracy in run["curves"]["eval"]]
        style = "--" if arch.endswith("+knn") else "-"
        axis.plot(*zip(*points, strict=True), style, color=_colour(arch), label=LABELS.get(arch, arch))
    floor = vision.vit_floor
    axis.axhline(floor, color="grey", linewidth=0.8, linestyle=":", label=f"ViT floor ({floor:.0f}%)")
    axis.set(xlabel="training epochs", ylabel="validation accuracy (%)")
    axis.set_title("CIFAR-10: validation accuracy during training")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _fmt(values: list[float], digits: int = 3) -> str:
    text = f"{_mean(values):.{digits}f}"
    return text + (f" ± {_half_range(values):.{digits}f}" if len(values) > 1 else "")


def _zero_shot(record: dict, task: str, key: str) -> float | None:
    entry = record.get("zero_shot", {}).get(task, {})
    return entry.get(key)


SUMMARY_START, SUMMARY_END = (
    "<!-- study summary: rendered by benchmarks/study/report.py -->",
    "<!-- /study summary -->",
)


def cpu_hours(records: list[dict]) -> float:
    """CPU-hours of finished runs: wall-clock times the run's torch threads (records from before `--jobs` trained
    alone with two and do not name them)."""
    return sum(r["wall_seconds"] * (r.get("host", {}).get("threads") or 2) for r in records) / 3600


def _hours(hours: float | None) -> str:
    return f" ({hours:.1f} h)" if hours is not None else ""


def progress(run, records_dir: Path) -> dict[str, Any] | None:
    """Where a started, unfinished run stands, from its committed checkpoint (`runner.save_progress`): its step, its
    wall-clock seconds over every invocation so far and its validation points `(step, loss)`; None without one."""
    folder = records_dir / PROGRESS / run.name
    try:
        state = json.loads((folder / "trainer_state.json").read_text())
        seconds = json.loads((folder / WALL_FILE).read_text())["seconds"]
    except (OSError, ValueError, KeyError):
        return None
    evals = [(entry["step"], entry["eval_loss"]) for entry in state["log_history"] if "eval_loss" in entry]
    return {"step": state["global_step"], "seconds": seconds, "evals": evals}


def remaining_hours(
    runs: list, finished: list[dict], block_size: int, started: dict[str, dict] | None = None
) -> dict[str, float | None]:
    """Wall-clock hours each of `runs` has left beside another run (as the study trains, `--jobs 2`). A started run
    (its `progress` in `started`, by name): its steps left at its own pace so far (start-up included, so a little
    long). Any other: its planned FLOPs (`flops.planned_flops`) at the fastest FLOP rate a finished run of its
    architecture reached (a k-NN twin without its own: its dense twin's); None without any. Finished runs of smaller
    sizes multiply narrower matrices, more slowly: larger rows will take less."""
    from .flops import planned_flops

    rate: dict[tuple[str, str], float] = {}
    for record in finished:
        key = (record["section"], record["arch"])
        rate[key] = max(rate.get(key, 0.0), record["flops"] / record["wall_seconds"])
    estimates = {}
    for run in runs:
        if (stand := (started or {}).get(run.name)) and stand["step"]:
            estimates[run.name] = stand["seconds"] / stand["step"] * (run.steps - stand["step"]) / 3600
            continue
        key = next(
            (k for k in ((run.section, run.arch), (run.section, run.arch.removesuffix("+knn"))) if k in rate), None
        )
        estimates[run.name] = planned_flops(run, block_size) / rate[key] / 3600 if key else None
    return estimates


def _standing(run, started: dict[str, Any] | None, hours: float | None) -> str:
    """A not-finished run as the report lists it: its name, where a started one stands (its `progress`), and its
    hours left."""
    if not started:
        return f"`{run.name}`" + _hours(hours)
    evaluated = "".join(f", validation loss {loss:.3f} at step {step:,}" for step, loss in started["evals"][-1:])
    return (
        f"`{run.name}` (at step {started['step']:,} of {run.steps:,}{evaluated}; {started['seconds'] / 3600:.1f} h "
        f"so far, {hours:.1f} h left at its own pace)"
    )


def summary_block(study: study_plan.Study, vision: study_plan.VisionStudy, records_dir: Path) -> str:
    """The README's summary of the study, from the records alone: each finished main row's validation, floor and test
    numbers (CIFAR-10: its accuracy), and the machine-hours the finished runs took."""
    records, images = load_records(records_dir), load_records(records_dir, "vision")
    planned = study_plan.schedule(study, vision)
    lines = [
        SUMMARY_START,
        f"Runs finished: {len({r['run'] for r in records + images})} of {len(planned)}, in "
        f"{cpu_hours(records + images):.1f} CPU-hours ({cpu_hours(records + images) / 2:.1f} hours of this two-core "
        "machine).",
        "Gutenberg validation and test loss (nats per token, mean over seeds ± half their range) and how far below",
        "the unigram floor each main row ends:",
        "",
        "| size | model | val. loss | below unigram | test loss | wall hours, all seeds |",
        "|---|---|---|---|---|---|",
    ]
    order = {r.name: i for i, r in enumerate(planned)}
    for (size, arch), runs in sorted(_grouped(records).items(), key=lambda item: order.get(item[1][0]["run"], 1e9)):
        if runs[0]["main"]:
            cells = [
                size,
                _label(arch, runs),
                _fmt([r["final"]["eval_loss"] for r in runs]),
                _fmt([r["final"]["below_unigram"] for r in runs], 2),
                _fmt([r["final"]["test_loss"] for r in runs]),
                f"{sum(r['wall_seconds'] for r in runs) / 3600:.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    by_arch = _by_arch(sorted((r for r in images if r["main"]), key=lambda r: order.get(r["run"], 1e9)))
    if by_arch:
        shape = f"{vision.num_hidden_layers} layers x {vision.hidden_size} for every model, {vision.epochs:g} epochs"
        lines += ["", f"CIFAR-10 validation accuracy (%, {shape}):", "",
                  "| model | parameters | val. accuracy | wall hours, all seeds |", "|---|---|---|---|"]  # fmt: skip
        for arch, runs in by_arch.items():
            cells = [
                _label(arch, runs),
                f"{runs[0]['parameters']['total'] / 1e6:.2f}M",
                _fmt([100 * r["final"]["eval_accuracy"] for r in runs], 1),
                f"{sum(r['wall_seconds'] for r in runs) / 3600:.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    groups, words = _grouped(records), {}
    verdicts(groups, noises(groups), words)
    knn_verdict(groups, noises(groups), images, words)
    vision_section(images, words)
    said = "; ".join(f"{claim} **{word}**" for claim, word in words.items())
    return "\n".join([*lines, "", f"Verdicts so far (the rules and numbers are in the study's REPORT.md): {said}.",
                      SUMMARY_END])  # fmt: skip


def write_summary(readme: Path, block: str) -> None:
    """Replace the summary between its markers in `readme` with `block`."""
    text = readme.read_text(encoding="utf-8")
    head, rest = text.split(SUMMARY_START, 1)
    readme.write_text(head + block + rest.split(SUMMARY_END, 1)[1], encoding="utf-8")


def write_report(study: study_plan.Study, vision: study_plan.VisionStudy, records_dir: Path, report_dir: Path) -> Path:
    """Write REPORT.md (and compute.png, curves.png, vision_curves.png) into `report_dir` from the records in
    `records_dir`."""
    records = load_records(records_dir)
    images = load_records(records_dir, "vision")
    groups = _grouped(records)
    report_dir.mkdir(parents=True, exist_ok=True)
    planned = study_plan.schedule(study, vision)
    done = {r["run"] for r in records + images}
    lines = ["# The real-scale study: AoT against GPT-2, Llama, ViT and CRATE", ""]
    lines.append(
        "Rendered by `python -m benchmarks.study --only report` from the records in "
        "`benchmarks/results/study/` alone; the runs and their commands are in `plan.py` and in each record."
    )
    hours = cpu_hours(records + images)
    lines += [
        "",
        f"**Runs finished: {len(done & {r.name for r in planned})} of {len(planned)}**, {hours:.1f} CPU-hours of "
        f"training and scoring ({hours / 2:.1f} hours of this two-core machine; a run's CPU-hours are its wall-clock "
        "hours times its torch threads: two alone, one each when two runs train at once). The hours per row below "
        "are wall-clock, not comparable between runs trained alone and in pairs; the comparisons are by tokens and "
        "FLOPs.",
        "",
    ]
    missing = [r for r in planned if r.name not in done]
    if missing:
        started = {r.name: stand for r in missing if (stand := progress(r, records_dir))}  # read once
        estimates = remaining_hours(missing, records + images, study.block_size, started)
        known = [hours for hours in estimates.values() if hours is not None]
        lines += [
            "Not finished yet (the study trains them in this order, two at a time; `python -m benchmarks.study` "
            "resumes a started run from its committed checkpoint), with the hours each has left beside another run: "
            "a started run's at its own pace so far, any other's at the fastest FLOP rate a finished run of its "
            "architecture reached (at smaller sizes, whose narrower matmuls run slower, so these err long): "
            + ", ".join(_standing(r, started.get(r.name), estimates[r.name]) for r in missing)
            + f". Those estimated come to about {sum(known) / 2:.0f} hours of this machine"
            + (f"; {len(estimates) - len(known)} rows have no finished run of their architecture to go by." if
               len(known) < len(estimates) else ".")
            + " A session trains for about 2.4 of its 3 hours (`--stop-after 2.4`).",
            "",
        ]  # fmt: skip
    lines += ["## Runs", ""]
    lines.append(
        "| size | model | layers x width | non-embedding | total | tokens | PFLOPs | val. loss | below unigram | "
        "test loss | PTB loss | LAMBADA loss | LAMBADA acc. | hours |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    order = {r.name: i for i, r in enumerate(planned)}
    for (size, arch), runs in sorted(groups.items(), key=lambda item: order.get(item[1][0]["run"], 1e9)):
        first = runs[0]
        shape = first["shape"]
        layers = shape["num_hidden_layers"]
        cells = [
            size,
            _label(arch, runs),
            f"{layers} x {shape['hidden_size']}",
            f"{first['parameters']['non_embedding'] / 1e6:.2f}M",
            f"{first['parameters']['total'] / 1e6:.2f}M",
            f"{first['tokens'] / 1e6:.1f}M",
            f"{first['flops'] / 1e15:.2f}",
            _fmt([r["final"]["eval_loss"] for r in runs]),
            _fmt([r["final"]["below_unigram"] for r in runs], 2),
            _fmt([r["final"]["test_loss"] for r in runs]) if first["final"].get("test_loss") is not None else "–",
            _fmt([_zero_shot(r, "ptb", "loss") or math.nan for r in runs]),
            _fmt([_zero_shot(r, "lambada", "loss") or math.nan for r in runs]),
            _fmt([_zero_shot(r, "lambada_acc", "acc") for r in runs], 2),
            f"{_mean([r['wall_seconds'] for r in runs]) / 3600:.2f}",
        ]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    noise = noises(groups)
    short = [r["run"] for r in records if r["main"] and r["final"]["below_unigram"] < 1]
    lines += [
        "",
        "Every main run must end at least 1 nat below the unigram floor of its validation blocks: "
        + (
            "short of it: " + ", ".join(f"`{name}`" for name in short) + " (the plan's tokens are too few for it)."
            if short
            else "all finished main runs do."
        ),
    ]
    if noise["final"] is None:
        lines += ["", "Until a row has two seeds the noise is unknown: the verdicts below count it as zero."]
    measured = (
        f"{noise['final']:.3f} nats at the end of a run, {noise['early']:.3f} at its first validation point; "
        f"zero-shot PTB {noise['ptb']:.3f}, LAMBADA {noise['lambada']:.3f}."
        if noise["final"] is not None
        else "not measured yet."
    )
    lines += ["", f"Seed noise (half the range over seeds, mean over rows with two seeds): {measured}", ""]
    lines += verdicts(groups, noise)
    lines += knn_verdict(groups, noise, images)
    lines += compute_section(groups, noise["final"])
    lines += vision_section(images)
    if records:
        plot_compute(groups, report_dir / "compute.png")
        plot_curves(groups, report_dir / "curves.png")
        lines += ["", "![validation loss against compute](compute.png)", "", "![curves](curves.png)"]
    if images:
        plot_vision_curves(images, vision, report_dir / "vision_curves.png")
        lines += ["", "![CIFAR-10 validation accuracy](vision_curves.png)"]
    path = report_dir / "REPORT.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def noises(groups) -> dict[str, float | None]:
    """The seed noise of each quantity a verdict compares: the final and the first validation loss, and the zero-shot
    losses of each task (each claim is judged against the noise of the number it compares)."""
    found = {"final": seed_noise(groups), "early": seed_noise(groups, key=lambda r: r["curves"]["eval"][0][1])}
    for task in ("ptb", "lambada"):
        found[task] = seed_noise(groups, key=lambda r, task=task: _zero_shot(r, task, "loss"))
    return found


def verdict(held: list[bool]) -> str:
    """The one word a claim ends in: held on every row it was tested on, on none, or on some."""
    if not held:
        return "not run yet"
    return "held" if all(held) else "not held" if not any(held) else "mixed"


def verdicts_of(*parts: tuple[str, list[bool]]) -> str:
    """`**Verdict: …**` for a claim in parts (`("faster", [...])` gives "faster held"), or "not run yet"."""
    if not any(held for _, held in parts):
        return "**Verdict: not run yet.**"
    return "**Verdict: " + "; ".join(f"{name} {verdict(held)}" for name, held in parts) + ".**"


def provisional(held: list[bool], pending: list[str]) -> tuple[str, str]:
    """A claim's verdict word and the sentence after it: a verdict judged on part of its planned rows says that it is
    provisional and which rows it still waits for (`pending`)."""
    if not held or not pending:
        return verdict(held), ""
    return f"{verdict(held)} (provisional)", f" Provisional until the rest has finished: {'; '.join(pending)}."


def _claim(title: str, key: str) -> str:
    source, sentence = CLAIMS[key]
    return f"**{title}** > {sentence} ({source})."


def verdicts(groups, noise: dict[str, float | None], words: dict[str, str] | None = None) -> list[str]:
    """The claims' verdicts, from the records present; a claim whose rows have not run says so. `words` collects
    each claim's verdict word."""
    words = {} if words is None else words
    lines = ["## Verdicts", ""]
    bar = {name: 2 * (value or 0.0) for name, value in noise.items()}  # twice the seed noise of each quantity

    def loss(size, arch):
        runs = groups.get((size, arch))
        return _mean([r["final"]["eval_loss"] for r in runs]) if runs else None

    sizes = [s.name for s in study_plan.STUDY.sizes]
    found, held, pending = [], [], []
    for size in sizes:
        reference = loss(size, "gpt2")
        for arch in ("aot-mssa", "aot-mhsa"):
            value = loss(size, arch)
            if reference is None or value is None:
                pending.append(f"{size} {LABELS[arch]} vs GPT-2 not finished yet")
                continue
            held.append(value - reference <= PAPER_GAP + bar["final"])
            found.append(f"{size} {LABELS[arch]} {value - reference:+.3f} ({verdict(held[-1:])})")
    word, note = provisional(held, pending)
    lines += [
        _claim("AoT comes close to GPT-2.", "close"),
        f"Rule: at each size, AoT's validation loss exceeds GPT-2's by at most the largest gap of the paper's Table 3 "
        f"(AoT-MSSA-L Base against GPT-2 Base, mean of its three losses: {PAPER_GAP:.2f} nats) plus twice the seed "
        "noise.",
        "",
        "Gaps to GPT-2: " + ("; ".join(found) if found else "not run yet") + f". **Verdict: {word}.**{note}",
        "",
    ]
    words["AoT close to GPT-2"] = word
    found, held, pending = [], [], []
    for size in sizes:
        mssa, mhsa = loss(size, "aot-mssa"), loss(size, "aot-mhsa")
        if mssa is None or mhsa is None:
            pending.append(f"{size} not finished yet")
        else:
            held.append(mhsa < mssa - bar["final"])
            found.append(f"{size}: MHSA − MSSA {mhsa - mssa:+.3f} ({verdict(held[-1:])})")
    word, note = provisional(held, pending)
    lines += [
        _claim("MHSA is closer to GPT-2 than MSSA.", "mhsa"),
        "",
        "Rule: MHSA's loss below MSSA's by more than twice the seed noise. "
        + ("; ".join(found) or "Not run yet")
        + f". **Verdict: {word}.**{note}",
        "",
    ]
    words["MHSA closer than MSSA"] = word
    found, faster, no_gain = [], [], []
    base = groups.get(("S", "aot-mssa"))
    for arch in ("aot-mssa-hybrid", "aot-mssa-full"):
        runs = groups.get(("S", arch))
        if not base or not runs:
            continue
        early = _first_eval(runs) - _first_eval(base)
        gains = {task: _mean_zero_shot(runs, task) - _mean_zero_shot(base, task) for task in ("ptb", "lambada")}
        faster.append(early < -bar["early"])
        better = [task for task, gain in gains.items() if gain < -bar[task]]
        no_gain.append(not better)
        found.append(
            f"{LABELS[arch]}: first evaluation {early:+.3f} ({'faster' if faster[-1] else 'not faster'}), PTB "
            f"{gains['ptb']:+.3f}, LAMBADA {gains['lambada']:+.3f} nats "
            f"({'better on ' + ', '.join(better) if better else 'no zero-shot gain'})"
        )
    lines += [
        _claim("MLPs speed up training but do not improve zero-shot (earlier version).", "mlp"),
        "",
        "Rule: faster if the first validation point (a tenth of the run) is lower than AoT-MSSA's by more than twice "
        f"that point's seed noise ({bar['early']:.3f}); a zero-shot gain if the PTB or LAMBADA loss is lower by more "
        f"than twice that task's seed noise ({bar['ptb']:.3f}, {bar['lambada']:.3f}). "
        + ("; ".join(found) or "Not run yet")
        + ". "
        + verdicts_of(("faster", faster), ("no zero-shot gain", no_gain)),
        "",
    ]
    words["MLPs speed up training"], words["MLPs bring no zero-shot gain"] = verdict(faster), verdict(no_gain)
    return lines + equal_parameters(groups, noise["final"])


def equal_parameters(groups, noise: float | None) -> list[str]:
    """Who is ahead at each size (the same non-embedding parameters and tokens), by how much, in seed noises."""
    lines = ["**Who is ahead at equal parameters.**", ""]
    for size in (s.name for s in study_plan.STUDY.sizes):
        losses = {a: _mean([r["final"]["eval_loss"] for r in groups[(size, a)]]) for a in study_plan.MAIN_ARCHS
                  if (size, a) in groups}  # fmt: skip
        if len(losses) < 2:
            continue
        ranked = sorted(losses, key=losses.get)
        behind = [
            f"{losses[a] - losses[ranked[0]]:.3f} over {LABELS[a]}"
            + (f" ({(losses[a] - losses[ranked[0]]) / noise:.0f}x the noise)" if noise else "")
            for a in ranked[1:]
        ]
        lines.append(f"- {size}: {LABELS[ranked[0]]} ahead, by " + ", ".join(behind) + ".")
    return lines + ([""] if len(lines) > 2 else ["Not run yet.", ""])


def _first_eval(runs: list[dict]) -> float:
    return _mean([r["curves"]["eval"][0][1] for r in runs])


def _mean_zero_shot(runs: list[dict], task: str) -> float:
    return _mean([_zero_shot(r, task, "loss") for r in runs])


def knn_pairs(groups, noise: dict[str, float | None], images: list[dict]):
    """KVT's claim on every dense / k-NN pair that has run, language (loss, lower is better) and vision (accuracy):
    `(found, faster, better)`, a sentence per pair and whether each pair was faster early and ended better."""
    early_bar, final_bar = 2 * (noise["early"] or 0.0), 2 * (noise["final"] or 0.0)
    found, faster, better = [], [], []
    for dense in ("aot-mssa", "gpt2"):
        twin, base = groups.get(("S", dense + "+knn")), groups.get(("S", dense))
        if twin and base:
            early = _first_eval(twin) - _first_eval(base)
            final = twin[0]["final"]["eval_loss"] - _mean([r["final"]["eval_loss"] for r in base])
            faster.append(early < -early_bar)
            better.append(final < -final_bar)
            found.append(
                f"{LABELS[dense]}: first evaluation {early:+.3f} ({'faster' if faster[-1] else 'not faster'}), "
                f"final {final:+.3f} nats ({'better' if better[-1] else 'not better'})"
            )
    by_arch = _by_arch(images)
    accuracy = {
        "final": lambda r: 100 * r["final"]["eval_accuracy"],
        "early": lambda r: 100 * r["curves"]["eval"][0][1],
    }
    vision_noise = {k: seed_noise({(a, a): runs for a, runs in by_arch.items()}, key=f) for k, f in accuracy.items()}
    for dense in ("vit", "aot-mssa"):
        twin, base = by_arch.get(dense + "+knn"), by_arch.get(dense)
        if twin and base:
            early = 100 * (_first_eval(twin) - _first_eval(base))
            final = 100 * (twin[0]["final"]["eval_accuracy"] - _mean([r["final"]["eval_accuracy"] for r in base]))
            faster.append(early > 2 * (vision_noise["early"] or 0.0))
            better.append(final > 2 * (vision_noise["final"] or 0.0))
            found.append(
                f"{LABELS[dense]} (CIFAR-10): first evaluation {early:+.1f} "
                f"({'faster' if faster[-1] else 'not faster'}), final {final:+.1f} points "
                f"({'better' if better[-1] else 'not better'})"
            )
    return found, faster, better


def knn_claims(records_dir: Path = RECORDS) -> dict[str, str]:
    """The study's verdicts on KVT's two claims, from the committed records (the miniature's report shows them)."""
    groups = _grouped(load_records(records_dir))
    _, faster, better = knn_pairs(groups, noises(groups), load_records(records_dir, "vision"))
    return {"faster early": verdict(faster), "ends better": verdict(better)}


def knn_verdict(groups, noise: dict[str, float | None], images: list[dict], words: dict | None = None) -> list[str]:
    """KVT's claim, with the rule and the verdicts of `knn_pairs` (collected in `words`)."""
    found, faster, better = knn_pairs(groups, noise, images)
    done = {r["run"] for r in [*images, *(r for runs in groups.values() for r in runs)]}
    planned = study_plan.schedule(study_plan.STUDY, study_plan.VISION)
    pending = [f"`{r.name}` not finished yet" for r in planned if r.arch.endswith("+knn") and r.name not in done]
    (early_word, note), (final_word, _) = provisional(faster, pending), provisional(better, pending)
    words = {} if words is None else words
    words["k-NN faster early"], words["k-NN ends better"] = early_word, final_word
    early_bar, final_bar = 2 * (noise["early"] or 0.0), 2 * (noise["final"] or 0.0)
    return [
        _claim("k-NN attention converges faster early and ends slightly better.", "knn"),
        "",
        "Rule: faster early if the k-NN twin's first validation point (a tenth of the run) beats its dense twin's by "
        f"more than twice that point's seed noise ({early_bar:.3f} nats); better if its final one does by more than "
        f"twice the final noise ({final_bar:.3f}); for CIFAR-10 the same in accuracy points. "
        + ("; ".join(found) or "Not run yet")
        + ". "
        + verdicts_of(("faster early", faster), ("ends better", better))
        + note
        + " This study decides KVT's claims for the package: the miniature's report "
        "(`benchmarks/replicate/REPORT.md`) states these verdicts, and the `knn-training` experiment's README defers "
        "to them.",
        "",
    ]


def vision_section(images: list[dict], words: dict[str, str] | None = None) -> list[str]:
    """CIFAR-10: the table and the verdict on AoT against ViT and CRATE, from the vision records present."""
    groups = _by_arch(images)
    lines = ["## Vision: CIFAR-10", ""]
    words = {} if words is None else words
    words["AoT close to ViT and CRATE"] = verdict([])
    if not groups:
        return lines + ["No vision run has finished yet.", ""]
    lines += [
        "| model | layers x width | parameters | non-embedding | val. accuracy | hours |",
        "|---|---|---|---|---|---|",
    ]
    for arch, runs in groups.items():
        first = runs[0]
        cells = [
            _label(arch, runs),
            f"{first['shape']['num_hidden_layers']} x {first['shape']['hidden_size']}",
            f"{first['parameters']['total'] / 1e6:.2f}M",
            f"{first['parameters']['non_embedding'] / 1e6:.2f}M",
            _fmt([100 * r["final"]["eval_accuracy"] for r in runs], 1),
            f"{_mean([r['wall_seconds'] for r in runs]) / 3600:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    floor = study_plan.VISION.vit_floor
    vit = {r["run"]: 100 * r["final"]["eval_accuracy"] for r in groups.get("vit", [])}
    short = ", ".join(f"`{run}` ({accuracy:.1f}%)" for run, accuracy in vit.items() if accuracy < floor)
    if vit:
        met = f"short of it: {short}." if short else "all finished ViT runs do."
        lines += ["", f"Every ViT run must reach {floor:.0f}% validation accuracy: {met}"]
    noise = seed_noise({(a, a): runs for a, runs in groups.items()}, key=lambda r: 100 * r["final"]["eval_accuracy"])
    source, sentence = CLAIMS["vision"]
    lines += ["", f"**AoT comes close to ViT and CRATE with far fewer parameters.** > {sentence} ({source}).", ""]
    found, close, pending = [], [], []
    for arch, (peer, gap) in PAPER_VISION_GAP.items():
        if arch not in groups or peer not in groups:
            pending.append(f"{LABELS[arch]} vs {LABELS[peer]} not finished yet")
        else:
            ours = _mean([100 * r["final"]["eval_accuracy"] for r in groups[arch]])
            theirs = _mean([100 * r["final"]["eval_accuracy"] for r in groups[peer]])
            share = groups[arch][0]["parameters"]["total"] / groups[peer][0]["parameters"]["total"]
            held = theirs - ours <= gap + 2 * (noise or 0.0) and share < 1
            close.append(held)
            found.append(
                f"{LABELS[arch]} {ours - theirs:+.1f} points vs {LABELS[peer]} at {share:.2f}x its parameters "
                f"({'held' if held else 'not held'})"
            )
    seeds = len(study_plan.VISION.seeds)
    few = [a for a in study_plan.VISION_ARCHS if 0 < len(groups.get(a, [])) < seeds]
    word, note = provisional(close, pending + [f"{LABELS[a]} on {len(groups[a])} of {seeds} seeds" for a in few])
    lines += [
        "Rule: AoT at most the paper's own gap behind (AoT-MSSA-V 7.8 points behind CRATE, AoT-MHSA-V 2.9 behind ViT) "
        "plus twice the seed noise, with fewer parameters. "
        + ("; ".join(found) or "Not run yet")
        + f". **Verdict: {word}.**{note}",
        "",
    ]
    words["AoT close to ViT and CRATE"] = word
    return lines


def compute_section(groups, noise: float | None) -> list[str]:
    """Which architecture is ahead at equal compute (fitted power laws, compared where their compute ranges meet)."""
    lines = ["## Loss against compute", ""]
    fits = {}
    for arch in study_plan.MAIN_ARCHS:
        points = [
            (r["flops"], r["final"]["eval_loss"]) for (size, a), runs in groups.items() if a == arch for r in runs
        ]
        if len({c for c, _ in points}) >= 2:
            fits[arch] = (power_law(points), min(c for c, _ in points), max(c for c, _ in points))
    if len(fits) < 2:
        return lines + ["Needs two sizes of at least two architectures: not run yet.", ""]
    low = max(f[1] for f in fits.values())
    high = min(f[2] for f in fits.values())
    at = math.sqrt(low * high)
    predicted = {arch: fit[0][0] * at ** -fit[0][1] for arch, fit in fits.items()}
    best = min(predicted, key=predicted.get)
    ranked = sorted(predicted.items(), key=lambda item: item[1])
    noise_text = f" (seed noise {noise:.3f})" if noise is not None else " (seed noise not measured yet)"
    lines.append(
        f"Fitted loss = a · C^(−b) per architecture; at {at:.3g} FLOPs (the middle of the range all of them cover): "
        + ", ".join(f"{LABELS[a]} {v:.3f} (b = {fits[a][0][1]:.3f})" for a, v in ranked)
        + f". Ahead at equal compute: {LABELS[best]}, by "
        + ", ".join(f"{v - predicted[best]:.3f} nats over {LABELS[a]}" for a, v in ranked[1:])
        + f"{noise_text}."
    )
    return lines + [""]
