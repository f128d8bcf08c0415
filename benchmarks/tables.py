"""The READMEs' tables, each rendered from its committed results file (`render.render` puts them in place).

One function per table, named in `TABLES`. Targets are the goals each benchmark was set; ✓ / ✗ is computed here
from the record, never typed. Settings (shapes, batch sizes) come from the benchmark modules' own constants.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

from .render import BENCHMARKS, load

# The goals the benchmarks were set: (at least | at most, value).
TARGETS = {
    "lm_same_shape": ("≥", 3.5),
    "lm_equal_params": ("≥", 0.8),
    "lm_compiled": ("≥", 0.9),
    "bf16": ("≥", 1.3),
    "vision_same_shape": ("≥", 3.5),
    "vision_equal_params": ("≥", 0.75),
    "cache_bytes": ("≤", 0.5),
    "cache_speedup": ("≥", 5.0),
    "decode_vs_gpt2": ("≥", 1.3),
    "static_compile": ("≥", 1.5),
    "knn_rss_vs_kvt": ("≤", 0.1),
    "knn_doubling": ("≤", 2.2),
    "knn_time_k32": ("≤", 2.0),
    "knn_time_k_half": ("≤", 2.5),
    "unit_lines": ("≤", 1000),
    "tokenize_ratio": ("≥", 0.8),
    "prepare_peak_gb": ("≤", 3.0),
    "cold_start_s": ("≤", 240.0),
    "warm_start_s": ("≤", 15.0),
    "cifar10_accuracy": ("≥", 0.60),
}


def record(name: str) -> dict:
    """The committed results file `name`, relative to benchmarks/."""
    return load(BENCHMARKS / name)


def x(value: float, digits: int = 2) -> str:
    """A ratio: `1.23×`."""
    return f"{value:.{digits}f}×"


def n(value: float, digits: int = 0) -> str:
    """A number with thousands separators."""
    return f"{value:,.{digits}f}"


def target(name: str, value: float, unit: str = "×") -> str:
    """The target `name` with ✓ when `value` meets it, ✗ when not."""
    sense, goal = TARGETS[name]
    met = value >= goal if sense == "≥" else value <= goal
    return f"{sense} {goal:,g}{unit} {'✓' if met else '✗'}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def source(name: str) -> str:
    """The line under a table naming its results file and the command that regenerates it."""
    return f"From `{name}`, written by `{record(name)['command']}`."


def blocks(*parts: str) -> str:
    """Markdown blocks (a table, notes, its sources) separated by blank lines."""
    return "\n\n".join(parts)


def _layers(key: str) -> str:
    return key.rsplit("-", 1)[-1]


# --- model package: training step, profile, attention kernel -----------------------------------------------------


def bf16_row(tokens: dict, ratios: dict, probe: dict) -> list[str]:
    """bench_train's bf16 row, or why it did not run (without native bf16 matmuls it would time torch's emulation)."""
    label = (
        f"LM, bf16 autocast vs fp32: AoT {_layers('aot-6')} / {_layers('aot-36')} layers (a bf16 matmul took "
        f"{x(probe['bf16_over_fp32_time'])} the fp32 time; native bf16: {'yes' if probe['native_bf16'] else 'no'})"
    )
    if "bf16_vs_fp32 (aot-6)" not in ratios:
        return [label, "not run: this CPU emulates bf16 matmuls", "—", "—"]
    bf16_6, bf16_36 = ratios["bf16_vs_fp32 (aot-6)"], ratios["bf16_vs_fp32 (aot-36)"]
    return [
        label,
        f"{n(tokens['aot-6-bf16'])} vs {n(tokens['aot-6'])} / {n(tokens['aot-36-bf16'])} vs {n(tokens['aot-36'])}",
        f"{x(bf16_6)} / {x(bf16_36)}",
        target("bf16", min(bf16_6, bf16_36)),
    ]


def train() -> str:
    """bench_train: one training step of AoT against GPT-2 and ViT, at the peer's shape and at equal parameters."""
    from . import bench_train

    r = record("results/train.json")
    tokens, images, ratios = r["lm_tokens_per_s"], r["vision_images_per_s"], r["lm_ratios"]
    compiled, bound = r["lm_compiled_tokens_per_s"], record("results/profile_step.json")["equal_rate_ratio"]
    vit = inspect.signature(bench_train.vit).parameters
    image = inspect.signature(bench_train.image_step).parameters["batch"].default
    lm_shape = (
        f"d {bench_train.WIDTH}, {bench_train.HEADS} heads, seq {bench_train.SEQ}, batch {bench_train.BATCH}, "
        f"vocab {bench_train.VOCAB}"
    )
    vision_shape = f"width {vit['width'].default}, {vit['heads'].default} heads, batch {image}"
    same, equal = r["lm_ratios"]["same_width_depth (aot-6 / gpt2-6)"], ratios["equal_params (aot-36 / gpt2-6)"]
    compiled_ratios = r["lm_compiled_ratios"]
    c_ratio = compiled_ratios["equal_params compiled (aot-36c / gpt2-6c)"]
    c_eager = compiled_ratios["equal_params compiled vs eager GPT-2 (aot-36c / gpt2-6)"]
    probe = r["bf16_matmul_probe"]
    v_same = r["vision_ratios"]["same_width_depth (aot-v-6 / vit-6)"]
    v_equal = r["vision_ratios"]["equal_params (aot-v-36 / vit-6)"]
    lm_params, vision_params = r["lm_params"], r["vision_params"]
    rows = [
        [
            f"LM, same width and depth ({_layers('gpt2-6')} layers; {lm_shape}): AoT-MSSA vs GPT-2, tokens/s",
            f"{n(tokens['aot-6'])} vs {n(tokens['gpt2-6'])}",
            f"**{x(same)}**",
            target("lm_same_shape", same),
        ],
        [
            f"LM, equal parameters (AoT {_layers('aot-36')} layers, {lm_params['aot-36'] / 1e6:.2f}M vs "
            f"{lm_params['gpt2-6'] / 1e6:.2f}M)",
            f"{n(tokens['aot-36'])} vs {n(tokens['gpt2-6'])}",
            x(equal),
            f"{target('lm_equal_params', equal)} (equal-FLOP-rate bound {x(bound['lm'])})",
        ],
        [
            "same, both under `torch.compile`",
            f"{n(compiled['aot-36-compiled'])} vs {n(compiled['gpt2-6-compiled'])}; compiled AoT vs eager GPT-2 "
            f"{x(c_eager)}",
            x(c_ratio),
            target("lm_compiled", c_ratio),
        ],
        bf16_row(tokens, ratios, probe),
        [
            f"vision, same width and depth ({_layers('vit-6')} layers; {vision_shape}): AoT-MSSA vs ViT, images/s",
            f"{n(images['aot-v-6'])} vs {n(images['vit-6'])}",
            f"**{x(v_same)}**",
            target("vision_same_shape", v_same),
        ],
        [
            f"vision, equal parameters (AoT {_layers('aot-v-36')} layers, {vision_params['aot-v-36'] / 1e6:.2f}M vs "
            f"{vision_params['vit-6'] / 1e6:.2f}M)",
            f"{n(images['aot-v-36'])} vs {n(images['vit-6'])}",
            x(v_equal),
            f"{target('vision_equal_params', v_equal)} (equal-FLOP-rate bound {x(bound['vision'])})",
        ],
    ]
    threads = r["host"]["threads"]
    header = [
        f"comparison (fp32 unless said, {threads} threads, forward + backward + AdamW)",
        "AoT vs peer",
        "ratio",
        "target",
    ]
    return blocks(table(header, rows), source("results/train.json"))


