"""REPORT.md and its figures from the collected results: for each comparison the paper's claim, our numbers
(mean and spread over seeds) and a verdict computed by a stated rule, so that rerunning regenerates the same text.

The page itself (header, summary of verdicts, noise, limitations) is here; each section's tables and verdict rule are
in its own module (`language`, `vision`, `knn`, `compute`), the statistics in `stats` and the figures in `figures`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .compute import compute_section
from .figures import plot_compute, plot_knn, plot_language, plot_vision
from .knn import knn_section
from .language import ABLATIONS, language_section
from .stats import by_row, section_invocations, summarise
from .vision import vision_section

__all__ = ["ABLATIONS", "render_report", "section_invocations"]


def render_report(results: dict[str, Any], report_dir: Path) -> Path:
    """Write REPORT.md and its PNGs into `report_dir`; return the report's path."""
    report_dir.mkdir(parents=True, exist_ok=True)
    plan, sections = results["plan"], results["sections"]
    language, vision, compute = results.get("language"), results.get("vision"), results.get("compute")
    body: list[str] = []
    verdicts: list[tuple[str, str]] = []
    if language:
        plot_language(language, report_dir / "language_curves.png")
        language_section(language, plan, body, verdicts)
    if vision:
        plot_vision(vision, report_dir / "vision_curves.png")
        vision_section(vision, plan, body, verdicts)
    if language or vision:
        plot_knn(language, vision, report_dir / "knn_curves.png")
        knn_section(language, vision, plan, body, verdicts, results.get("at_scale"))
    if compute:
        plot_compute(compute, report_dir / "compute.png")
        compute_section(compute, plan, body, verdicts)

    budget = "smoke" if plan["smoke"] else f"--budget {plan['budget']:g}"
    default = "the default" if not plan["smoke"] and plan["budget"] == 1 else "not the default budget 1"
    machine = results.get("machine", {})
    invocations = {name: section_invocations(meta) for name, meta in sections.items()}
    loads = [
        float(value)
        for runs in invocations.values()
        for run in runs
        for value in run["load"].split(" -> ")
        if value.replace(".", "", 1).isdigit()
    ]
    threads = machine.get("threads")
    per_section = results.get("threads", {})
    if len(set(per_section.values())) > 1:  # sections measured with different thread counts: say which
        threads = ", ".join(f"{count} ({name})" for name, count in per_section.items())
    quiet = bool(loads) and isinstance(threads, int) and max(loads) <= threads + 0.5
    load_note = (
        f"The load average stayed at {min(loads):.1f}–{max(loads):.1f} (the benchmark itself keeps {threads} "
        "threads busy), so the machine was otherwise idle; still, ratios measured side by side are the "
        "meaningful part of any timing."
        if quiet
        else "The machine was shared with other jobs (see the load averages), so wall-clock numbers are "
        "pessimistic and noisy; ratios measured side by side are the meaningful part."
    )
    head = [
        "# Small-scale replication of the papers' comparisons",
        "",
        f"**These numbers come from {budget} ({default})**, seeds {', '.join(map(str, plan['seeds']))} for the "
        f"main rows, on {machine.get('cpu', '?')} with {threads or '?'} torch threads (torch "
        f"{machine.get('torch', '?')}). {load_note}",
        "",
        "| section | command | finished (UTC) | wall-clock | load average (start -> end) |",
        "|---|---|---|---|---|",
    ]
    for name, runs in invocations.items():
        commands = " + ".join(dict.fromkeys(f"`{run['command']}`" for run in runs))
        minutes = sum(run["minutes"] for run in runs)
        spread = f" over {len(runs)} invocations" if len(runs) > 1 else ""
        load = "; ".join(run["load"] for run in runs)
        head.append(f"| {name} | {commands} | {runs[-1]['date']} | {minutes:.0f} min{spread} | {load} |")
    head += [
        "",
        "Regenerate with the commands in [README.md](README.md). Every run's record (losses, accuracies, curves, "
        "zero-shot scores, timings) is committed under `benchmarks/results/replicate/<section>-<settings hash>/` "
        "the moment it finishes, so an interrupted run resumes, sections can run in separate invocations, and "
        "`python -m benchmarks.replicate --only report` redraws this report from the committed records alone.",
        "",
    ]
    missing = [name for name in ("language", "vision", "compute") if name not in sections]
    if missing:
        head += [
            f"**Not run at these settings: {', '.join(missing)}** — no committed record, so this report has no "
            "section, verdict or number for it.",
            "",
        ]
    head += [
        "Everything here is a miniature: models of a few million parameters (mostly the GPT-2 embedding) trained "
        "for minutes on a CPU. The verdicts say whether a claim *held at this scale*, by the rule stated under "
        "each; they do not confirm or refute the papers at theirs. Where a claim says *close*, the rule is the one "
        "stated once in the [experiments README](../results/experiments/README.md#verdicts) "
        "(within a factor 2), except the language loss rule, stated under its section.",
        "",
        "## Summary",
        "",
        "| claim | at this scale | key numbers |",
        "|---|---|---|",
    ]
    head += [f"| {claim} | **{status}** | {numbers} |" for claim, status, numbers in verdicts]
    head += [""]
    noise = _noise_section(language, vision)
    text = "\n".join(head + body + noise + _limitations(plan, language, vision)) + "\n"
    path = report_dir / "REPORT.md"
    path.write_text(text)
    return path


