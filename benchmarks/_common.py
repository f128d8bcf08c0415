"""Shared helpers of the benchmarks: timing, peak-memory measurement in a fresh process, result files."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

# The aten operators of dense matmuls, as torch.profiler names them (`aten::linear` dispatches to `addmm`/`mm`).
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear")

RESULTS_DIR = Path(__file__).resolve().parent / "results"


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
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args], cwd=root, capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def machine() -> dict:
    """What the numbers were measured on."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }


def write_results(name: str, results: dict) -> Path:
    """Write `results` (plus the machine description) to benchmarks/results/<name>.json."""
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **results}, indent=2) + "\n")
    return path


def git_revision() -> str:
    """The commit the benchmark ran at (with `+dirty` when tracked files differ from it)."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()

    revision = git("rev-parse", "HEAD") or "unknown"
    return revision + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def library_versions() -> dict[str, str]:
    """Python's and the libraries' versions, as installed."""
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("torch", "transformers", "datasets", "tokenizers", "accelerate", "aot-transformers"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "missing"
    return found


def provenance(command: str) -> dict:
    """What a results file records about how it was made: the command, git revision, library versions and host."""
    return {
        "command": command,
        "git_revision": git_revision(),
        "versions": library_versions(),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "load_average": os.getloadavg()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