def profile_step() -> str:
    """profile_step: FLOPs and self CPU seconds per step by kind of work, and the equal-FLOP-rate bounds."""
    r = record("results/profile_step.json")
    params = {**record("results/train.json")["lm_params"], **record("results/train.json")["vision_params"]}
    names = {"gpt2-6": "GPT-2", "aot-36": "AoT-MSSA", "vit-6": "ViT", "aot-v-36": "AoT-MSSA (vision)"}
    rows = []
    for key, seconds in r["seconds_per_step"].items():
        flops = r["gflops_per_step"][key]
        attention = f"**{seconds['attention']:.2f}**" if key.startswith("aot") else f"{seconds['attention']:.2f}"
        rows.append(
            [
                f"{names[key]}, {_layers(key)} layers ({params[key] / 1e6:.2f}M)",
                f"{flops['matmul']:.1f} / {flops['attention']:.1f}",
                f"{seconds['matmul']:.2f}",
                attention,
                f"{seconds['layer_norm']:.2f}",
                f"{seconds['optimizer']:.2f}",
                f"{seconds['other']:.2f}",
                f"{seconds['total']:.2f}",
            ]
        )
    header = ["model", "GFLOP: weights / attention", "weight matmuls", "attention", "LayerNorm", "optimizer"]
    bound = r["equal_rate_ratio"]
    note = (
        f"At equal FLOP rates AoT would reach {x(bound['lm'])} GPT-2's tokens/s and {x(bound['vision'])} ViT's "
        f"images/s (self CPU seconds per step at {r['threads']} threads)."
    )
    return blocks(table([*header, "everything else", "total"], rows), note, source("results/profile_step.json"))


def attention() -> str:
    """bench_attention: MSSA's shared-projection kernel against SDPA by length, and where the backend uses it."""
    from . import bench_attention

    r = record("results/attention.json")
    shapes = {name: (batch, heads, dim, causal) for name, batch, heads, dim, causal, _ in bench_attention.SHAPES}
    rows = []
    for kind, runs in r["threads_2"].items():
        batch, heads, dim, causal = shapes[kind]
        label = f"{'causal' if causal else 'bidirectional'}, B {batch}, {heads} × {dim} heads"
        for two, one in zip(runs, r["threads_1"][kind], strict=True):
            saved = two["saved_mb"]
            rows.append(
                [
                    label,
                    str(two["length"]),
                    x(two["speedup"]),
                    x(one["speedup"]),
                    f"{saved['shared']:.1f} vs {saved['sdpa']:.1f}",
                    "yes" if two["kernel_used"] else "no (SDPA)",
                ]
            )
    header = ["attention", "T", "speed vs SDPA, 2 threads", "1 thread", "saved for backward, MB (kernel vs SDPA)"]
    return blocks(table([*header, "used by `shared_projection`"], rows), source("results/attention.json"))


