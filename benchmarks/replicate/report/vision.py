"""Section 2 of the report: image classification against ViT at the same depth and width."""

from __future__ import annotations

from aot_transformers.experiments.study import close

from .stats import by_row, fmt, millions, noise_level, summarise, verdict_status

# Accuracies are judged by the experiments README's one rule for "close" (`close`: within a factor 2), applied to the
# accuracy above chance.
CHANCE_ACCURACY = 10.0  # percent: CIFAR-10's ten classes


def vision_section(vision: dict, plan: dict, lines: list[str], verdicts: list) -> None:
    """Append section 2 (table, figure, verdict against ViT) to `lines` and `verdicts`."""
    grouped = by_row(vision["runs"])
    vp = plan["vision"]
    main_rows = [n for n, runs in grouped.items() if not runs[0]["knn"] and len(runs) > 1]
    noise = 100 * noise_level(grouped, "eval_accuracy", main_rows)
    step_seconds = vision.get("step_seconds", {})
    lines += [
        "## 2. Image classification",
        "",
        "**Claim (AoT paper).** On image classification the attention-only AoT (MSSA) comes close to ViT and CRATE "
        "of the same depth and width with about half (or fewer) of their parameters.",
        "",
        f"**Setup.** {vision['data']['description']}: {vision['data']['train_images']:,} training images drawn "
        "from the 45,000 left after holding out a stratified 10% validation split, of which "
        f"{vision['data']['eval_images']:,} images are used for every "
        f"curve point and the final number; 32 px, patch {vp['patch_size']} ({(32 // vp['patch_size']) ** 2 + 1} "
        f"tokens with CLS); random crop (padding 4) + horizontal flip; batch {vp['batch_size']}, "
        f"{vp['max_steps']} steps = {vp['max_steps'] * vp['batch_size']:,} images "
        f"({vp['max_steps'] * vp['batch_size'] / vision['data']['train_images']:.2f} epochs); AdamW (lr "
        f"{vp['learning_rate']}, weight decay {vp['weight_decay']}), cosine, {vp['warmup_ratio']:.0%} warm-up. "
        "Every model has the same depth and width (the paper's AoT-V-Base has ViT-Base's shape); ViT is "
        "transformers' `ViTForImageClassification` with MLP ratio 4.",
        "",
        "| model | params | val. accuracy (%) | val. loss | train images/s |",
        "|---|---|---|---|---|",
    ]
    for name, runs in grouped.items():
        if runs[0]["knn"]:
            continue
        seconds = step_seconds.get(name)
        lines.append(
            f"| {runs[0]['label']} | {millions(runs[0]['parameters']['total'])} | "
            f"{fmt(summarise([r['eval_accuracy'] for r in runs]), 1, 100.0)} | "
            f"{fmt(summarise([r['eval_loss'] for r in runs]))} | "
            f"{vp['batch_size'] / seconds:,.0f} |"
            if seconds
            else f"| {runs[0]['label']} | {millions(runs[0]['parameters']['total'])} | "
            f"{fmt(summarise([r['eval_accuracy'] for r in runs]), 1, 100.0)} | "
            f"{fmt(summarise([r['eval_loss'] for r in runs]))} | n/a |"
        )
    lines += ["", "![vision curves](vision_curves.png)", ""]
    if "vit" not in grouped or "aot-mssa" not in grouped:
        return
    vit = summarise([r["eval_accuracy"] for r in grouped["vit"]])["mean"] * 100
    vit_params = grouped["vit"][0]["parameters"]["total"]
    parts, held = [], []
    for name in ("aot-mssa", "aot-mssa-noln", "aot-mhsa"):
        if name not in grouped:
            continue
        acc = summarise([r["eval_accuracy"] for r in grouped[name]])["mean"] * 100
        ratio = grouped[name][0]["parameters"]["total"] / vit_params
        gap = acc - vit
        if name == "aot-mssa":
            held.append(close(acc - CHANCE_ACCURACY, vit - CHANCE_ACCURACY))
        parts.append(f"{grouped[name][0]['label'].split(' (')[0]}: {gap:+.1f} points at {ratio:.2f}x ViT's parameters")
    status = verdict_status(held)
    verdict = (
        f"{status.capitalize()} at this scale (rule: AoT-MSSA's accuracy above chance ({CHANCE_ACCURACY:.0f}%) "
        "within a factor 2 of ViT's, the one rule for 'close' of the experiments README; seed noise "
        f"{noise:.1f} points). Against ViT ({vit:.1f}%): " + "; ".join(parts) + "."
    )
    lines += [f"**Verdict.** {verdict}", ""]
    verdicts.append(
        ("AoT comes close to ViT on images with far fewer parameters", status, f"vs ViT {vit:.1f}%: {parts[0]}")
    )
