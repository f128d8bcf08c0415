"""Section 3 of the report: every row again with k-NN attention (k = n/2), paired with its dense twin."""

from __future__ import annotations

import math

from .stats import by_row, noise_level, paired_curves, paired_means


def knn_section(language, vision, plan, lines, verdicts, at_scale: dict[str, str] | None = None) -> None:
    """Append section 3 (each dense row against its k-NN twin, early and final) to `lines` and `verdicts`; where
    `at_scale` (the study's verdicts, `benchmarks.study.report.knn_claims`) has decided a claim, it is the verdict."""
    lines += [
        "## 3. k-NN attention (k = n/2)",
        "",
        "**Claim (KVT paper).** Keeping only the top-k attention scores per query (k around half the keys) makes "
        "training converge faster early on and slightly improves final accuracy, at little extra cost.",
        "",
        "**Setup.** Every model above again with `knn_k = 0.5` (each query keeps the best half of the keys it may "
        "see; causal queries half of their prefix), first seed only, otherwise identical: same initial weights, "
        "same data order, so dense vs k-NN is a paired comparison. transformers' GPT-2 and ViT run the package's "
        "k-NN kernel through transformers' attention registry. Early = the first evaluation point "
        "(after 1/{} of the steps).".format(plan["language"]["evaluations"]),
        "",
        "| model | metric | dense | k-NN | Δ final | Δ early | s/step dense | s/step k-NN | time ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    early_better, final_better, total, ratios = 0, 0, 0, []
    beyond_noise = {"early": 0, "final": 0}
    per_section = []
    for section, metric, key, higher_better, scale in (
        (language, "val. loss", "eval_loss", False, 1.0),
        (vision, "val. acc. (%)", "eval_accuracy", True, 100.0),
    ):
        if section is None:
            continue
        grouped = by_row(section["runs"])
        step_seconds = section.get("step_seconds", {})
        main_rows = [n for n, r in grouped.items() if not r[0]["knn"] and len(r) > 1]
        noise = noise_level(grouped, key, main_rows) * scale
        counts = [early_better, final_better, total]
        for name, runs in grouped.items():
            twin = f"{name}+knn"
            if runs[0]["knn"] or twin not in grouped:
                continue
            pair = paired_means(grouped, name, twin, key)
            curves = paired_curves(grouped, name, twin, "eval")
            if pair is None or curves is None:
                continue
            dense, knn = pair
            sign = 1 if higher_better else -1
            final_delta = (knn - dense) * scale
            early_delta = (curves[1][0][1] - curves[0][0][1]) * scale
            total += 1
            early_better += sign * early_delta > 0
            final_better += sign * final_delta > 0
            beyond_noise["early"] += sign * early_delta > noise
            beyond_noise["final"] += sign * final_delta > noise
            t_dense, t_knn = step_seconds.get(name), step_seconds.get(twin)
            ratio = t_knn / t_dense if t_dense and t_knn else math.nan
            if not math.isnan(ratio):
                ratios.append(ratio)
            digits = 3 if not higher_better else 1
            lines.append(
                f"| {runs[0]['label'].split(' (')[0]} | {metric} | {dense * scale:.{digits}f} | "
                f"{knn * scale:.{digits}f} "
                f"| {final_delta:+.{digits}f} | {early_delta:+.{digits}f} | "
                f"{t_dense or math.nan:.3f} | {t_knn or math.nan:.3f} | {ratio:.2f}x |"
            )
        if total > counts[2]:
            per_section.append(
                f"{'language' if section is language else 'vision'}: early {early_better - counts[0]}/"
                f"{total - counts[2]}, final {final_better - counts[1]}/{total - counts[2]}"
            )
    lines += [
        "",
        "Δ = k-NN − dense (lower loss / higher accuracy is better).",
        "",
        "![k-NN curves](knn_curves.png)",
        "",
    ]
    if total:
        cost = f"k-NN steps took {min(ratios):.2f}x..{max(ratios):.2f}x the dense time" if ratios else "n/a"
        early = (
            f"ahead at the first evaluation in {early_better} of {total} models "
            f"({beyond_noise['early']} by more than the seed noise)"
        )
        final = f"ended better in {final_better} of {total} models ({beyond_noise['final']} by more than the noise)"
        early_status, final_status = _majority(early_better, total), _majority(final_better, total)
        lines += [
            f"**Verdict.** Faster early: {early_status} — k-NN was {early}. Better final: {final_status} — k-NN "
            f"{final}. (Rule: held when k-NN is ahead in more than two thirds of the models, did not hold below "
            "one third, mixed in between. One seed per k-NN row; the noise is the seed half-range of the dense "
            f"main rows, larger than the paired noise.) Cost: {cost} (the package's exact top-k kernel against "
            "fused dense SDPA, on CPU).",
            "",
        ]
        split = f" — {'; '.join(per_section)}" if len(per_section) > 1 else ""
        at_scale = at_scale or {"faster early": "not run yet", "ends better": "not run yet"}
        for claim, key, status, detail in (
            ("k-NN attention trains faster early", "faster early", early_status, f"k-NN {early}{split}"),
            ("k-NN attention slightly improves the final metric", "ends better", final_status, f"k-NN {final}"),
        ):
            if at_scale[key] != "not run yet":
                status, detail = (
                    at_scale[key],
                    f"decided by the study at scale (`benchmarks/study/REPORT.md`); here {detail}",
                )
            verdicts.append((claim, status, detail))
        if any(value != "not run yet" for value in at_scale.values()):
            lines += [
                f"**At scale.** The study on Gutenberg and CIFAR-10 (`benchmarks/study/REPORT.md`) decides these "
                f"claims for the package: faster early {at_scale['faster early']}, ends better "
                f"{at_scale['ends better']}. The summary above states its verdicts.",
                "",
            ]
        verdicts.append(("k-NN wall-clock per training step (measured, no claim tested)", "reported", cost))


def _majority(count: int, total: int) -> str:
    return "held" if 3 * count > 2 * total else "did not hold" if 3 * count < total else "mixed"