# --- generation ----------------------------------------------------------------------------------------------------


def generate() -> str:
    """bench_generate: cache bytes, cached against uncached generation, cached decoding against GPT-2."""
    from . import bench_generate

    r = record("results/generate.json")
    speed, cache_bytes, seconds = (
        r["cached_tokens_per_s_256_new"],
        r["cache_bytes_512_tokens"],
        r["aot_mssa_512_new_seconds"],
    )
    shape = f"d {bench_generate.WIDTH} × {bench_generate.LAYERS} layers, {bench_generate.HEADS} heads"
    rows = [
        [
            f"KV-cache bytes at 512 tokens, AoT-MSSA vs AoT-MHSA ({shape})",
            f"{cache_bytes['aot-mssa'] / 1e6:.2f} MB vs {cache_bytes['aot-mhsa'] / 1e6:.2f} MB",
            f"**{x(r['cache_ratio_mssa_vs_mhsa'])}**",
            target("cache_bytes", r["cache_ratio_mssa_vs_mhsa"]),
        ],
        [
            "generation with vs without the cache, 512 new tokens, AoT-MSSA",
            f"{seconds['cached']:.2f} s vs {seconds['uncached']:.2f} s",
            f"**{x(r['cache_speedup_512_new'])}**",
            target("cache_speedup", r["cache_speedup_512_new"]),
        ],
        [
            "cached greedy decoding, 256 new tokens, batch 1: AoT-MSSA vs GPT-2 of the same width and depth",
            f"{n(speed['aot-mssa'])} vs {n(speed['gpt2'])} tokens/s",
            f"**{x(r['aot_mssa_vs_gpt2_cached'])}**",
            target("decode_vs_gpt2", r["aot_mssa_vs_gpt2_cached"]),
        ],
        [
            "same, AoT-MHSA vs GPT-2",
            f"{n(speed['aot-mhsa'])} vs {n(speed['gpt2'])} tokens/s",
            x(r["aot_mhsa_vs_gpt2_cached"]),
            "—",
        ],
    ]
    return blocks(table(["what", "measured", "ratio", "target"], rows), source("results/generate.json"))


def generate_static() -> str:
    """bench_generate: the static cache compiled against the dynamic cache, AoT and GPT-2."""
    r = record("results/generate.json")["static_compiled"]
    rows = []
    for batch, key in ((1, "batch_1"), (8, "batch_8")):
        row = r[key]
        speed = row["tokens_per_s"]
        first = batch == 1
        rows += [
            [
                f"AoT-MSSA, static cache + compile vs dynamic cache, batch {batch}",
                f"**{x(row['aot_static_compiled_vs_dynamic'])}** ({n(speed['aot-mssa-static'])} vs "
                f"{n(speed['aot-mssa-dynamic'])})",
                target("static_compile", row["aot_static_compiled_vs_dynamic"]) if first else "—",
            ],
            [
                f"AoT-MSSA vs GPT-2 of the same width and depth, both static + compile, batch {batch}",
                f"**{x(row['aot_vs_gpt2_static_compiled'])}** ({n(speed['aot-mssa-static'])} vs "
                f"{n(speed['gpt2-static'])})",
                target("decode_vs_gpt2", row["aot_vs_gpt2_static_compiled"]) if first else "—",
            ],
            [
                f"GPT-2's own static + compile vs dynamic (for scale), batch {batch}",
                f"{x(row['gpt2_static_compiled_vs_dynamic'])} ({n(speed['gpt2-static'])} vs "
                f"{n(speed['gpt2-dynamic'])})",
                "—",
            ],
        ]
    return blocks(table(["what", "measured (tokens/s)", "target"], rows), source("results/generate.json"))


# --- k-NN attention ------------------------------------------------------------------------------------------------


