"""The data path of `aot train lm` on a real corpus: tokenization throughput, memory, and time to the first step.

    python -m benchmarks.bench_data                       # the Gutenberg corpus in ../shared/data (~15 min)
    python -m benchmarks.bench_data --corpus FOLDER_OR_ID --tokenizer FOLDER

1. Throughput: `tokenize_and_pack` (tokenize in `--workers` processes, pack, write the blocks) against the
   tokenizer's own `encode_batch` (Rust, both cores) over the same text (the validation split), in alternating rounds
   so that a change of load hits both alike; the ratio is of the best rounds.
2. A cold start: `aot train lm --max_steps 1` on the whole corpus with an empty `datasets` cache (the parquet shards
   converted, every split tokenized and packed): the time to the first training step, the peak resident memory of
   the main process and of the largest worker, and the peak memory of the whole process tree (PSS), every 0.2 s.
3. A warm start: the same command again (a new output folder): the blocks come from the cache.
4. A copy of the corpus made anew (new paths and times, as each session gets the shared data), with the same cache:
   `datasets` converts its shards again, the blocks are keyed by the text and come from the cache.

Writes `results/data.json`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ._common import invocation, write_results

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("AOT_SHARED_DATA", ROOT.parent / "shared" / "data"))
STUDY_TOKENIZER = ROOT / "benchmarks" / "results" / "study" / "tokenizer"


def throughput(corpus: str, tokenizer_path: Path, workers: int, rounds: int) -> dict:
    """Megabytes of text per second through `tokenize_and_pack` and through `encode_batch`, alternating."""
    import datasets

    from aot_transformers.training.lm import load_tokenizer
    from aot_transformers.training.text_data import tokenize_and_pack

    text = datasets.load_dataset(corpus, split="validation")
    megabytes = sum(len(t.encode("utf-8")) for t in text["text"]) / 1e6
    tokenizer = load_tokenizer(tokenizer_path)
    best = {"tokenize_and_pack": float("inf"), "encode_batch": float("inf")}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as cache:
            datasets.config.HF_DATASETS_CACHE = cache  # nothing cached between rounds
            start = time.perf_counter()
            tokenize_and_pack(text, tokenizer, 256, "text", add_eos=True, num_proc=workers)
            best["tokenize_and_pack"] = min(best["tokenize_and_pack"], time.perf_counter() - start)
        start = time.perf_counter()
        tokenizer.backend_tokenizer.encode_batch(text["text"], add_special_tokens=False)
        best["encode_batch"] = min(best["encode_batch"], time.perf_counter() - start)
    rates = {name: megabytes / seconds for name, seconds in best.items()}
    return {
        "megabytes": megabytes,
        "mb_per_second": rates,
        "ratio": rates["tokenize_and_pack"] / rates["encode_batch"],
    }


class TreeMemory:
    """Peak resident memory (RSS) of a process and of its largest descendant, and the peak of the whole tree's
    proportional set size (PSS: a page shared by n processes counts 1/n in each, so the forked workers' copy-on-write
    pages of the parent are not counted twice), sampled in a thread."""

    def __init__(self, pid: int, interval: float = 0.2):
        import psutil

        self.process, self.interval = psutil.Process(pid), interval
        self.main = self.worker = self.total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                tree = [self.process, *self.process.children(recursive=True)]
                resident = [p.memory_info().rss for p in tree]
                proportional = sum(p.memory_full_info().pss for p in tree)
            except psutil.Error:
                break
            self.main, self.worker = max(self.main, resident[0]), max([self.worker, *resident[1:]])
            self.total = max(self.total, proportional)
            self._stop.wait(self.interval)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return {
            "main_gb": self.main / 2**30,
            "largest_worker_gb": self.worker / 2**30,
            "tree_pss_gb": self.total / 2**30,
        }


def first_step(corpus: str, tokenizer_path: Path, workers: int, cache: Path, output: Path) -> dict:
    """Run `aot train lm --max_steps 1` and time it to its first logged training loss; peak memory of its tree."""
    arguments = [
        "train", "lm", "--dataset_name", corpus, "--tokenizer_name_or_path", str(tokenizer_path),
        "--config_overrides", "vocab_size=8192", "--block_size", "256", "--preprocessing_num_workers", str(workers),
        "--max_steps", "1", "--logging_steps", "1", "--eval_strategy", "no", "--save_strategy", "no",
        "--output_dir", str(output), "--report_to", "none", "--use_cpu", "--disable_tqdm", "true",
    ]  # fmt: skip
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache)}
    start = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "aot_transformers.cli", *arguments],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    memory, seconds = TreeMemory(process.pid), None
    for line in process.stdout:
        if "'loss'" in line:  # the first step is done: the final evaluations are not what this measures
            seconds = time.perf_counter() - start
            process.terminate()
            break
    process.wait()
    peak = memory.stop()
    if seconds is None:
        raise RuntimeError(f"`aot {shlex.join(arguments)}` failed (exit {process.returncode})")
    return {"seconds_to_first_step": seconds, **peak, "command": "aot " + shlex.join(arguments)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default=str(SHARED / "text" / "gutenberg"))
    parser.add_argument("--tokenizer", type=Path, default=STUDY_TOKENIZER)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    results = {"throughput": throughput(args.corpus, args.tokenizer, args.workers, args.rounds)}
    print(results, flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) / "cache"
        results["cold"] = first_step(args.corpus, args.tokenizer, args.workers, cache, Path(scratch) / "cold")
        print(results, flush=True)
        results["warm"] = first_step(args.corpus, args.tokenizer, args.workers, cache, Path(scratch) / "warm")
        if Path(args.corpus).is_dir():
            copy = shutil.copytree(args.corpus, Path(scratch) / "corpus-copy")
            results["copy"] = first_step(str(copy), args.tokenizer, args.workers, cache, Path(scratch) / "copy")
    path = write_results("data", results, invocation("benchmarks.bench_data", argv))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