def _noise_section(language, vision) -> list[str]:
    lines = ["## Noise", ""]
    for section, key, unit, scale, digits in (
        (language, "eval_loss", "nats of validation loss", 1.0, 3),
        (vision, "eval_accuracy", "accuracy points", 100.0, 1),
    ):
        if section is None:
            continue
        grouped = by_row(section["runs"])
        for _name, runs in grouped.items():
            if len(runs) > 1:
                stats = summarise([r[key] for r in runs])
                lines.append(
                    f"- {runs[0]['label']}: seeds {', '.join(str(r['seed']) for r in runs)} give "
                    f"{', '.join(f'{r[key] * scale:.{digits}f}' for r in runs)} — half-range "
                    f"{stats['spread'] * scale:.{digits}f} {unit}."
                )
    reruns = [
        (section["rerun"], unit, scale, digits)
        for section, unit, scale, digits in (
            (language, "nats", 1.0, 3),
            (vision, "points", 100.0, 1),
        )
        if section is not None and section.get("rerun")
    ]
    if reruns:
        lines += ["", "Rerun from scratch (same seed, fresh model and Trainer) — measured, not assumed:", ""]
        for check, unit, scale, digits in reruns:
            first, again = check["first"] * scale, check["rerun"] * scale
            lines.append(
                f"- {check['run']}: {check['metric']} {first:.{digits + 3}f} then {again:.{digits + 3}f} "
                f"(difference {abs(first - again):.{digits + 3}f} {unit})."
            )
    lines += [
        "",
        "Seeds fix the initial weights, the data order and the augmentation, so a rerun with the same budget on the "
        "same software reproduces the training numbers up to floating-point nondeterminism of threaded CPU "
        "kernels (the rerun above); different seeds differ by the half-ranges above, which is the noise the "
        "verdicts use. Timings are less reproducible than the training numbers: even best-of-rounds and "
        "interleaved, a time ratio can move by tens of percent between invocations on the same idle machine "
        "(more on a shared one), so read them as rough.",
        "",
    ]
    return lines


def _limitations(plan, language, vision) -> list[str]:
    lp, vp = plan["language"], plan["vision"]
    tokens = lp["max_steps"] * lp["batch_size"] * lp["block_size"]
    images = vp["max_steps"] * vp["batch_size"]
    scale = " and ".join(
        [f"{tokens:,} training tokens per language run"] * bool(language)
        + [f"{images:,} images per vision run (a fraction of one CIFAR-10 epoch)"] * bool(vision)
    )
    lines = ["## Limitations", ""]
    if scale:
        lines.append(
            f"- Scale: {scale}; the papers train for billions of tokens / hundreds of epochs. Early-training "
            "behaviour dominates everything here, and deep narrow AoT stacks may simply need more steps than a "
            "shallow GPT-2."
        )
    if language:
        lines += [
            "- With GPT-2's 50,257-token vocabulary at width ~100, the embedding is most of every LM's parameters "
            "and the LM head most of its compute; 'equal parameters' therefore means equal embedding plus equal "
            "non-embedding weights.",
            "- Zero-shot data: only the local dev files (PTB validation start, 100 LAMBADA passages); no WikiText, "
            "no CBT.",
        ]
    lines += [
        "- One learning rate for all rows, not tuned per model (as in a fixed-recipe comparison).",
        "- k-NN rows" + (" and the MLP ablations" if language else "") + " ran with one seed.",
        "",
    ]
    return lines