def knn() -> str:
    """bench_knn: memory against the KVT recipe and per doubling of n, time against SDPA and the kernel before."""
    r = record("results/knn.json")
    rss = {k.removeprefix("warm/"): v["peak_rss_added_mb"] for k, v in r["memory_rss"]["peak_rss_added_mb"].items()}
    ratio = {k.removeprefix("warm/"): v for k, v in r["memory_rss"]["ratio_vs_kvt"].items()}
    tensors = r["memory"]["peak_tensor_mb"]
    one, two = r["timing_threads1"], r["timing_threads2"]
    rows = []
    for k, label in (("k32", "k = 32"), ("k_half", "k = n/2")):
        ratios = [ratio[f"knn_vs_kvt/{k}/batch{b}"] for b in (1, 4)]
        before = [ratio[f"previous_knn_vs_kvt/{k}/batch{b}"] for b in (1, 4)]
        pairs = " / ".join(
            f"{n(rss[f'knn_{k}/batch{b}'], 1 if b == 1 else 0)} vs {n(rss[f'kvt_{k}/batch{b}'])} MB" for b in (1, 4)
        )
        rows.append(
            [
                f"peak RSS added, k-NN vs the KVT recipe, n = 4096, {label}, batch 1 / batch 4",
                f"{pairs}: **{x(ratios[0], 3)} / {x(ratios[1], 3)}** (the kernel before: {x(before[0], 3)} / "
                f"{x(before[1], 3)})",
                target("knn_rss_vs_kvt", max(ratios)),
            ]
        )
    for k, label in (("k32", "k = 32"), ("k_half", "k = n/2")):
        sizes = [
            int(key.split("@")[1].split("/")[0])
            for key in tensors
            if key.startswith(f"knn_{k}@") and key.endswith("batch4")
        ]
        values = [tensors[f"knn_{k}@{size}/batch4"] for size in sizes]
        growth = [b / a for a, b in zip(values, values[1:], strict=False)]
        rows.append(
            [
                f"peak tensor memory, {label}, n = {' / '.join(f'{s // 1024}k' for s in sizes)} (batch 4)",
                f"{' / '.join(n(v, 1) if v < 100 else n(v) for v in values)} MB: "
                f"**{' / '.join(x(g) for g in growth)}** per doubling",
                target("knn_doubling", max(growth)),
            ]
        )
    rows.append(
        [
            "dense SDPA (for scale): peak RSS added, n = 4096, batch 1 / 4",
            f"{rss['dense_sdpa/batch1']:.1f} / {rss['dense_sdpa/batch4']:.1f} MB",
            "—",
        ]
    )
    for k, label, goal in (("k32", "k = 32", "knn_time_k32"), ("k_half", "k = n/2", "knn_time_k_half")):
        key = f"knn_{k}"
        low1, high1 = one["ratio_range_over_runs"][key]
        low2, high2 = two["ratio_range_over_runs"][key]
        rows.append(
            [
                f"fwd + bwd time vs dense SDPA, n = 1024, batch 4, {label} (median of {len(one['runs'])} runs)",
                f"**{x(one['time_ratio_vs_dense_sdpa'][key])}** at 1 thread ({n(one['time_ms'][key])} vs "
                f"{n(one['time_ms']['dense_sdpa'])} ms; range {low1:.2f}–{x(high1)}), "
                f"**{x(two['time_ratio_vs_dense_sdpa'][key])}** at 2 threads (range {low2:.2f}–{x(high2)}); "
                f"KVT recipe {x(one['time_ratio_vs_dense_sdpa'][f'kvt_{k}'])} / "
                f"{x(two['time_ratio_vs_dense_sdpa'][f'kvt_{k}'])}",
                target(goal, max(one["time_ratio_vs_dense_sdpa"][key], two["time_ratio_vs_dense_sdpa"][key])),
            ]
        )
    rows += [
        [
            "forward alone vs SDPA's forward + backward, 1 thread",
            f"k = 32 {x(one['time_ratio_vs_dense_sdpa']['knn_k32_forward_only'])}, k = n/2 "
            f"{x(one['time_ratio_vs_dense_sdpa']['knn_k_half_forward_only'])}",
            "—",
        ],
        [
            "backward alone (fwd + bwd minus the forward), 1 thread",
            f"k = 32 {n(one['backward_ms']['k32'])} ms, k = n/2 {n(one['backward_ms']['k_half'])} ms",
            "—",
        ],
        [
            f"this kernel vs the one before it ({one['previous_kernel'].split(':')[0]}), timed in the same rounds",
            f"k = 32: **{x(one['time_ratio_vs_previous_kernel']['k32'])}** the time at 1 thread, "
            f"**{x(two['time_ratio_vs_previous_kernel']['k32'])}** at 2; k = n/2: "
            f"**{x(one['time_ratio_vs_previous_kernel']['k_half'])}** / "
            f"**{x(two['time_ratio_vs_previous_kernel']['k_half'])}**",
            "—",
        ],
    ]
    return blocks(table(["what", "measured", "target"], rows), source("results/knn.json"))


def knn_runs() -> str:
    """Each timing run of k-NN against SDPA, so that the medians above can be read against their spread."""
    r = record("results/knn.json")
    rows = []
    for threads in (1, 2):
        for index, run in enumerate(r[f"timing_threads{threads}"]["runs"], 1):
            ratios = run["time_ratio_vs_dense_sdpa"]
            rows.append(
                [
                    f"{threads} thread{'s' * (threads > 1)}, run {index}",
                    f"{run['time_ms']['dense_sdpa']:.0f}",
                    x(ratios["knn_k32"]),
                    x(ratios["knn_k_half"]),
                    x(ratios["previous_knn_k_half"]),
                ]
            )
    header = ["run", "SDPA ms", "k = 32", "k = n/2", "k = n/2, the kernel before"]
    return table(header, rows)


# --- correctness and the unit --------------------------------------------------------------------------------------


def cache_equivalence() -> str:
    """bench_cache_equivalence: every decoding path's largest logit difference from one uncached forward."""
    from .bench_cache_equivalence import markdown_table

    r = record("results/cache_equivalence.json")
    cells = [c["max_abs_logit_diff"] for cells in r["table"].values() for c in cells.values() if c["status"] == "ok"]
    worst = [
        path
        for path, row in r["table"].items()
        if any(c.get("max_abs_logit_diff") == max(cells) for c in row.values())
    ]
    versions = r["versions"]
    note = (
        f"Largest cell: {max(cells):.1e} ({', '.join(worst)}); cells above {r['tolerance']:g}: {len(r['failing'])}. "
        f"Transformers {versions['transformers']}, torch {versions['torch']}."
    )
    return blocks(markdown_table(r["table"], list(r["models"])), note, source("results/cache_equivalence.json"))


