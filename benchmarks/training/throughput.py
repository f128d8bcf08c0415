"""Training throughput of the same `aot train lm` command in 1 process and in 2 processes (DDP, gloo, CPU).

    python -m benchmarks.training.throughput                 # ~3 min on 2 cores
    python -m benchmarks.training.throughput --launcher accelerate

The global batch is the same in every run (1 × 32 or 2 × 16 blocks of 128 tokens). Rows: one process with all
cores as torch threads, one process with one thread, and two processes with one thread each. Reports Trainer's
samples (blocks) per second and tokens per second over `--max-steps` optimizer steps (data preparation excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .._common import invocation
from ._results import write_summary

ROOT = Path(__file__).resolve().parents[2]


def launcher_command(executable: str | Path, processes: int = 2) -> list[str]:
    """The command that starts `processes` CPU ranks with `executable`, a `torchrun` or an `accelerate` binary.

    For accelerate it is `launch --multi_gpu`, its torchrun-based launcher (the training arguments' `--use_cpu` puts
    the ranks on the CPU with gloo); `--cpu` would start a single process, as accelerate runs several CPU processes
    only through mpirun.
    """
    if Path(executable).name == "torchrun":
        return [str(executable), "--standalone", "--nproc_per_node", str(processes)]
    return [str(executable), "launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip


def _run(command: list[str], threads: int, output_dir: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{completed.stderr[-3000:]}")
    return json.loads((output_dir / "all_results.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "text" / "tinyshakespeare"))
    parser.add_argument("--output-dir", default=str(ROOT / "runs" / "training" / "throughput"))
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--config-overrides", default="hidden_size=128,num_hidden_layers=4,num_attention_heads=4")
    parser.add_argument("--launcher", choices=["torchrun", "accelerate"], default="torchrun")
    args = parser.parse_args(argv)

    cores = len(os.sched_getaffinity(0))
    root = Path(args.output_dir)

    def arguments(output_dir: Path, per_device: int) -> list[str]:
        return [
            "--preset", "aot-mssa-l-tiny", "--config_overrides", args.config_overrides,
            "--tokenizer_vocab_size", "1024", "--dataset_name", args.data, "--block_size", str(args.block_size),
            "--per_device_train_batch_size", str(per_device), "--max_steps", str(args.max_steps),
            "--learning_rate", "1e-3", "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none",
            "--use_cpu", "--disable_tqdm", "true", "--seed", "0", "--make_plots", "false", "--logging_steps", "1000",
            "--output_dir", str(output_dir),
        ]  # fmt: skip

    bin_dir = Path(sys.executable).parent
    module = [sys.executable, "-m", "aot_transformers.training.lm"]
    shutil.rmtree(root, ignore_errors=True)
    # Train the tokenizer once (a 1-step run) and share it, so every run sees identical data.
    _run(
        [*module, *arguments(root / "tokenizer-run", args.global_batch), "--max_steps", "1"],
        cores,
        root / "tokenizer-run",
    )
    shared = ["--tokenizer_name_or_path", str(root / "tokenizer-run" / "tokenizer")]
    rows = {}
    for threads in sorted({cores, 1}, reverse=True):
        folder = root / f"1proc-{threads}threads"
        rows[f"1 process x {threads} threads"] = _run(
            [*module, *arguments(folder, args.global_batch), *shared], threads, folder
        )
    launcher = launcher_command(bin_dir / args.launcher)
    folder = root / "2proc"
    threads = max(1, cores // 2)
    rows[f"2 processes x {threads} threads ({args.launcher})"] = _run(
        [*launcher, "-m", "aot_transformers.training.lm", *arguments(folder, args.global_batch // 2), *shared],
        threads,
        folder,
    )
    baseline = next(iter(rows.values()))["train_samples_per_second"]
    summary = {
        "cores": cores,
        "launcher": args.launcher,
        "global_batch_blocks": args.global_batch,
        "block_size": args.block_size,
        "steps": args.max_steps,
        "config_overrides": args.config_overrides,
        "rows": {
            name: {
                "samples_per_second": metrics["train_samples_per_second"],
                "tokens_per_second": metrics["train_samples_per_second"] * args.block_size,
                "relative_to_first_row": metrics["train_samples_per_second"] / baseline,
            }
            for name, metrics in rows.items()
        },
    }
    root.mkdir(parents=True, exist_ok=True)
    write_summary(
        summary,
        root / "summary.json",
        f"throughput_{args.launcher}.json",
        invocation("benchmarks.training.throughput", argv),
    )
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
