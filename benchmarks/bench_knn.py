"""k-NN attention: time and peak memory of the chunked kernel vs dense SDPA and the KVT reference recipe.

    python -m benchmarks.bench_knn               # everything below (about 15 minutes on 2 shared cores)
    python -m benchmarks.bench_knn --skip-memory # timing only (keeps the memory section of the results file)

Shapes: 4 heads x 64, bidirectional (no mask), fp32, forward + backward, k = 32 and k = n/2 (`knn_k=0.5`).
Time: batch 4 at n = 1024, best of interleaved rounds, at 2 threads and at 1 (a chunked kernel of many small
operations loses more than one fused SDPA call when the 2 cores are oversubscribed; 1 thread is the steadier
ratio). Memory: peak bytes of live CPU tensors during one forward + backward (`peak_tensor_mb`: the profiler's
allocation events, see benchmarks/README.md), batch 4 at n = 1k..8k, and the KVT recipe at n = 4096, batch 1
and 4. The KVT recipe is the reference implementation's: full scores,
`topk` indices, scatter into a zero mask, `torch.where` to -inf, softmax, matmul (https://github.com/damo-cv/KVT).
`--previous REV` also times the kernel of git revision REV (default: the one before the recomputing backward),
which saved n x k indices and probabilities for its backward: the cost of recomputation.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch._C._profiler import _EventType

from aot_transformers.attention_aot import knn_attention_forward

from ._common import RESULTS_DIR, interleaved_best_times, setup, write_results

HEADS, HEAD_DIM = 4, 64
SCALING = HEAD_DIM**-0.5
# The last commit whose k-NN backward saved the kept indices and probabilities (before issue 15).
PREVIOUS_KERNEL_REV = "84be8f7"


def kvt_recipe(query, key, value, k):
    """The KVT reference top-k attention (dense scores and masks)."""
    scores = torch.matmul(query, key.transpose(-2, -1)) * SCALING
    mask = torch.zeros_like(scores)
    index = torch.topk(scores, k=k, dim=-1, largest=True)[1]
    mask.scatter_(-1, index, 1.0)
    scores = torch.where(mask > 0, scores, torch.full_like(scores, float("-inf")))
    return torch.matmul(scores.softmax(dim=-1), value)


def _inputs(batch: int, n: int) -> tuple[torch.Tensor, ...]:
    q, k, v = (torch.randn(batch, HEADS, n, HEAD_DIM, requires_grad=True) for _ in range(3))
    return q, k, v, torch.randn(batch, HEADS, n, HEAD_DIM)


def step(kind: str, batch: int, n: int, knn_k: int | float, kernel=knn_attention_forward) -> Callable[[], None]:
    """One forward + backward of `kind` ("dense_sdpa", "knn", "knn_forward", "kvt") on fresh random inputs."""
    q, k, v, grad = _inputs(batch, n)
    top = knn_k if isinstance(knn_k, int) else max(1, round(knn_k * n))

    def run() -> None:
        if kind == "dense_sdpa":
            torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(grad)
        elif kind == "knn":
            kernel(None, q, k, v, None, SCALING, knn_k=knn_k)[0].transpose(1, 2).backward(grad)
        elif kind == "knn_forward":
            with torch.no_grad():
                kernel(None, q, k, v, None, SCALING, knn_k=knn_k)
        elif kind == "kvt":
            kvt_recipe(q, k, v, top).backward(grad)
        else:
            raise ValueError(f"unknown kind {kind!r}")
        for tensor in (q, k, v):
            tensor.grad = None

    return run


def peak_tensor_mb(fn: Callable[[], None]) -> float:
    """Peak bytes of CPU tensors allocated by `fn` and alive at the same time, in MB (2^20 bytes).

    Every allocation and free of torch's CPU allocator is reported to the profiler with the running total of bytes
    it allocated since profiling started (`total_allocated`); the maximum of that total is the peak. Tensors that
    existed before `fn` (the inputs) are not counted; scratch memory outside torch's allocator (e.g. BLAS
    workspaces) is not either.
    """
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    peak, stack = 0, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            peak = max(peak, node.extra_fields.total_allocated)
        stack.extend(node.children)
    return peak / 2**20


def previous_kernel(rev: str) -> Callable | None:
    """`knn_attention_forward` as of git revision `rev`, or None where git or the revision is unavailable."""
    root = Path(__file__).resolve().parents[1]
    try:
        source = subprocess.run(
            ["git", "show", f"{rev}:src/aot_transformers/attention_aot.py"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / "previous_attention_aot.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("previous_attention_aot", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.knn_attention_forward


def timing(rounds: int, previous_rev: str | None) -> dict:
    """Forward + backward times at n = 1024, batch 4, interleaved, with ratios to dense SDPA."""
    n, batch = 1024, 4
    fns = {"dense_sdpa": step("dense_sdpa", batch, n, 0)}
    for name, knn_k in (("k32", 32), ("k_half", 0.5)):
        fns[f"knn_{name}"] = step("knn", batch, n, knn_k)
        fns[f"knn_{name}_forward_only"] = step("knn_forward", batch, n, knn_k)
        fns[f"kvt_{name}"] = step("kvt", batch, n, knn_k)
    previous = previous_kernel(previous_rev) if previous_rev else None
    if previous is not None:
        for name, knn_k in (("k32", 32), ("k_half", 0.5)):
            fns[f"previous_knn_{name}"] = step("knn", batch, n, knn_k, kernel=previous)
    times = interleaved_best_times(fns, rounds=rounds)
    dense = times["dense_sdpa"]
    results = {
        "shapes": f"batch {batch}, {HEADS} heads x {HEAD_DIM}, n {n}, bidirectional, fp32, forward + backward",
        "time_ms": {name: t * 1e3 for name, t in times.items()},
        "time_ratio_vs_dense_sdpa": {name: t / dense for name, t in times.items() if name != "dense_sdpa"},
    }
    for name in ("k32", "k_half"):
        # The backward (with its recomputation of scores and kept sets) vs the forward it repeats.
        backward = times[f"knn_{name}"] - times[f"knn_{name}_forward_only"]
        results.setdefault("backward_ms", {})[name] = backward * 1e3
        if previous is not None:
            results.setdefault("time_ratio_vs_previous_kernel", {})[name] = (
                times[f"knn_{name}"] / times[f"previous_knn_{name}"]
            )
    if previous is not None:
        results["previous_kernel"] = f"git {previous_rev}: backward from saved n x k indices and probabilities"
    return results


def memory() -> dict:
    """Peak tensor memory of forward + backward: k-NN at n = 1k..8k (batch 4), the KVT recipe at n = 4096."""
    peaks: dict[str, float] = {}
    for name, knn_k in (("k32", 32), ("k_half", 0.5)):
        for n in (1024, 2048, 4096, 8192):
            peaks[f"knn_{name}@{n}/batch4"] = peak_tensor_mb(step("knn", 4, n, knn_k))
        peaks[f"knn_{name}@4096/batch1"] = peak_tensor_mb(step("knn", 1, 4096, knn_k))
        for batch in (1, 4):
            peaks[f"kvt_{name}@4096/batch{batch}"] = peak_tensor_mb(step("kvt", batch, 4096, knn_k))
        print(peaks, flush=True)
    for n in (1024, 4096):
        peaks[f"dense_sdpa@{n}/batch4"] = peak_tensor_mb(step("dense_sdpa", 4, n, 0))
    growth = {
        name: {
            f"{n}->{2 * n}": peaks[f"knn_{name}@{2 * n}/batch4"] / peaks[f"knn_{name}@{n}/batch4"]
            for n in (1024, 2048, 4096)
        }
        for name in ("k32", "k_half")
    }
    vs_kvt = {
        f"{name}/batch{batch}": peaks[f"knn_{name}@4096/batch{batch}"] / peaks[f"kvt_{name}@4096/batch{batch}"]
        for name in ("k32", "k_half")
        for batch in (1, 4)
    }
    return {
        "memory_method": "peak bytes of live CPU tensors during one forward + backward (profiler allocation events)",
        "peak_tensor_mb": peaks,
        "knn_memory_growth_per_doubling": growth,
        "memory_ratio_knn_vs_kvt_n4096": vs_kvt,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--previous", default=PREVIOUS_KERNEL_REV, help="git revision of the kernel to compare")
    args = parser.parse_args(argv)
    results = {"load_average_at_start": os.getloadavg()}  # other jobs on this 2-core machine slow the timings
    for threads in args.threads:
        setup(threads=threads)
        results[f"timing_threads{threads}"] = timing(args.rounds, args.previous)
        print(results, flush=True)
    setup()
    previous_file = RESULTS_DIR / "knn.json"
    if not args.skip_memory:
        results["memory"] = memory()
    elif previous_file.exists() and "memory" in json.loads(previous_file.read_text()):
        results["memory"] = json.loads(previous_file.read_text())["memory"]  # deterministic: kept from the last run
    results["note"] = "2 CPU cores; times are best-of-rounds ratios in one run; see load_average_at_start"
    print(results, flush=True)
    write_results("knn", results)
    return results


if __name__ == "__main__":
    main()
