"""MSSA's shared-projection attention kernel vs CPU SDPA on a training step (forward + backward), by length.

    python -m benchmarks.bench_attention                # 1 and 2 threads (about 4 minutes)
    python -m benchmarks.bench_attention --threads 2

`sdpa_attention_forward` sends MSSA training steps on CPU to `_SharedProjectionAttention` when the sequence is no
longer than `SHARED_KERNEL_MAX_LENGTH` (causal / bidirectional); this benchmark measures where that pays: the
time of SDPA with query = key = value = U over the time of the shared kernel (> 1: the kernel is faster), for the
LM shape of `bench_train` (batch 8, 8 heads of 64, causal) and the vision shape (batch 128, 3 heads of 64,
bidirectional), plus the bytes each saves for the backward (the price of the kernel: it keeps the probabilities).
Writes `benchmarks/results/attention.json`.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from aot_transformers.shared_projection import SHARED_KERNEL_MAX_LENGTH, _SharedProjectionAttention

from ._common import interleaved_best_times, setup, write_results

# (name, batch, heads, head dim, causal, lengths)
SHAPES = (
    ("lm", 8, 8, 64, True, (64, 128, 256, 512, 1024)),
    ("lm-bidirectional", 8, 8, 64, False, (64, 128, 256)),
    ("vision", 128, 3, 64, False, (17, 65, 129)),
)


def saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for the backward while `fn()` runs (each storage counted once)."""
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return sum(storages.values())


def measure(batch: int, heads: int, dim: int, causal: bool, length: int, rounds: int) -> dict:
    states = torch.randn(batch, length, heads, dim).transpose(1, 2).requires_grad_(True)  # the model's head view
    grad = torch.randn(batch, heads, length, dim)
    scale = dim**-0.5
    forward = {
        "sdpa": lambda: F.scaled_dot_product_attention(states, states, states, is_causal=causal, scale=scale),
        "shared": lambda: _SharedProjectionAttention.apply(states, scale, causal),
    }
    steps = {name: (lambda f=f: f().backward(grad)) for name, f in forward.items()}
    seconds = interleaved_best_times(steps, rounds=rounds, warmup=2)
    return {
        "length": length,
        "seconds": seconds,
        "speedup": seconds["sdpa"] / seconds["shared"],
        "saved_mb": {name: saved_bytes(f) / 2**20 for name, f in forward.items()},
        "kernel_used": length <= SHARED_KERNEL_MAX_LENGTH[causal],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    results: dict = {
        "max_length": {"causal": SHARED_KERNEL_MAX_LENGTH[True], "bidirectional": SHARED_KERNEL_MAX_LENGTH[False]}
    }
    for threads in args.threads:
        setup(threads=threads)
        rows = results[f"threads_{threads}"] = {}
        for name, batch, heads, dim, causal, lengths in SHAPES:
            rows[name] = []
            for length in lengths:
                row = measure(batch, heads, dim, causal, length, args.rounds)
                rows[name].append(row)
                print(
                    f"{threads} thr {name:<17} T={length:<5} sdpa {row['seconds']['sdpa'] * 1e3:7.1f} ms  "
                    f"shared {row['seconds']['shared'] * 1e3:7.1f} ms  speedup {row['speedup']:.2f}x  saved MB "
                    f"{row['saved_mb']['sdpa']:.1f} / {row['saved_mb']['shared']:.1f}"
                    f"{'' if row['kernel_used'] else '  (SDPA used)'}",
                    flush=True,
                )
    write_results("attention", results)
    return results


if __name__ == "__main__":
    main()