def syncs() -> str:
    """bench_syncs: host syncs per step of AoT, GPT-2 and Llama."""
    from .bench_syncs import table as syncs_table

    counts = record("results/syncs.json")["syncs"]
    return blocks(syncs_table(counts, list(next(iter(counts.values())))), source("results/syncs.json"))


def unit_size() -> str:
    """unit_size: lines of the three files a saved folder carries, against transformers' Llama."""
    r = record("results/unit_size.json")
    rows = [[f"`{name}`", n(lines)] for name, lines in r["unit_lines"].items()]
    rows.append(
        [
            "**the unit a saved folder carries**",
            f"**{n(r['unit_total'])}** ({target('unit_lines', r['unit_total'], '')})",
        ]
    )
    rows.append([f"transformers' Llama ({', '.join(f'`{name}`' for name in r['llama_lines'])})", n(r["llama_total"])])
    return blocks(table(["file", "lines"], rows), source("results/unit_size.json"))


# --- serving, data, parallelism ------------------------------------------------------------------------------------


def serve() -> str:
    """bench_serve: completions through `generate` and through `aot serve`, sequential and continuous batching."""
    r = record("results/serve.json")
    names = {
        "aot serve": "`aot serve` (sequential `generate` per request)",
        "aot serve --continuous-batching": "`aot serve --continuous-batching`",
    }
    rows = [
        [
            names.get(mode, f"`{mode.split(',')[0]}`,{mode.split(',', 1)[1]}" if "," in mode else mode),
            f"{m['seconds']:.2f}",
            f"{m['completions_per_s']:g}",
            f"{m['tokens_per_s']:g}",
        ]
        for mode, m in r["modes"].items()
    ]
    return blocks(table(["mode", "seconds", "completions/s", "tokens/s"], rows), source("results/serve.json"))


def data() -> str:
    """bench_data: tokenizing and packing a real corpus, its peak memory, the time to the first step."""
    r = record("results/data.json")
    t, cold, warm = r["throughput"], r["cold"], r["warm"]
    speed = t["mb_per_second"]
    rows = [
        [
            "tokenization throughput, `tokenize_and_pack` (2 processes: tokenize, pack, write) vs the tokenizer's "
            f"own `encode_batch` over the same {t['megabytes']:.1f} MB, best of 3 alternating rounds",
            f"**{x(t['ratio'])}** ({speed['tokenize_and_pack']:.2f} vs {speed['encode_batch']:.2f} MB/s)",
            target("tokenize_ratio", t["ratio"]),
        ],
        [
            "peak memory while preparing the corpus (cold cache): the whole process tree (PSS, shared pages counted "
            "once); the main process and the largest worker (RSS)",
            f"**{cold['tree_pss_gb']:.2f} GB**; {cold['main_gb']:.2f} and {cold['largest_worker_gb']:.2f} GB",
            target("prepare_peak_gb", cold["tree_pss_gb"], " GB"),
        ],
        [
            "time to the first training step, cold cache (parquet converted, every split tokenized and packed)",
            f"**{cold['seconds_to_first_step']:.0f} s**",
            target("cold_start_s", cold["seconds_to_first_step"], " s"),
        ],
        [
            "time to the first training step, warm cache (the blocks memory-mapped from the cache)",
            f"**{warm['seconds_to_first_step']:.1f} s**",
            target("warm_start_s", warm["seconds_to_first_step"], " s"),
        ],
    ]
    if "copy" in r:  # a copy of the corpus made anew, as each session gets the shared data
        rows.append([
            "time to the first training step, a copy of the corpus made anew (new paths and times; shards converted "
            "again, the blocks found by their text)",
            f"**{r['copy']['seconds_to_first_step']:.1f} s**",
            target("warm_start_s", r["copy"]["seconds_to_first_step"], " s"),
        ])  # fmt: skip
    return blocks(table(["what", "measured", "target"], rows), source("results/data.json"))


def tp() -> str:
    """bench_tp: tensor against data parallelism, step time and memory per rank."""
    r = record("results/tp.json")["settings"]
    rows = []
    for name, setting in r.items():
        s = setting["summary"]
        bold = (lambda text: f"**{text}**") if s["tp_over_dp_step_time"] < 1 else (lambda text: text)
        dominant = "activations dominate" if name == "activations" else "weights and optimizer state dominate"
        rows.append(
            [
                f"{setting['parameters'] / 1e6:.0f}M parameters, width {setting['width']} ({setting['batch']} × "
                f"{setting['length']} tokens): {dominant}",
                bold(x(s["tp_over_dp_step_time"])),
                bold(x(s["tp_over_dp_peak_rss"])),
                x(s["tp_over_dp_peak_above_loaded"]),
            ]
        )
    header = [
        "model (global batch)",
        "TP / DP step time",
        "TP / DP peak RSS per rank",
        "TP / DP peak above the loaded model",
    ]
    return blocks(table(header, rows), source("results/tp.json"))


