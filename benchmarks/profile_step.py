"""Where a training step spends its time: the equal-parameter rows of `bench_train`, broken down by operator.

    python -m benchmarks.profile_step                     # all four models, 2 threads
    python -m benchmarks.profile_step --models aot-36 gpt2-6 --threads 1

Models (the shapes of `bench_train`): `gpt2-6` / `aot-36` (LM backbones, d 512, seq 256, batch 8, equal
parameters) and `vit-6` / `aot-v-36` (image classifiers, 192 wide, 32 px, patch 4, batch 128, equal parameters).
Each step (forward + backward + AdamW) runs under `torch.profiler`; the self CPU time of every aten operator is
summed into groups: dense matmuls (the weights), attention (the SDPA kernels or MSSA's shared-projection kernel,
forward and backward), LayerNorm, the optimizer, everything else. The FLOPs of one step are counted too (weight
matmuls, and attention at its minimum work), which bounds the equal-parameter ratio: at equal FLOP rates
AoT / peer = the peer's FLOPs over AoT's. Writes `benchmarks/results/profile_step.json`.
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from aot_transformers import shared_projection

from ._common import MATMUL_OPS, setup, write_results
from .bench_train import aot_lm, aot_vision, gpt2, image_step, lm_step, vit

MODELS = {
    "gpt2-6": lambda: lm_step(gpt2(6)),
    "aot-36": lambda: lm_step(aot_lm(36)),
    "vit-6": lambda: image_step(vit(6)),
    "aot-v-36": lambda: image_step(aot_vision(36)),
}
GROUPS = {
    "matmul": MATMUL_OPS,
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                  "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
    "layer_norm": ("aten::native_layer_norm", "aten::native_layer_norm_backward"),
}  # fmt: skip


# The autograd function of MSSA's shared-projection attention kernel (`shared_projection._SharedProjectionAttention`),
# forward and backward: every operator under these events is attention.
SHARED_KERNEL_EVENTS = ("_SharedProjectionAttention", "_SharedProjectionAttentionBackward")


def _inside(event, names: tuple[str, ...]) -> bool:
    """Whether `event` or one of its ancestors on the CPU call stack is named in `names`."""
    while event is not None:
        if event.name in names:
            return True
        event = event.cpu_parent
    return False


def breakdown(step, steps: int = 2) -> dict:
    """Seconds per step by group (self CPU time, summed over threads' work as the profiler reports it)."""
    step()
    step()  # warm-up: allocator, oneDNN primitives
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    seconds = {group: 0.0 for group in (*GROUPS, "optimizer", "other")}
    for event in prof.events():
        self_s = event.self_cpu_time_total / 1e6 / steps
        group = next((g for g, names in GROUPS.items() if event.name in names), None)
        if _inside(event, SHARED_KERNEL_EVENTS):  # MSSA's own attention kernel: its matmuls count as attention
            group = "attention"
        elif group is None and event.name.startswith(("Optimizer.", "aten::_foreach", "aten::lerp", "aten::addc")):
            group = "optimizer"
        seconds[group or "other"] += self_s
    seconds["total"] = sum(seconds.values())
    return seconds


PAIRS = {"lm": ("gpt2-6", "aot-36"), "vision": ("vit-6", "aot-v-36")}


def _causal_share(is_causal: bool) -> float:
    return 0.5 if is_causal else 1.0


def _sdpa_forward_flops(query, key, value, dropout_p=0.0, is_causal=False, *args, out_shape=None, **kwargs) -> int:
    return int(sdpa_flop_count(query, key, value) * _causal_share(is_causal))


def _sdpa_backward_flops(grad, query, key, value, out, lse, dropout_p=0.0, is_causal=False, *args, **kwargs) -> int:
    return int(sdpa_backward_flop_count(grad, query, key, value) * _causal_share(is_causal))


def step_flops(step) -> dict[str, int]:
    """FLOPs of one training step (forward + backward), counted by FlopCounterMode: the weight matmuls, and the
    attention at its minimum (the formula's 2·T²·D per head and product, halved when causal; no recomputation).
    Attention runs through SDPA here so that every model's attention is counted by the same formula."""
    mapping = {
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_forward_flops,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward_flops,
    }
    with (
        mock.patch.dict(shared_projection.SHARED_KERNEL_MAX_LENGTH, {True: 0, False: 0}),
        FlopCounterMode(display=False, custom_mapping=mapping) as counter,
    ):
        step()
    counts = counter.get_flop_counts()["Global"]
    attention = sum(n for op, n in counts.items() if "attention" in str(op))
    return {"matmul": counter.get_total_flops() - attention, "attention": attention}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    setup(threads=args.threads)
    results: dict = {"threads": args.threads, "seconds_per_step": {}}
    header = f"{'model':<10}" + "".join(f"{g:>12}" for g in (*GROUPS, "optimizer", "other", "total"))
    print(header)
    results["gflops_per_step"] = {}
    for name in args.models:
        step = MODELS[name]()
        seconds = breakdown(step)
        results["seconds_per_step"][name] = seconds
        flops = results["gflops_per_step"][name] = {k: v / 1e9 for k, v in step_flops(step).items()}
        print(
            f"{name:<10}" + "".join(f"{seconds[g]:>12.3f}" for g in seconds)
            + f"   GFLOP: matmul {flops['matmul']:.1f}, attention {flops['attention']:.1f}",
            flush=True,
        )  # fmt: skip
    # The tokens/s ratio AoT / peer if both ran at the same FLOP rate: the peer's FLOPs over AoT's.
    results["equal_rate_ratio"] = {
        pair: sum(results["gflops_per_step"][peer].values()) / sum(results["gflops_per_step"][aot].values())
        for pair, (peer, aot) in PAIRS.items()
        if peer in args.models and aot in args.models
    }
    print("tokens/s ratio at equal FLOP rates:", results["equal_rate_ratio"])
    write_results("profile_step", results)
    return results


if __name__ == "__main__":
    main()
