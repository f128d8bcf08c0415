"""Section 4 of the report: forward FLOPs, time and memory beside GPT-2's (the paper's table; no claim tested)."""

from __future__ import annotations

from .stats import millions, ratio_or_nan


def compute_section(compute: dict, plan: dict, lines: list[str], verdicts: list) -> None:
    """Append section 4 (FLOPs, time and memory beside GPT-2 and the paper's table) to `lines` and `verdicts`."""
    cp = plan["compute"]
    full, scaled = compute["full_size"], compute["scaled"]
    lines += [
        f"## 4. Compute at batch {cp['batch_size']} x {cp['sequence_length']} tokens",
        "",
        "**Claim (AoT paper, earlier version, App. B.0.3, Table 3): none to test.** The paper only presents the "
        'table ("we present the computing resources of a forward pass used by AoT-based language models and GPT-2 '
        'empirically in Table 3", `aot-earlier-version.txt` line 811) and draws no conclusion from it, so this '
        "section reports numbers and gives no verdict. The paper's numbers (GPU) are quoted below beside ours.",
        "",
        "**Setup.** GFLOPs of the full-size models with `torch.utils.flop_counter.FlopCounterMode` (by depth "
        "extrapolation of 1- and 2-layer copies, exact for these stacks; attention counted as a full T x T "
        "product, as torch does, although causal SDPA skips half). Time and peak memory on this CPU of copies "
        f"scaled to 1/{cp['depth_divisor']} of the depth and 1/{cp['width_divisor']} of the width (head count kept, "
        "GPT-2 vocabulary kept), fp32, `inference_mode`: time = best of interleaved forwards of all models in one "
        "process; peak memory = growth of the peak RSS over one forward in a fresh process per model (it includes "
        f"the {cp['batch_size']} x {cp['sequence_length']} x 50,257 logits).",
        "",
        "| model | layers x width | params (no pos.) | GFLOPs / forward | of which LM head | scaled shape | "
        "GFLOPs (scaled) | s / forward (scaled) | peak MB (scaled) | GFLOP/s achieved | time in matmuls / "
        "attention (profiler) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    profiled = all("profiler_matmul_gflops" in s for s in scaled.values())
    # What the profiler cannot attribute (it has no attention formula) is exactly the attention's share of the count.
    attention_gflops = [s["gflops"] - s["profiler_matmul_gflops"] for s in scaled.values()] if profiled else []
    for name, row in full.items():
        s = scaled[name]
        shares = f"{100 * s['matmul_time_share']:.0f}% / {100 * s['attention_time_share']:.0f}%" if profiled else "n/a"
        lines.append(
            f"| {name} | {row['layers']} x {row['width']} | {millions(row['parameters_without_positions'])} | "
            f"{row['gflops']:,.0f} | {row['lm_head_gflops']:,.0f} | {s['layers']} x {s['width']} | "
            f"{s['gflops']:,.0f} | "
            f"{s['seconds_per_forward']:.2f} | {s['peak_extra_mb']:,.0f} | "
            f"{s['gflops'] / s['seconds_per_forward']:.1f} | {shares} |"
        )
    if profiled:
        matmul_gflops = ", ".join(f"{s['profiler_matmul_gflops']:,.0f}" for s in scaled.values())
        lines += [
            "",
            "Cross-check with `torch.profiler` (`with_flops=True`, one forward of each scaled copy): it attributes "
            f"{matmul_gflops} GFLOPs to matmuls (rows in table order); it has no formula for the attention kernel, "
            "whose share is the rest of the counter's total "
            f"({min(attention_gflops):,.1f}–{max(attention_gflops):,.1f} GFLOPs, exactly the attention formula — "
            "`tests/test_replicate.py` checks the identity). The last column is the profiler's split of the "
            "forward's self CPU time.",
        ]
    lines += ["", "![compute](compute.png)", ""]
    # The paper's own numbers beside ours (issue 16): the table and the disagreement, from compute.PAPER_TABLE.
    from ..compute import paper_comparison_lines

    lines += [*paper_comparison_lines(full, cp["batch_size"], cp["sequence_length"]), ""]
    pairs = [
        ("AoT-MSSA-L Base", "GPT-2 Base"),
        ("AoT-MHSA-L Base", "GPT-2 Base"),
        ("AoT-MSSA-L Medium", "GPT-2 Medium"),
    ]
    parts = []
    for aot, gpt in pairs:
        if aot not in full or gpt not in full:
            continue
        flops = full[aot]["gflops"] / full[gpt]["gflops"]
        seconds = scaled[aot]["seconds_per_forward"] / scaled[gpt]["seconds_per_forward"]
        memory = ratio_or_nan(scaled[aot]["peak_extra_mb"], scaled[gpt]["peak_extra_mb"])
        params = full[aot]["parameters_without_positions"] / full[gpt]["parameters_without_positions"]
        parts.append(
            f"{aot} / {gpt}: {params:.2f}x parameters, {flops:.2f}x GFLOPs, {seconds:.2f}x time, {memory:.2f}x memory"
        )
    if parts:
        verdict = (
            "No claim to test. " + "; ".join(parts) + ". Time and memory come from the scaled copies on this "
            "CPU, whose cost is dominated by the unscaled 50,257-way LM head (compare their GFLOPs column), so the "
            "time ratios need not follow the full-size FLOP ratios; peak memory is dominated by the logits, which "
            "all models share."
        )
        if profiled:
            share = {
                family: [s["attention_time_share"] for n, s in scaled.items() if n.startswith(family)]
                for family in ("GPT-2", "AoT")
            }

            def seconds(kind: str) -> float:
                return sum(s[f"{kind}_time_share"] * s["seconds_per_forward"] for s in scaled.values())

            rates = {
                "matmul": sum(s["profiler_matmul_gflops"] for s in scaled.values()) / seconds("matmul"),
                "attention": sum(attention_gflops) / seconds("attention"),
            }
            verdict += (
                " Where AoT's time goes beyond its FLOPs: CPU attention runs at "
                f"{rates['attention']:.0f} GFLOP/s (counted as a full T x T product) against {rates['matmul']:.0f} "
                "for the matmuls (all scaled copies together), and the profiler puts "
                f"{100 * min(share['AoT']):.0f}–{100 * max(share['AoT']):.0f}% of AoT's forward "
                f"time in attention against {100 * min(share['GPT-2']):.0f}–{100 * max(share['GPT-2']):.0f}% of "
                "GPT-2's (AoT is deeper, so it has more attention per parameter)."
            )
        lines += [f"**Numbers.** {verdict}", ""]
        verdicts.append(
            ("AoT's forward cost beside GPT-2's (the paper's table; no claim tested)", "reported", parts[0])
        )