def distributed() -> str:
    """training.distributed: samples/s of DDP and FSDP2 on one and two processes."""
    r = record("training/results/distributed_ddp_fsdp.json")
    best, ratio = r["throughput"]["best_samples_per_second"], r["throughput"]["two_over_one"]
    fsdp_ddp = r["throughput"]["fsdp_over_ddp"]
    rows = [
        [
            f"DDP (samples/s, best of {r['throughput']['rounds']})",
            f"{best['DDP x 1']:.1f}",
            f"{best['DDP x 2']:.1f}",
            f"**{x(ratio['DDP'])}**",
        ],
        [
            "FSDP2, sharded by `AoTLayer`",
            f"{best['FSDP2 x 1']:.1f}",
            f"{best['FSDP2 x 2']:.1f}",
            f"**{x(ratio['FSDP2'])}**",
        ],
        ["FSDP2 / DDP", x(fsdp_ddp["1"]), x(fsdp_ddp["2"]), ""],
    ]
    return blocks(
        table(["", "1 process", "2 processes", "2 / 1"], rows), source("training/results/distributed_ddp_fsdp.json")
    )


def distributed_memory() -> str:
    """training.distributed: peak memory per rank of DDP and FSDP2."""
    m = record("training/results/distributed_ddp_fsdp.json")["memory"]
    rows = [
        [
            name,
            f"{n(m[name]['peak_rss_mb'][0])} MB",
            f"{n(m[name]['peak_rss_mb'][1])} MB",
            f"{n(max(m[name]['model_state_mb']))} MB",
        ]
        for name in ("DDP", "FSDP2")
    ]
    rows.append(["FSDP2 / DDP", "", f"**{x(m['fsdp_over_ddp_peak'])}**", f"**{x(m['fsdp_over_ddp_model_state'])}**"])
    header = ["", "rank 0", "rank 1", "above the pre-model baseline (max)"]
    parameters = f"{m['parameters'] / 1e6:.1f}M parameters, 2 processes."
    return blocks(table(header, rows), parameters, source("training/results/distributed_ddp_fsdp.json"))


# --- training and evaluation summaries ---------------------------------------------------------------------------


def training_summary() -> str:
    """The training benchmarks in one table (details in training/README.md)."""
    lm = record("training/results/lm_vs_unigram_1200steps.json")
    c20, c10 = (
        record("training/results/cifar10_mhsa_20epochs.json"),
        record("training/results/cifar10_mhsa_10epochs.json"),
    )
    torchrun = record("training/results/throughput_torchrun.json")["rows"]
    accelerate = record("training/results/throughput_accelerate.json")["rows"]

    def speed(rows: dict, start: str) -> float:
        return next(v["samples_per_second"] for k, v in rows.items() if k.startswith(start))

    reached = next(
        int(e) for e, a in c20["validation_accuracy_per_epoch"].items() if a >= TARGETS["cifar10_accuracy"][1]
    )
    rows = [
        [
            "tiny AoT-MSSA LM on `../shared/data/text` vs a unigram model of the same tokens",
            f"`{lm['command']}`",
            f"validation perplexity **{lm['validation_perplexity']:.1f}** vs {lm['unigram_perplexity']:.1f} "
            f"({n(lm['steps'])} steps, {lm['train_seconds']:.0f} s)",
            "clearly below unigram",
        ],
        [
            "AoT image classifier (AoT-MHSA, attention only) on the CIFAR-10 archives",
            f"`{c20['command']}`",
            f"**{100 * c20['validation_accuracy']:.1f}%** after {c20['train_seconds'] / 60:.1f} min of training "
            f"(60% first at epoch {reached}); one process, {c10['epochs']:g} epochs: "
            f"{100 * c10['validation_accuracy']:.1f}% after {c10['train_seconds'] / 60:.0f} min",
            "≥ 60% within 60 min "
            + ("✓" if c20["validation_accuracy"] >= 0.6 and c20["train_seconds"] <= 3600 else "✗"),
        ],
        [
            "2 processes (DDP, gloo) × 1 thread vs 1 process, same global batch: blocks/s",
            "`python -m benchmarks.training.throughput [--launcher accelerate]`",
            f"torchrun **{speed(torchrun, '2 processes'):.1f}** vs {speed(torchrun, '1 process x 1'):.1f} of one "
            f"1-thread process; accelerate {speed(accelerate, '2 processes'):.1f} vs "
            f"{speed(accelerate, '1 process x 1'):.1f}; against one 2-thread process "
            f"{x(speed(torchrun, '2 processes') / speed(torchrun, '1 process x 2'))} / "
            f"{x(speed(accelerate, '2 processes') / speed(accelerate, '1 process x 2'))}",
            "reported",
        ],
    ]
    return table(["what", "command", "measured", "target"], rows)


