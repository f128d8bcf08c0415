"""Shared helpers of the benchmarks: timing, peak-memory measurement in a fresh process, and the one writer of
results files (`write_results`: every file records its command, git revision, library versions and host)."""

from __future__ import annotations

import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from aot_transformers import _io
from aot_transformers._io import PROVENANCE_KEYS

# The aten operators of dense matmuls, as torch.profiler names them (`aten::linear` dispatches to `addmm`/`mm`).
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear")

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


def setup(threads: int = 2, seed: int = 0) -> None:
    """Fix the thread count and seed so that every row of a benchmark runs under the same conditions."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)


def best_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 2) -> float:
    """Fastest wall-clock time of `fn` over `repeats` runs after `warmup` runs, in seconds.

    The minimum is the least noisy estimate on a shared machine: noise only ever adds time.
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def interleaved_best_times(fns: dict[str, Callable[[], object]], rounds: int = 5, warmup: int = 2) -> dict[str, float]:
    """Best time of each function, measured in alternating rounds so that a load change hits all of them alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def peak_rss_mb() -> float:
    """Peak resident memory of this process since start or the last `reset_peak_rss()`, in MB (Linux VmHWM)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> None:
    """Restart the peak-memory high-water mark at the current resident size (Linux: write 5 to clear_refs)."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def current_rss_mb() -> float:
    """Current resident memory of this process, in MB."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_isolated(module: str, *args: str) -> dict:
    """Run `python -m benchmarks.<module> args…` in a fresh process and parse the JSON it prints last.

    Peak memory is a per-process high-water mark, so each memory measurement needs its own process.
    """
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def machine() -> dict:
    """What the numbers were measured on, in the replication records' format (their report reads it)."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }


def invocation(module: str | None = None, argv: list[str] | None = None) -> str:
    """The command line that ran this process, as typed: `python -m benchmarks.X args` (a torchrun rank: the
    torchrun line), with `OMP_NUM_THREADS=N` in front when it is set. `module` and `argv` name the module and its
    arguments when `main(argv)` was called from Python (default: this process's `__main__` and `sys.argv`)."""
    if module is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name.removesuffix(".__main__") if spec is not None and spec.name else None
    target = f"-m {module}" if module else shlex.quote(sys.argv[0])
    argv = sys.argv[1:] if argv is None else argv
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank that torchrun started
        launcher = f"torchrun --standalone --nproc_per_node {os.environ.get('LOCAL_WORLD_SIZE', '1')}"
    else:
        launcher = "python"
    threads = os.environ.get("OMP_NUM_THREADS")
    environment = [f"OMP_NUM_THREADS={threads}"] if threads else []
    return " ".join([*environment, launcher, target, *map(shlex.quote, argv)])


def provenance(command: str | None = None) -> dict:
    """What a results file records about how it was made (`aot_transformers._io.provenance`, the one implementation,
    which `aot experiment` writes too): the command (default: this process's, `invocation()`), this checkout's git
    revision, the library versions, the host and the date."""
    return _io.provenance(command or invocation(), REPO_ROOT)


def updating_command(earlier: dict, command: str | None = None) -> str:
    """The command of a results file that keeps part of `earlier`, the record it updates: the command that made
    that record's first part, then this one (default: this process's)."""
    this = command or invocation()
    first = earlier.get("command", "").split(" && ")[0]
    return f"{first} && {this}" if first else this


def write_results(target: str | Path, results: dict, command: str | None = None, indent: int = 2) -> Path:
    """Write `results` with their `provenance(command)` in front, atomically, as JSON: to
    benchmarks/results/<target>.json for a name, or to `target` for a path. The one writer of results files."""
    path = RESULTS_DIR / f"{target}.json" if isinstance(target, str) else Path(target)
    record = {**provenance(command), **{k: v for k, v in results.items() if k not in PROVENANCE_KEYS}}
    _io.atomic_write_text(path, json.dumps(record, indent=indent) + "\n")
    return path


def without_provenance(record: dict) -> dict:
    """A results file's record without its provenance keys: the measurement alone."""
    return {k: v for k, v in record.items() if k not in PROVENANCE_KEYS}
