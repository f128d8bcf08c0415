"""Training throughput of AoT vs transformers' GPT-2 and ViT, measured side by side in one run.

    python -m benchmarks.bench_train            # all rows (about 20 minutes on 2 cores)
    python -m benchmarks.bench_train --quick    # fewer repeats

Rows (fp32 unless said, 2 threads, forward + backward + AdamW step):
- LM backbones, d=512, 8 heads, seq 256, batch 8, vocab 1024: AoTModel (MSSA) vs GPT2Model (sdpa) at the same
  width and depth (6 layers), and at equal parameters (AoT 36 layers); both again under torch.compile; AoT in bf16
  autocast vs fp32 when the CPU multiplies bf16 natively (AVX512-BF16 or AMX; `--bf16 yes` forces the rows). Without
  it, torch emulates bf16 matmuls and they are tens of times slower than fp32 (`bf16_matmul_probe` in the results
  records by how much), so the bf16 rows would only measure the emulation.
- Vision, 32 px, patch 4, batch 128: AoTForImageClassification vs ViTForImageClassification at ViT-tiny's width
  and depth (192 x 6 layers, 3 heads), and at equal parameters (AoT 36 layers).

The three sections (LM eager, vision, LM compiled) each run in a fresh process (`--section` runs one here); within
a section the models' steps alternate round by round (20 rounds) and each keeps its best time.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json

import torch
from transformers import AutoModel, AutoModelForImageClassification, GPT2Model, ViTForImageClassification

from aot_transformers import AoTConfig, AoTForImageClassification, AoTModel

from ._common import best_time, interleaved_best_times, run_isolated, setup, write_results
from .peers import peer_model

WIDTH, HEADS, SEQ, BATCH, VOCAB = 512, 8, 256, 8, 1024


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def gpt2(layers: int) -> GPT2Model:
    return peer_model(
        AutoModel,
        "gpt2",
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        max_position_embeddings=1024,
    )


def aot_lm(layers: int) -> AoTModel:
    return AoTModel(
        AoTConfig(
            vocab_size=VOCAB,
            hidden_size=WIDTH,
            num_hidden_layers=layers,
            num_attention_heads=HEADS,
            max_position_embeddings=1024,
            attn_implementation="shared_projection",  # MSSA's CPU training kernel, as `aot train` uses
        )
    )


def lm_step(model: torch.nn.Module, autocast: bool = False):
    """A closure running one training step on random tokens."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))

    def step():
        context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with context:
            hidden = model(input_ids=ids, use_cache=False).last_hidden_state
        loss = hidden.float().square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def image_step(model: torch.nn.Module, batch: int = 128):
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    pixels = torch.randn(batch, 3, 32, 32)
    labels = torch.randint(0, 10, (batch,))

    def step():
        loss = model(pixel_values=pixels, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def vit(layers: int, width: int = 192, heads: int = 3) -> ViTForImageClassification:
    return peer_model(
        AutoModelForImageClassification,
        "vit",
        image_size=32,
        patch_size=4,
        num_channels=3,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_labels=10,
    )


def aot_vision(layers: int, width: int = 192, heads: int = 3) -> AoTForImageClassification:
    return AoTForImageClassification(
        AoTConfig(
            image_size=32,
            patch_size=4,
            num_channels=3,
            hidden_size=width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_labels=10,
            attn_implementation="shared_projection",  # MSSA's CPU training kernel, as `aot train` uses
        )
    )


def bf16_matmul_probe(size: tuple[int, int, int] = (2048, 512, 512)) -> dict:
    """Time one (m × k) @ (k × n) matmul in fp32 and bf16, and read whether the CPU has native bf16 instructions."""
    flags = set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    m, k, n = size
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        seconds[str(dtype).removeprefix("torch.")] = best_time(functools.partial(torch.matmul, a, b), 3, warmup=1)
    return {
        "native_bf16": bool(flags & {"avx512_bf16", "amx_bf16"}),
        "matmul_seconds": seconds,
        "bf16_over_fp32_time": seconds["bfloat16"] / seconds["float32"],
    }


def lm_section(rounds: int, bf16_rows: str) -> dict:
    """LM backbones in eager mode: same width and depth, equal parameters, and bf16 where the CPU has it."""
    results: dict = {}
    models = {"gpt2-6": gpt2(6), "aot-6": aot_lm(6), "aot-36": aot_lm(36)}
    results["lm_params"] = {name: count(m) for name, m in models.items()}
    steps = {name: lm_step(m) for name, m in models.items()}
    results["bf16_matmul_probe"] = probe = bf16_matmul_probe()
    bf16 = bf16_rows == "yes" or (bf16_rows == "auto" and probe["native_bf16"])
    if bf16:
        steps["aot-6-bf16"] = lm_step(models["aot-6"], autocast=True)
        steps["aot-36-bf16"] = lm_step(models["aot-36"], autocast=True)
    times = interleaved_best_times(steps, rounds=rounds)
    lm = {name: BATCH * SEQ / t for name, t in times.items()}
    results["lm_tokens_per_s"] = lm
    results["lm_ratios"] = {
        "same_width_depth (aot-6 / gpt2-6)": lm["aot-6"] / lm["gpt2-6"],
        "equal_params (aot-36 / gpt2-6)": lm["aot-36"] / lm["gpt2-6"],
    }
    if bf16:
        results["lm_ratios"]["bf16_vs_fp32 (aot-6)"] = lm["aot-6-bf16"] / lm["aot-6"]
        results["lm_ratios"]["bf16_vs_fp32 (aot-36)"] = lm["aot-36-bf16"] / lm["aot-36"]
    else:
        print(f"bf16 rows skipped: no native bf16 matmul on this CPU ({probe})", flush=True)
    print(results["lm_ratios"], flush=True)
    return results


def compiled_section(rounds: int) -> dict:
    """The equal-parameter LM pair under torch.compile (and the compiled AoT against eager GPT-2)."""
    models = {"gpt2-6": gpt2(6), "aot-36": aot_lm(36)}
    steps = {f"{name}-compiled": lm_step(torch.compile(m)) for name, m in models.items()}
    steps["gpt2-6"] = lm_step(gpt2(6))
    times = interleaved_best_times(steps, rounds=rounds, warmup=2)
    tokens = {name: BATCH * SEQ / t for name, t in times.items()}
    results = {"lm_compiled_tokens_per_s": tokens}
    results["lm_compiled_ratios"] = {
        "equal_params compiled (aot-36c / gpt2-6c)": tokens["aot-36-compiled"] / tokens["gpt2-6-compiled"],
        "equal_params compiled vs eager GPT-2 (aot-36c / gpt2-6)": tokens["aot-36-compiled"] / tokens["gpt2-6"],
    }
    print(results["lm_compiled_ratios"], flush=True)
    return results


def vision_section(rounds: int) -> dict:
    """Image classifiers: same width and depth, and equal parameters."""
    vision = {"vit-6": vit(6), "aot-v-6": aot_vision(6), "aot-v-36": aot_vision(36)}
    results: dict = {"vision_params": {name: count(m) for name, m in vision.items()}}
    times = interleaved_best_times({name: image_step(m) for name, m in vision.items()}, rounds=rounds)
    images = {name: 128 / t for name, t in times.items()}
    results["vision_images_per_s"] = images
    results["vision_ratios"] = {
        "same_width_depth (aot-v-6 / vit-6)": images["aot-v-6"] / images["vit-6"],
        "equal_params (aot-v-36 / vit-6)": images["aot-v-36"] / images["vit-6"],
    }
    print(results["vision_ratios"], flush=True)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument(
        "--bf16", choices=["auto", "yes", "no"], default="auto",
        help="bf16 autocast rows: auto = only if the CPU has native bf16 matmuls (AVX512-BF16 or AMX)",
    )  # fmt: skip
    parser.add_argument("--section", choices=["lm", "vision", "compiled"], help="run one section here and print it")
    parser.add_argument(
        "--rounds", type=int, default=None,
        help="interleaved rounds per section (default 20, --quick 2): on a host whose speed drifts within seconds, "
             "many short rounds give each model's best time the same chance to land in a quiet moment",
    )  # fmt: skip
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 20)
    if args.section:
        setup()
        section = {
            "lm": lambda: lm_section(rounds, args.bf16),
            "vision": lambda: vision_section(rounds),
            "compiled": lambda: compiled_section(rounds),
        }[args.section]()
        print(json.dumps(section))
        return section
    # Each section runs in a fresh process: one section's state must not slow the next. Once Inductor's OpenMP
    # kernels have run, their worker threads compete with ATen's for the two cores (eager steps measured afterwards
    # in the same process lost up to ~10%), and even eager LM steps left the vision rows measurably slower.
    results: dict = {"rounds": rounds}
    for section in ("lm", "vision", "compiled"):
        section_results = run_isolated(
            "bench_train", "--section", section, "--bf16", args.bf16, "--rounds", str(rounds)
        )
        print(section, json.dumps({k: v for k, v in section_results.items() if "ratios" in k}), flush=True)
        results.update(section_results)
    path = write_results("train", results)
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