def eval_summary() -> str:
    """The evaluation benchmarks in one table (details in eval/README.md)."""
    aot, gpt2 = (
        record("eval/results/throughput_aot.json")["tasks"],
        record("eval/results/throughput_gpt2.json")["tasks"],
    )
    ptb1000, ptb = (
        record("eval/results/throughput_aot_ptb1000.json")["tasks"]["ptb"],
        record("eval/results/throughput_aot_ptb.json")["tasks"]["ptb"],
    )
    suite = record("eval/results/suite.json")["models"]
    rolling = [
        aot["lambada"]["speedup_aot_eval_over_lm_eval"],
        ptb1000["speedup_aot_eval_over_lm_eval"],
        ptb["speedup_aot_eval_over_lm_eval"],
    ]
    (gpt_name, gpt_report), (aot_name, aot_report) = suite.items()
    gpt2_scores, aot_scores = gpt_report["results"], aot_report["results"]
    rows = [
        [
            "`aot eval` vs lm-evaluation-harness, same model, data and batch (AoT-MSSA)",
            f"rolling loss (`lambada`, `ptb`): **{min(rolling):.2f}–{x(max(rolling))}** the harness's tokens/s; "
            f"last word (`lambada_acc`): **{x(aot['lambada_acc']['speedup_aot_eval_over_lm_eval'])}**; both tools "
            "report the same numbers",
            "not slower "
            + ("✓" if min([*rolling, aot["lambada_acc"]["speedup_aot_eval_over_lm_eval"]]) >= 1 else "✗"),
        ],
        [
            "same, GPT-2",
            f"`ptb` {x(gpt2['ptb']['speedup_aot_eval_over_lm_eval'])}, `lambada_acc` "
            f"{x(gpt2['lambada_acc']['speedup_aot_eval_over_lm_eval'])}",
            "not slower " + ("✓" if min(t["speedup_aot_eval_over_lm_eval"] for t in gpt2.values()) >= 1 else "✗"),
        ],
        [
            f"the suite, {gpt_name} vs {aot_name} at equal parameters "
            f"({gpt_report['model_info']['num_parameters'] / 1e6:.2f}M), trained the same way",
            f"PTB loss {gpt2_scores['ptb']['loss']:.3f} vs {aot_scores['ptb']['loss']:.3f}, LAMBADA loss "
            f"{gpt2_scores['lambada']['loss']:.3f} vs {aot_scores['lambada']['loss']:.3f}, LAMBADA acc "
            f"{100 * gpt2_scores['lambada_acc']['acc']:.0f}% / {100 * aot_scores['lambada_acc']['acc']:.0f}%",
            "reported",
        ],
    ]
    return table(["what", "measured", "target"], rows)


# --- training/README.md -------------------------------------------------------------------------------------------


def lm_vs_unigram() -> str:
    """training.lm_vs_unigram: the tiny LM's validation perplexity against a unigram model's."""
    r = record("training/results/lm_vs_unigram_1200steps.json")
    rows = [
        ["unigram (same tokens)", f"{r['unigram_perplexity']:.1f}"],
        [
            f"AoT-MSSA tiny, {n(r['steps'])} steps ({r['tokens_seen'] / 1e6:.1f}M tokens), "
            f"{r['train_seconds']:.0f} s of training",
            f"**{r['validation_perplexity']:.1f}**",
        ],
    ]
    ratio = f"Ratio {r['ratio']:.2f}."
    return blocks(
        table(["model", "validation perplexity"], rows), ratio, source("training/results/lm_vs_unigram_1200steps.json")
    )


def cifar10_curve() -> str:
    """training.cifar10: validation accuracy by epoch of the acceptance run and the single-process run."""
    c20, c10 = (
        record("training/results/cifar10_mhsa_20epochs.json"),
        record("training/results/cifar10_mhsa_10epochs.json"),
    )
    epochs = ["1", "2", *[str(e) for e in range(4, int(c20["epochs"]) + 1, 2)]]
    rows = []
    for r, label in ((c20, f"{c20['processes']} processes"), (c10, "1 process")):
        per_epoch = r["validation_accuracy_per_epoch"]
        last = max(per_epoch, key=float)
        cells = [
            (f"**{100 * per_epoch[e]:.1f}**" if e == last else f"{100 * per_epoch[e]:.1f}") if e in per_epoch else ""
            for e in epochs
        ]
        rows.append([f"{r['epochs']:g}-epoch run ({label}, {r['train_samples_per_second']:.0f} images/s)", *cells])
    sources = [
        source(f"training/results/cifar10_mhsa_{epochs:g}epochs.json") for epochs in (c20["epochs"], c10["epochs"])
    ]
    return blocks(table(["validation accuracy (%), epoch", *epochs], rows), " ".join(sources))


def cifar10_short() -> str:
    """training.cifar10: the shortened MHSA and MSSA runs."""
    rows = []
    for name, label in (
        ("mhsa", "AoT-MHSA (the configuration above)"),
        ("mssa", "AoT-MSSA, same size (`--config-overrides` without `attention_type=mhsa`)"),
    ):
        r = record(f"training/results/cifar10_{name}_2epochs.json")
        rows.append(
            [label, f"{r['epochs']:g}", f"{n(r['train_seconds'])} s", f"{100 * r['validation_accuracy']:.1f}%"]
        )
    return table(["run", "epochs", "training time", "validation accuracy"], rows)


