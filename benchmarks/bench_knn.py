"""k-NN attention: time and peak memory of the chunked kernel vs dense SDPA and the KVT reference recipe.

    python -m benchmarks.bench_knn               # everything below (about 30 minutes on 2 shared cores)
    python -m benchmarks.bench_knn --skip-memory # timing only (keeps the memory sections of the results file)
    python -m benchmarks.bench_knn --skip-timing # memory only (keeps the timing sections)

Shapes: 4 heads x 64, bidirectional (no mask), fp32, forward + backward, k = 32 and k = n/2 (`knn_k=0.5`).

Time (`timing_threads2`, `timing_threads1`): batch 4 at n = 1024, best of interleaved rounds, at 2 threads and at 1,
as ratios to dense SDPA (`torch.nn.functional.scaled_dot_product_attention`) measured in the same rounds; the median
of `--timing-runs` runs (the thread counts alternate), with each run's numbers and the range kept. Rows:
this kernel, its forward alone, the KVT recipe, and the kernel of git revision `--previous` (default: the landed one
before the memory-budget chunks and saved kept keys) loaded from git, so that before and after come from one run.
Also the minor page faults of one step (fresh pages the allocator had to map: a sign of buffers too large for its
caches).

Memory, two measures:
- `memory_rss`: the resident memory ADDED by one forward + backward at n = 4096, batch 1 and 4, for this kernel, the
  previous one, the KVT recipe and SDPA, each in a FRESH process (`--memory-one`): it imports torch, runs a small
  warm-up step of the same kind (n = 512, batch 1: code pages, thread pools and allocator arenas are process costs,
  not the step's), builds the inputs, resets the peak (`echo 5 > /proc/self/clear_refs` resets VmHWM), reads the
  current RSS, runs one step and reports VmHWM minus that RSS. Each row is the largest of `--rss-repeats` processes;
  `--cold-rss` repeats it without the warm-up. It counts what the process really holds: the allocator's cached pages
  and the math libraries' buffers too.
- `memory_tensors`: peak bytes of live CPU tensors during one step (`peak_tensor_mb`: the profiler's allocation
  events), deterministic: k-NN at n = 1k..8k (batch 4, growth per doubling), KVT at n = 4096.

The KVT recipe is the reference implementation's: full scores, `topk` indices, scatter into a zero mask, `torch.where`
to -inf, softmax, matmul (https://github.com/damo-cv/KVT).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import types
from collections.abc import Callable
from pathlib import Path

import torch
from torch._C._profiler import _EventType

from aot_transformers.knn import knn_attention_forward

from ._common import (
    RESULTS_DIR,
    current_rss_mb,
    interleaved_best_times,
    peak_rss_mb,
    reset_peak_rss,
    run_isolated,
    setup,
    updating_command,
    write_results,
)

HEADS, HEAD_DIM = 4, 64
SCALING = HEAD_DIM**-0.5
# The kernel before the memory-budget chunks and saved kept keys: chunks of 256 queries, scores recomputed by the
# backward for every k.
PREVIOUS_KERNEL_REV = "0a0a1ff"
KS = (("k32", 32), ("k_half", 0.5))


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


def minor_faults(fn: Callable[[], None]) -> int:
    """Minor page faults of one call of `fn` (after a warm-up call): fresh pages mapped for it."""
    fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def previous_kernel(rev: str) -> Callable | None:
    """`knn_attention_forward` as of git revision `rev`, or None where git or the revision is unavailable.

    The chunked kernel lives in `knn.py`, before it moved there in `attention_aot.py` (which now holds a one-piece
    eager k-NN under the same name): `knn.py` is read first. The revision's package folder is imported as a package of
    its own, `aot_transformers_<commit>` (its `__init__` not run), so that the relative imports of its files
    (`from .attention_aot import ...`) read that revision too, not this one. Its modules register their k-NN backend
    in transformers' attention interfaces on import, and some patched transformers' classes (0a0a1ff set
    `PretrainedConfig.knn_k` and wrapped `PreTrainedModel._check_and_adjust_attn_implementation`): the backends and
    class attributes of before are put back, so that nothing of that revision outlives the call but its kernel."""
    from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel
    from transformers.masking_utils import AttentionMaskInterface

    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> bytes:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, check=True).stdout

    try:
        commit = git("rev-parse", "--verify", f"{rev}^{{commit}}").decode().strip()
        archive = git("archive", commit, "src/aot_transformers")
    except (OSError, subprocess.CalledProcessError):
        return None
    folder = Path(tempfile.mkdtemp())
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    name = f"aot_transformers_{commit}"
    package = sys.modules.setdefault(name, types.ModuleType(name))
    package.__path__ = [str(folder / "src" / "aot_transformers")]
    registered = {interface: dict(interface()) for interface in (AttentionInterface, AttentionMaskInterface)}
    attributes = {cls: dict(vars(cls)) for cls in (PretrainedConfig, PreTrainedModel)}
    try:
        for module in ("knn", "attention_aot"):
            if (Path(package.__path__[0]) / f"{module}.py").is_file():
                kernel = getattr(importlib.import_module(f"{name}.{module}"), "knn_attention_forward", None)
                if kernel is not None:
                    return kernel
        return None
    finally:
        for interface, backends in registered.items():
            for key, backend in backends.items():
                interface.register(key, backend)
        for cls, before in attributes.items():
            for key in [key for key in vars(cls) if key not in before]:
                delattr(cls, key)
            for key, value in before.items():
                if vars(cls).get(key) is not value:
                    setattr(cls, key, value)


def timing(rounds: int, previous_rev: str | None) -> dict:
    """Forward + backward times at n = 1024, batch 4, interleaved, with ratios to dense SDPA."""
    n, batch = 1024, 4
    fns = {"dense_sdpa": step("dense_sdpa", batch, n, 0)}
    for name, knn_k in KS:
        fns[f"knn_{name}"] = step("knn", batch, n, knn_k)
        fns[f"knn_{name}_forward_only"] = step("knn_forward", batch, n, knn_k)
        fns[f"kvt_{name}"] = step("kvt", batch, n, knn_k)
    previous = previous_kernel(previous_rev) if previous_rev else None
    if previous is not None:
        for name, knn_k in KS:
            fns[f"previous_knn_{name}"] = step("knn", batch, n, knn_k, kernel=previous)
    load_before = os.getloadavg()
    times = interleaved_best_times(fns, rounds=rounds)
    dense = times["dense_sdpa"]
    results = {
        "shapes": f"batch {batch}, {HEADS} heads x {HEAD_DIM}, n {n}, bidirectional, fp32, forward + backward",
        "load_average_before_and_after": [load_before, os.getloadavg()],
        "time_ms": {name: t * 1e3 for name, t in times.items()},
        "time_ratio_vs_dense_sdpa": {name: t / dense for name, t in times.items() if name != "dense_sdpa"},
    }
    for name, _ in KS:
        # The backward (with its scatter of the saved keys or its recomputation) vs the forward it follows.
        backward = times[f"knn_{name}"] - times[f"knn_{name}_forward_only"]
        results.setdefault("backward_ms", {})[name] = backward * 1e3
        if previous is not None:
            results.setdefault("time_ratio_vs_previous_kernel", {})[name] = (
                times[f"knn_{name}"] / times[f"previous_knn_{name}"]
            )
    results["minor_page_faults_per_step"] = {
        name: minor_faults(fn) for name, fn in fns.items() if not name.endswith("forward_only")
    }
    if previous is not None:
        results["previous_kernel"] = f"git {previous_rev}: chunks of 256 queries, scores recomputed for every k"
    return results


def memory_one(kind: str, batch: int, n: int, knn_k: int | float, previous_rev: str | None, warm: bool) -> dict:
    """Resident memory added by one forward + backward of `kind`, in this (fresh) process (module docstring)."""
    setup()
    kernel = previous_kernel(previous_rev) if previous_rev else knn_attention_forward
    if warm:
        step(kind, 1, 512, knn_k, kernel)()
    run = step(kind, batch, n, knn_k, kernel)
    gc.collect()
    reset_peak_rss()
    before = current_rss_mb()
    run()
    return {"peak_rss_added_mb": peak_rss_mb() - before, "rss_before_mb": before}


def _rss_row(kind: str, batch: int, knn_k: int | float, previous_rev: str | None, warm: bool, repeats: int) -> dict:
    args = ["--memory-one", kind, str(batch), "4096", str(knn_k), "--previous", previous_rev or ""]
    runs = [run_isolated("bench_knn", *args, *([] if warm else ["--cold"])) for _ in range(repeats)]
    added = [r["peak_rss_added_mb"] for r in runs]
    return {"peak_rss_added_mb": max(added), "runs_mb": added, "rss_before_mb": runs[0]["rss_before_mb"]}


def memory_rss(previous_rev: str | None, repeats: int, cold: bool) -> dict:
    """Peak resident memory added by one step at n = 4096, each row in fresh processes, and the ratios to KVT."""
    rows: dict[str, dict] = {}
    for warm in (True, False) if cold else (True,):
        section = "warm" if warm else "cold"
        for batch in (1, 4):
            for name, knn_k in KS:
                rows[f"{section}/knn_{name}/batch{batch}"] = _rss_row("knn", batch, knn_k, None, warm, repeats)
                if previous_rev:
                    rows[f"{section}/previous_knn_{name}/batch{batch}"] = _rss_row(
                        "knn", batch, knn_k, previous_rev, warm, repeats
                    )
                rows[f"{section}/kvt_{name}/batch{batch}"] = _rss_row("kvt", batch, knn_k, None, warm, repeats)
            rows[f"{section}/dense_sdpa/batch{batch}"] = _rss_row("dense_sdpa", batch, 0, None, warm, repeats)
            print({key: row["peak_rss_added_mb"] for key, row in rows.items()}, flush=True)
    ratios = {}
    for section in ("warm", "cold") if cold else ("warm",):
        for who in ("knn", "previous_knn") if previous_rev else ("knn",):
            for batch in (1, 4):
                for name, _ in KS:
                    mine = rows[f"{section}/{who}_{name}/batch{batch}"]["peak_rss_added_mb"]
                    kvt = rows[f"{section}/kvt_{name}/batch{batch}"]["peak_rss_added_mb"]
                    ratios[f"{section}/{who}_vs_kvt/{name}/batch{batch}"] = mine / kvt
    return {
        "method": (
            "fresh process per row; warm: a small step of the same kind first; VmHWM reset (clear_refs 5) after "
            "building the inputs; peak RSS minus the RSS before the step; max over the repeats; n = 4096, 2 threads"
        ),
        "previous_kernel": f"git {previous_rev}" if previous_rev else None,
        "peak_rss_added_mb": rows,
        "ratio_vs_kvt": ratios,
    }


def memory_tensors() -> dict:
    """Peak tensor memory of forward + backward: k-NN at n = 1k..8k (batch 4), the KVT recipe at n = 4096."""
    peaks: dict[str, float] = {}
    for name, knn_k in KS:
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
        for name, _ in KS
    }
    vs_kvt = {
        f"{name}/batch{batch}": peaks[f"knn_{name}@4096/batch{batch}"] / peaks[f"kvt_{name}@4096/batch{batch}"]
        for name, _ in KS
        for batch in (1, 4)
    }
    return {
        "method": "peak bytes of live CPU tensors during one forward + backward (profiler allocation events)",
        "peak_tensor_mb": peaks,
        "knn_memory_growth_per_doubling": growth,
        "memory_ratio_knn_vs_kvt_n4096": vs_kvt,
    }


def _number(text: str) -> int | float:
    return float(text) if "." in text else int(text)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--rss-repeats", type=int, default=2)
    parser.add_argument("--cold-rss", action="store_true", help="also measure RSS without the warm-up step")
    parser.add_argument("--timing-runs", type=int, default=3, help="timing runs per thread count (median reported)")
    parser.add_argument("--previous", default=PREVIOUS_KERNEL_REV, help="git revision of the kernel to compare")
    parser.add_argument("--memory-one", nargs=4, metavar=("KIND", "BATCH", "N", "K"), help=argparse.SUPPRESS)
    parser.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_one:  # one row of `memory_rss`, in its own process
        kind, batch, n, knn_k = args.memory_one
        row = memory_one(kind, int(batch), int(n), _number(knn_k), args.previous or None, warm=not args.cold)
        print(json.dumps(row), flush=True)
        return row
    previous_file = RESULTS_DIR / "knn.json"
    previous_results = json.loads(previous_file.read_text()) if previous_file.exists() else {}
    results = {"load_average_at_start": os.getloadavg()}  # other jobs on this 2-core machine slow the timings
    runs: dict[str, list[dict]] = {f"timing_threads{threads}": [] for threads in args.threads}
    for _ in range(0 if args.skip_timing else args.timing_runs):  # the thread counts alternate between runs
        for threads in args.threads:
            setup(threads=threads)
            runs[f"timing_threads{threads}"].append(timing(args.rounds, args.previous))
            print(runs, flush=True)
    kept = False  # whether a part of the earlier file is kept: then its command is part of this file's
    for key, measured in runs.items():
        if measured:
            results[key] = median_run(measured)
        elif key in previous_results:
            results[key], kept = previous_results[key], True
    setup()
    for key, measure in (
        ("memory_rss", lambda: memory_rss(args.previous, args.rss_repeats, args.cold_rss)),
        ("memory", memory_tensors),
    ):
        if not args.skip_memory:
            results[key] = measure()
        elif key in previous_results:
            results[key], kept = previous_results[key], True  # kept from the last run
        print(results.get(key), flush=True)
    results["note"] = "2 CPU cores; times are best-of-rounds ratios in one run; see the load averages recorded"
    write_results("knn", results, updating_command(previous_results) if kept else None)
    print(json.dumps(summary(results), indent=2), flush=True)
    return results


def median_run(runs: list[dict]) -> dict:
    """Several timing runs as one: each ratio and time the median over the runs, with every run kept."""

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    out = {key: value for key, value in runs[0].items() if not isinstance(value, dict)}
    sections = ("time_ms", "time_ratio_vs_dense_sdpa", "backward_ms", "time_ratio_vs_previous_kernel")
    for section in (*sections, "minor_page_faults_per_step"):
        if section in runs[0]:
            out[section] = {name: median([run[section][name] for run in runs]) for name in runs[0][section]}
    out["ratio_range_over_runs"] = {
        name: [
            min(run["time_ratio_vs_dense_sdpa"][name] for run in runs),
            max(run["time_ratio_vs_dense_sdpa"][name] for run in runs),
        ]
        for name in runs[0]["time_ratio_vs_dense_sdpa"]
    }
    out["runs"] = runs
    return out


def summary(results: dict) -> dict:
    """The targets' numbers: RSS ratios to KVT (n = 4096) and time ratios to SDPA (n = 1024, batch 4)."""
    out = {}
    if "memory_rss" in results:
        out["rss_ratio_vs_kvt"] = results["memory_rss"]["ratio_vs_kvt"]
    for key in ("timing_threads2", "timing_threads1"):
        if key in results:
            ratios = results[key]["time_ratio_vs_dense_sdpa"]
            out[key] = {name: ratios[name] for name in ratios if not name.endswith("forward_only")}
    return out


if __name__ == "__main__":
    main()