def training_throughput() -> str:
    """training.throughput: blocks/s of one and two processes under torchrun and accelerate."""
    runs = {
        launcher: record(f"training/results/throughput_{launcher}.json")["rows"]
        for launcher in ("torchrun", "accelerate")
    }
    rows = []
    for (name, torchrun), accelerate in zip(runs["torchrun"].items(), runs["accelerate"].values(), strict=True):
        label = re.sub(r" \(\w+\)$", "", name).replace(" x ", " × ").replace("1 threads", "1 thread")
        bold = (lambda text: f"**{text}**") if name.startswith("2 processes") else (lambda text: text)
        rows.append(
            [
                label + (" (DDP, gloo)" if name.startswith("2 processes") else ""),
                bold(f"{torchrun['samples_per_second']:.1f}"),
                n(torchrun["tokens_per_second"]),
                bold(f"{accelerate['samples_per_second']:.1f}"),
                n(accelerate["tokens_per_second"]),
            ]
        )
    header = ["configuration", "torchrun run: blocks/s", "tokens/s", "accelerate run: blocks/s", "tokens/s"]
    return table(header, rows)


# --- eval/README.md --------------------------------------------------------------------------------------------------


def eval_models() -> str:
    """eval.train_pair: the two models' parameter counts (as the suite recorded them)."""
    suite = record("eval/results/suite.json")["models"]
    rows = [
        [f"{name.split(' (')[0]} (`{r['model_info']['class']}`)", n(r["model_info"]["num_parameters"])]
        for name, r in suite.items()
    ]
    return table(["model", "parameters"], rows)


def eval_suite() -> str:
    """eval.suite: the suite's losses, accuracy and bits per byte of both models."""
    suite = record("eval/results/suite.json")["models"]
    rows = []
    for name, r in suite.items():
        res = r["results"]
        rows.append(
            [
                name,
                f"{r['model_info']['num_parameters'] / 1e6:.2f}M",
                f"{res['lambada']['loss']:.3f}",
                f"{res['ptb']['loss']:.3f}",
                "–",
                f"{100 * res['lambada_acc']['acc']:.2f}%",
                "–",
                "–",
            ]
        )
    header = [
        "Model",
        "Params",
        "LAMBADA loss ↓",
        "PTB loss ↓",
        "WikiText loss ↓",
        "LAMBADA acc ↑",
        "CBT-CN acc ↑",
        "CBT-NE acc ↑",
    ]
    bits = [
        [
            name,
            f"{r['results']['ptb']['bits_per_byte']:.3f}",
            f"{r['results']['lambada']['bits_per_byte']:.3f}",
            f"{r['results']['lambada_acc']['last_word_perplexity']:.2e}",
        ]
        for name, r in suite.items()
    ]
    bits_header = ["Model", "bits/byte PTB", "bits/byte LAMBADA", "LAMBADA last-word perplexity"]
    return blocks(table(header, rows), table(bits_header, bits), source("eval/results/suite.json"))


def eval_throughput() -> str:
    """eval.throughput: `aot eval` against lm-evaluation-harness per task, wall and CPU time."""
    files = (
        ("AoT", "throughput_aot", "lambada", "`lambada` (rolling, 100 passages)"),
        ("AoT", "throughput_aot", "lambada_acc", "`lambada_acc` (last word)"),
        ("AoT", "throughput_aot_ptb1000", "ptb", "`ptb` (first 1,000 lines)"),
        ("AoT", "throughput_aot_ptb", "ptb", "`ptb` (all, 1 round)"),
        ("GPT-2", "throughput_gpt2", "lambada_acc", "`lambada_acc` (last word)"),
        ("GPT-2", "throughput_gpt2", "ptb", "`ptb` (first 1,000 lines)"),
    )
    rows = []
    for model, name, task, label in files:
        t = record(f"eval/results/{name}.json")["tasks"][task]
        wall, cpu = t["tokens_per_second"], t.get("tokens_per_cpu_second")
        cpu_ratio = t.get("cpu_speedup_aot_eval_over_lm_eval")
        one_round = "1 round" in label
        rows.append(
            [
                model,
                label,
                n(t["tokens"]),
                f"{n(wall['aot_eval'])} / {'–' if one_round else n(cpu['aot_eval'])}",
                f"{n(wall['lm_eval'])} / {'–' if one_round else n(cpu['lm_eval'])}",
                f"{x(t['speedup_aot_eval_over_lm_eval'])} / {'–' if one_round else x(cpu_ratio)}",
            ]
        )
    header = ["model", "task", "tokens", "`aot eval` tokens per wall s / CPU s", "lm-eval tokens per wall s / CPU s"]
    return table([*header, "speed-up, wall / CPU"], rows)


TABLES: dict[str, Callable[[], str]] = {
    fn.__name__.replace("_", "-"): fn
    for fn in (
        train,
        profile_step,
        attention,
        generate,
        generate_static,
        knn,
        knn_runs,
        cache_equivalence,
        syncs,
        unit_size,
        serve,
        data,
        tp,
        distributed,
        distributed_memory,
        training_summary,
        eval_summary,
        lm_vs_unigram,
        cifar10_curve,
        cifar10_short,
        training_throughput,
        eval_models,
        eval_suite,
        eval_throughput,
    )
}
